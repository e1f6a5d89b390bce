/// @file
/// A device's asynchronous event (ibv_get_async_event(3)) as a typed value.
#pragma once

#include <cstdint>
#include <string_view>

#include <infiniband/verbs.h>

namespace rdmaxx {

/// What an AsyncEvent reports: the ibv_event_type values by name. QP events (qp_fatal
/// to qp_last_wqe_reached) fill AsyncEvent::qp_num, port events (port_active to
/// client_reregister) AsyncEvent::port, cq_error AsyncEvent::cq; `unknown` is a type
/// rdmaxx does not name (AsyncEvent::raw has it).
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
/// The verbs name of `type` without its IBV_EVENT_ prefix ("QP_FATAL", "PORT_ERR", ...);
/// "unknown" for `unknown`.
std::string_view to_string(AsyncEventType type) noexcept;

/// One asynchronous event as AsyncEvents reads it: a plain value, acknowledged already.
struct AsyncEvent {
    AsyncEventType type = AsyncEventType::unknown; ///< what happened
    std::uint32_t qp_num = 0;     ///< QP events
    std::uint8_t port = 0;        ///< port events
    int raw = 0;                  ///< the ibv_event_type
    const ibv_cq* cq = nullptr;   ///< cq_error: the CQ (compare with CompletionQueue::get())
    /// QP events: the QP's send and receive CQs when the event was read (for
    /// comparison only: either may be gone since).
    const ibv_cq* qp_send_cq = nullptr;
    const ibv_cq* qp_recv_cq = nullptr; ///< see qp_send_cq

    /// Whether this event leaves QP `qp` (0: any QP) unable to complete work: a fatal,
    /// request or access error of that QP, or any CQ error, port error or fatal device error.
    bool kills(std::uint32_t qp) const noexcept;
};

} // namespace rdmaxx
