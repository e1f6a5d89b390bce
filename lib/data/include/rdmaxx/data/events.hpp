// The device's asynchronous events (ibv_get_async_event(3)) as typed values, read
// without a thread: from the application's own loop, or by the waits in
// completion.hpp, which end with an Error when an event kills the QP they wait on.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx {

enum class AsyncEventType : std::uint8_t {
    unknown,
    // QP events (AsyncEvent::qp_num)
    qp_fatal, qp_request_error, qp_access_error, comm_established, sq_drained, path_migrated,
    path_migration_error, qp_last_wqe_reached,
    cq_error,
    srq_error, srq_limit_reached,
    // port events (AsyncEvent::port)
    port_active, port_error, lid_change, pkey_change, gid_change, sm_change, client_reregister,
    device_fatal,
};
std::string_view to_string(AsyncEventType type) noexcept;

struct AsyncEvent {
    AsyncEventType type = AsyncEventType::unknown;
    std::uint32_t qp_num = 0; // QP events
    std::uint8_t port = 0;    // port events
    int raw = 0;              // the ibv_event_type

    // Whether this event leaves QP `qp_num` (0: any QP) unable to complete work.
    bool kills(std::uint32_t qp) const noexcept;
};

class AsyncEvents : detail::MoveOnly {
public:
    // Makes the context's async event fd non-blocking; keeps the device open.
    static Result<AsyncEvents> open(const Context& context,
                                    std::source_location where = std::source_location::current());

    // The next event, read and acknowledged; nullopt when none is pending.
    Result<std::optional<AsyncEvent>> next();
    // Waits up to `timeout` for the next event; a timeout is an Error of kind timeout.
    Result<AsyncEvent> wait(std::chrono::milliseconds timeout);

    // Reads the pending events (keeping them for next()) and returns an Error when
    // one of them, now or earlier, left QP `qp_num` (0: any) unable to complete work:
    // a fatal QP event, a CQ error, a port that went down and did not come back, a
    // fatal device error. Called by the waits of completion.hpp.
    Result<void> check(std::uint32_t qp_num);

    // The fd to poll for readability in an application's own event loop.
    int fd() const noexcept { return device_ ? device_->context->async_fd : -1; }

private:
    explicit AsyncEvents(detail::DeviceHandle device) : device_(std::move(device)) {}
    Result<std::optional<AsyncEvent>> read_one();
    void remember(const AsyncEvent& event);

    detail::DeviceHandle device_;
    // events read by check() and not yet taken by next(); the oldest are dropped
    std::array<AsyncEvent, 32> pending_{};
    std::size_t pending_head_ = 0, pending_count_ = 0;
    // what check() reports: the last killing events seen
    std::array<AsyncEvent, 16> fatal_{};
    std::size_t fatal_count_ = 0;
    std::uint32_t ports_down_ = 0; // bit p: port p is down
};

} // namespace rdmaxx
