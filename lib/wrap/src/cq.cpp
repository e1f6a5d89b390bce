#include <rdmaxx/wrap/cq.hpp>

#include <algorithm>
#include <chrono>

#include <fcntl.h>
#include <poll.h>

#include <fmt/format.h>

#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/handle.hpp>

namespace rdmaxx {
namespace {

// Events are acknowledged in batches: ibv_ack_cq_events takes a mutex, and
// ibv_destroy_cq waits until every event was acknowledged.
constexpr unsigned ack_batch = 32;

} // namespace

Result<CompletionQueue> CompletionQueue::create(const Context& context, CqOptions options,
                                                std::source_location where) {
    const detail::DeviceHandle& device = context.handle(where);
    require(options.depth > 0, where, "a completion queue of depth 0");
    const auto max_cqe = static_cast<std::uint32_t>(device->attributes.raw.max_cqe);
    if (options.depth > max_cqe)
        return std::unexpected(Error::from_errno(
            "ibv_create_cq", EINVAL, fmt::format("depth {} above the device's max_cqe {}", options.depth, max_cqe)));

    std::shared_ptr<ibv_comp_channel> channel;
    if (options.channel) {
        ibv_comp_channel* raw = ibv_create_comp_channel(device->context);
        if (!raw)
            return std::unexpected(Error::from_last_errno("ibv_create_comp_channel", "{}", device->name));
        channel = detail::adopt(raw, "ibv_destroy_comp_channel", &ibv_destroy_comp_channel, device);
        // non-blocking: wait_event drains the channel without ever blocking in read()
        const int flags = fcntl(raw->fd, F_GETFL);
        if (flags < 0 || fcntl(raw->fd, F_SETFL, flags | O_NONBLOCK) < 0)
            return std::unexpected(Error::from_last_errno("fcntl", "O_NONBLOCK on the completion channel"));
    }
    ibv_cq* cq = ibv_create_cq(device->context, static_cast<int>(options.depth), nullptr, channel.get(),
                               options.comp_vector);
    if (!cq)
        return std::unexpected(
            Error::from_last_errno("ibv_create_cq", "depth {} on {}", options.depth, device->name));
    // a statement of its own: the CQ's deleter must copy `channel` before it is moved
    auto handle = detail::adopt(cq, "ibv_destroy_cq", &ibv_destroy_cq, device, channel);
    return CompletionQueue(std::move(handle), std::move(channel), static_cast<std::uint32_t>(cq->cqe));
}

CompletionQueue::CompletionQueue(CompletionQueue&& other) noexcept
    : cq_(std::move(other.cq_)), channel_(std::move(other.channel_)), depth_(other.depth_),
      unacked_events_(std::exchange(other.unacked_events_, 0)), created_(other.created_) {}

CompletionQueue& CompletionQueue::operator=(CompletionQueue&& other) noexcept {
    if (this != &other) {
        ack_events();
        cq_ = std::move(other.cq_);
        channel_ = std::move(other.channel_);
        depth_ = other.depth_;
        unacked_events_ = std::exchange(other.unacked_events_, 0);
        created_ = other.created_;
    }
    return *this;
}

// A QP may keep the ibv_cq alive longer than this wrapper, but only the wrapper can
// take events: acknowledging them all here is enough for ibv_destroy_cq.
CompletionQueue::~CompletionQueue() { ack_events(); }

void CompletionQueue::ack_events() noexcept {
    if (unacked_events_ != 0)
        ibv_ack_cq_events(cq_.get(), unacked_events_);
    unacked_events_ = 0;
}

Result<void> CompletionQueue::resize(std::uint32_t depth, std::source_location where) {
    ibv_cq* const cq = get(where);
    require(depth > 0, where, "resizing a completion queue to depth 0");
    // the provider checks max_cqe and the completions held (EINVAL)
    if (const int rc = ibv_resize_cq(cq, static_cast<int>(depth)); rc != 0)
        return std::unexpected(Error::from_errno("ibv_resize_cq", rc, fmt::format("to depth {} from {}", depth, depth_)));
    depth_ = static_cast<std::uint32_t>(cq->cqe);
    return {};
}

Result<void> CompletionQueue::arm(bool solicited_only, std::source_location where) {
    channel("arm", where);
    if (const int rc = ibv_req_notify_cq(get(where), solicited_only ? 1 : 0); rc != 0)
        return std::unexpected(Error::from_errno("ibv_req_notify_cq", rc));
    return {};
}

Result<void> CompletionQueue::wait_event(std::chrono::milliseconds timeout, int also_watch,
                                         std::source_location where) {
    auto woke = wait_event_until(deadline_after(timeout), also_watch, where);
    if (!woke && woke.error().is_timeout())
        return std::unexpected(
            Error::timeout("wait_event", fmt::format("no completion event within {} ms", timeout.count())));
    return woke;
}

Result<void> CompletionQueue::wait_event_until(std::chrono::steady_clock::time_point deadline, int also_watch,
                                               std::source_location where) {
    ibv_comp_channel* const events = channel("wait_event", where);
    pollfd fds[2] = {{.fd = events->fd, .events = POLLIN, .revents = 0},
                     {.fd = also_watch, .events = POLLIN, .revents = 0}};
    // a signal ends poll() early, as does its longest wait (INT_MAX ms): wait out what
    // is left, not the whole timeout again
    int ready;
    do
        ready = ::poll(fds, also_watch < 0 ? 1 : 2, poll_timeout_until(deadline));
    while ((ready < 0 && errno == EINTR) || (ready == 0 && std::chrono::steady_clock::now() < deadline));
    if (ready < 0)
        return std::unexpected(Error::from_last_errno("poll", "completion channel"));
    if (ready == 0)
        return std::unexpected(
            Error::timeout("wait_event", "no completion event before the deadline"));
    // every event pending now is for this CQ (the channel is its own)
    auto taken = take_events(where);
    if (!taken)
        return std::unexpected(std::move(taken.error()));
    if (*taken == 0 && fds[1].revents != 0) // woken by `also_watch`
        return {};
    // readable but empty: something outside this object took the event (this object
    // itself has one user at a time: its thread-safety rule)
    if (*taken == 0)
        return std::unexpected(Error::from_errno("ibv_get_cq_event", EAGAIN,
                                                 "the event was taken outside this CompletionQueue"));
    return {};
}

Result<unsigned> CompletionQueue::take_events(std::source_location where) {
    ibv_comp_channel* const events = channel("take_events", where);
    unsigned taken = 0;
    for (;;) {
        ibv_cq* cq = nullptr;
        void* context = nullptr;
        if (ibv_get_cq_event(events, &cq, &context) != 0) {
            if (errno == EAGAIN)
                return taken;
            return std::unexpected(Error::from_last_errno("ibv_get_cq_event"));
        }
        ++taken;
        if (++unacked_events_ >= ack_batch)
            ack_events();
    }
}

ibv_comp_channel* CompletionQueue::channel(const char* call, std::source_location where) const {
    get(where);
    require(channel_ != nullptr, where, "{}() on a completion queue created without a channel", call);
    return channel_.get();
}

int CompletionQueue::channel_fd(std::source_location where) const {
    return channel("channel_fd", where)->fd;
}


const std::shared_ptr<ibv_cq>& CompletionQueue::handle(std::source_location where) const {
    return detail::live(cq_, "CompletionQueue", where);
}

} // namespace rdmaxx
