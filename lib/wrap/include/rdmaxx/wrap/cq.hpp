// A completion queue, optionally with its own completion channel for blocking waits.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx {

struct CqOptions {
    std::uint32_t depth = 256;  // minimum entries; the device may round up
    bool channel = false;       // create a completion channel for arm()/wait_event()
    int comp_vector = 0;
};

class CompletionQueue : detail::MoveOnly {
public:
    // Depth above the device's max_cqe is an Error. Programming error: a moved-from
    // Context, depth 0.
    static Result<CompletionQueue> create(const Context& context, CqOptions options = {},
                                          std::source_location where = std::source_location::current());

    CompletionQueue(CompletionQueue&& other) noexcept;
    CompletionQueue& operator=(CompletionQueue&& other) noexcept;
    ~CompletionQueue();

    // The real number of entries (at least the requested depth).
    std::uint32_t depth() const noexcept { return depth_; }
    // When this CQ was created: device events read before it concern an older CQ.
    std::chrono::steady_clock::time_point created_at() const noexcept { return created_; }
    bool has_channel() const noexcept { return channel_ != nullptr; }

    // Requests an event for the next completion (ibv_req_notify_cq). Completions
    // already in the queue raise no event: poll once more after arming.
    // Programming error: a CQ without a channel.
    Result<void> arm(bool solicited_only = false,
                     std::source_location where = std::source_location::current());
    // Waits up to `timeout` for an event of the armed CQ; takes every event pending on
    // the channel, so none piles up in the kernel, and acknowledges them in batches
    // (and all before the CQ is destroyed). A timeout is an Error of kind timeout.
    // `also_watch`, when not -1, is another fd (such as the device's async event fd)
    // whose readability also ends the wait, successfully, with nothing read from it.
    // Programming error: a CQ without a channel.
    Result<void> wait_event(std::chrono::milliseconds timeout, int also_watch = -1,
                            std::source_location where = std::source_location::current());
    // Takes every event pending on the channel without waiting (an event loop calls
    // this when channel_fd() is readable) and returns how many; acknowledges in batches
    // as wait_event does. Programming error: a CQ without a channel.
    Result<unsigned> take_events(std::source_location where = std::source_location::current());
    // The channel's file descriptor (non-blocking), for an application's own poll/epoll
    // loop; follow readiness with take_events(). Programming error: no channel.
    int channel_fd(std::source_location where = std::source_location::current()) const;

    ibv_cq* get(std::source_location where = std::source_location::current()) const {

        return detail::live(cq_, "CompletionQueue", where).get();

    }
    const std::shared_ptr<ibv_cq>& handle(std::source_location where = std::source_location::current()) const;

private:
    CompletionQueue(std::shared_ptr<ibv_cq> cq, std::shared_ptr<ibv_comp_channel> channel, std::uint32_t depth)
        : cq_(std::move(cq)), channel_(std::move(channel)), depth_(depth) {}
    void ack_events() noexcept;

    std::shared_ptr<ibv_cq> cq_; // keeps the device and the channel alive
    std::shared_ptr<ibv_comp_channel> channel_;
    std::uint32_t depth_;
    unsigned unacked_events_ = 0;
    std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
};

} // namespace rdmaxx
