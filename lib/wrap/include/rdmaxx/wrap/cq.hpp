/// @file
/// A completion queue, optionally with its own completion channel for blocking waits.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx {

/// How to create a CompletionQueue.
struct CqOptions {
    std::uint32_t depth = 256;  ///< minimum entries; the device may round up
    bool channel = false;       ///< create a completion channel for arm()/wait_event()
    int comp_vector = 0;        ///< the completion vector its events are signalled on
};

/// A completion queue, optionally with its own completion channel for blocking waits
/// (arm, then wait_event or take_events). Polling it is lib/data's
/// (rdmaxx/data/completion.hpp).
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe (arm, wait_event and
/// take_events count the events to acknowledge without a lock).
class CompletionQueue : detail::MoveOnly {
public:
    /// A CQ of at least `options.depth` entries, with its channel if asked for.
    /// Depth above the device's max_cqe is an Error.
    ///
    /// @errors Depth above max_cqe (EINVAL); ibv_create_comp_channel, fcntl (the
    /// channel's O_NONBLOCK) or ibv_create_cq fails (out of resources, a comp_vector the
    /// device does not have).
    /// @misuse A moved-from Context, depth 0.
    static Result<CompletionQueue> create(const Context& context, CqOptions options = {},
                                          std::source_location where = std::source_location::current());

    /// Takes over `other`'s CQ and its events not yet acknowledged; `other` is left
    /// moved-from.
    CompletionQueue(CompletionQueue&& other) noexcept;
    /// Acknowledges this CQ's events taken, then takes over `other`'s as the move
    /// constructor does.
    CompletionQueue& operator=(CompletionQueue&& other) noexcept;
    /// Acknowledges every event taken, as ibv_destroy_cq needs; the CQ itself is
    /// destroyed when the last QP using it goes too.
    ~CompletionQueue();

    /// The real number of entries (at least the requested depth).
    std::uint32_t depth() const noexcept { return depth_; }
    /// Grows or shrinks the CQ to at least `depth` entries (ibv_resize_cq), keeping its
    /// completions, its channel and whether it is armed; depth() tells the real size.
    /// Whoever shares the CQ sizes it for every QP that completes into it (their send and
    /// receive queues together): a CQ that overflows is lost to all of them.
    ///
    /// @errors Depth above max_cqe, or below the completions it holds now (EINVAL, from
    /// the provider); a device that cannot resize CQs (EOPNOTSUPP).
    /// @misuse A moved-from CQ, depth 0.
    Result<void> resize(std::uint32_t depth, std::source_location where = std::source_location::current());
    /// When this CQ was created: device events read before it concern an older CQ.
    std::chrono::steady_clock::time_point created_at() const noexcept { return created_; }
    /// Whether it has a completion channel (CqOptions::channel).
    bool has_channel() const noexcept { return channel_ != nullptr; }

    /// Requests an event for the next completion (ibv_req_notify_cq). Completions
    /// already in the queue raise no event: poll once more after arming.
    ///
    /// @errors ibv_req_notify_cq fails.
    /// @misuse A moved-from CQ; a CQ created without a channel.
    Result<void> arm(bool solicited_only = false,
                     std::source_location where = std::source_location::current());
    /// Waits up to `timeout` for an event of the armed CQ; takes every event pending on
    /// the channel, so none piles up in the kernel, and acknowledges them in batches
    /// (and all before the CQ is destroyed). A timeout is an Error of kind timeout.
    /// `also_watch`, when not -1, is another fd (such as the device's async event fd)
    /// whose readability also ends the wait, successfully, with nothing read from it.
    ///
    /// @errors No event within `timeout` (kind timeout); poll or ibv_get_cq_event fails;
    /// the channel was readable but held no event (EAGAIN): something outside this
    /// object took it, such as an ibv_get_cq_event of the application's own on the
    /// channel (two threads sharing one CompletionQueue is unsafe: see above).
    /// @misuse A moved-from CQ; a CQ created without a channel.
    Result<void> wait_event(std::chrono::milliseconds timeout, int also_watch = -1,
                            std::source_location where = std::source_location::current());
    /// wait_event until `deadline` (steady_clock; its end: no limit), for a wait that
    /// loops under one deadline.
    ///
    /// @errors As wait_event.
    /// @misuse As wait_event.
    Result<void> wait_event_until(std::chrono::steady_clock::time_point deadline, int also_watch = -1,
                                  std::source_location where = std::source_location::current());
    /// Takes every event pending on the channel without waiting (an event loop calls
    /// this when channel_fd() is readable) and returns how many; acknowledges in batches
    /// as wait_event does.
    ///
    /// @errors ibv_get_cq_event fails with anything but EAGAIN (which ends the loop).
    /// @misuse A moved-from CQ; a CQ created without a channel.
    Result<unsigned> take_events(std::source_location where = std::source_location::current());
    /// The channel's file descriptor (non-blocking), for an application's own poll/epoll
    /// loop; follow readiness with take_events().
    ///
    /// @misuse A moved-from CQ; a CQ created without a channel.
    int channel_fd(std::source_location where = std::source_location::current()) const;

    /// The verbs CQ, for polling and calls rdmaxx does not wrap.
    ///
    /// @misuse A moved-from CQ.
    ibv_cq* get(std::source_location where = std::source_location::current()) const {
        return detail::live(cq_, "CompletionQueue", where).get();
    }
    /// The counted CQ, for layers that create QPs of their own: a holder keeps it (and
    /// its channel and device) alive.
    ///
    /// @misuse A moved-from CQ.
    const std::shared_ptr<ibv_cq>& handle(std::source_location where = std::source_location::current()) const;

private:
    CompletionQueue(std::shared_ptr<ibv_cq> cq, std::shared_ptr<ibv_comp_channel> channel, std::uint32_t depth)
        : cq_(std::move(cq)), channel_(std::move(channel)), depth_(depth) {}
    void ack_events() noexcept;
    // The channel, checked: a moved-from CQ is named as such before a missing channel.
    ibv_comp_channel* channel(const char* call, std::source_location where) const;

    std::shared_ptr<ibv_cq> cq_; // keeps the device and the channel alive
    std::shared_ptr<ibv_comp_channel> channel_;
    std::uint32_t depth_;
    unsigned unacked_events_ = 0;
    std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
};

} // namespace rdmaxx
