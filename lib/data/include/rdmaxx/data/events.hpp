/// @file
/// The device's asynchronous events (ibv_get_async_event(3)) as typed values, read
/// without a thread: from the application's own loop, or by the waits in
/// completion.hpp, which end with an Error when an event kills the QP they wait on.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/data/async_event.hpp>
#include <rdmaxx/data/fatal_events.hpp>
#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/cq.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

/// The Error that work ended by `event` ends with: a port down is ENETDOWN ("PORT_ERR:
/// port N is down"), a CQ error, a device fatal error or a QP's fatal event EIO, each
/// naming the event. One mapping for every reader (AsyncEvents::check, lib/async).
/// Meant for the events that kill work (AsyncEvent::kills).
Error event_error(const AsyncEvent& event);

/// Reads the device's events.
///
/// @threadsafety Distinct objects: safe, one reader per context (the kernel hands each
/// event to one reader). Shared objects: unsafe.
class AsyncEvents : detail::MoveOnly {
public:
    /// Makes the context's async event fd non-blocking; keeps the device open.
    /// @errors fcntl(2) fails on the async event fd.
    /// @misuse a moved-from context.
    static Result<AsyncEvents> open(const Context& context,
                                    std::source_location where = std::source_location::current());

    /// The next event, read and acknowledged; nullopt when none is pending.
    /// @errors ibv_get_async_event fails (other than with EAGAIN: nothing pending).
    /// @misuse a moved-from object (here, in wait() and in check()).
    Result<std::optional<AsyncEvent>> next(std::source_location where = std::source_location::current());
    /// Waits up to `timeout` for the next event; a timeout is an Error of kind timeout.
    /// @errors the timeout; ibv_get_async_event or poll(2) fails.
    Result<AsyncEvent> wait(std::chrono::milliseconds timeout,
                            std::source_location where = std::source_location::current());

    /// Reads the pending events (keeping them for next()) and returns an Error when
    /// one read since the objects were created left `qp` or `cq` unable to complete
    /// work: a fatal event of `qp` (nullptr: of any QP whose send or receive CQ is `cq`,
    /// read since `cq` was created), a CQ error of `cq`, `qp`'s port down (nullptr: any
    /// port), a fatal device error.
    /// Called by the waits of completion.hpp (WaitOptions::events).
    /// @errors such an event, as event_error() maps it (ENETDOWN for a port down, else
    /// EIO); ibv_get_async_event fails.
    /// @misuse a moved-from object or CQ.
    Result<void> check(const QueuePair* qp, const CompletionQueue* cq,
                       std::source_location where = std::source_location::current());

    /// The fd to poll for readability in an application's own event loop; -1 for a
    /// moved-from object.
    int fd() const noexcept { return device_ ? device_->context->async_fd : -1; }

private:
    explicit AsyncEvents(detail::DeviceHandle device) : device_(std::move(device)) {}
    Result<std::optional<AsyncEvent>> read_one(std::source_location where);

    detail::DeviceHandle device_;
    // events read by check() and not yet taken by next(); the oldest are dropped
    std::array<AsyncEvent, 32> pending_{};
    std::size_t pending_head_ = 0, pending_count_ = 0;
    detail::FatalEvents fatal_; // what check() reports
};

} // namespace rdmaxx
