#include <rdmaxx/data/events.hpp>

#include <fcntl.h>
#include <poll.h>

#include <fmt/format.h>

#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx {
namespace {

AsyncEvent from_verbs(const ibv_async_event& e) {
    AsyncEvent event{.raw = e.event_type};
    switch (e.event_type) {
    case IBV_EVENT_QP_FATAL: event.type = AsyncEventType::qp_fatal; break;
    case IBV_EVENT_QP_REQ_ERR: event.type = AsyncEventType::qp_request_error; break;
    case IBV_EVENT_QP_ACCESS_ERR: event.type = AsyncEventType::qp_access_error; break;
    case IBV_EVENT_COMM_EST: event.type = AsyncEventType::comm_established; break;
    case IBV_EVENT_SQ_DRAINED: event.type = AsyncEventType::sq_drained; break;
    case IBV_EVENT_PATH_MIG: event.type = AsyncEventType::path_migrated; break;
    case IBV_EVENT_PATH_MIG_ERR: event.type = AsyncEventType::path_migration_error; break;
    case IBV_EVENT_QP_LAST_WQE_REACHED: event.type = AsyncEventType::qp_last_wqe_reached; break;
    case IBV_EVENT_CQ_ERR: event.type = AsyncEventType::cq_error; break;
    case IBV_EVENT_SRQ_ERR: event.type = AsyncEventType::srq_error; break;
    case IBV_EVENT_SRQ_LIMIT_REACHED: event.type = AsyncEventType::srq_limit_reached; break;
    case IBV_EVENT_PORT_ACTIVE: event.type = AsyncEventType::port_active; break;
    case IBV_EVENT_PORT_ERR: event.type = AsyncEventType::port_error; break;
    case IBV_EVENT_LID_CHANGE: event.type = AsyncEventType::lid_change; break;
    case IBV_EVENT_PKEY_CHANGE: event.type = AsyncEventType::pkey_change; break;
    case IBV_EVENT_GID_CHANGE: event.type = AsyncEventType::gid_change; break;
    case IBV_EVENT_SM_CHANGE: event.type = AsyncEventType::sm_change; break;
    case IBV_EVENT_CLIENT_REREGISTER: event.type = AsyncEventType::client_reregister; break;
    case IBV_EVENT_DEVICE_FATAL: event.type = AsyncEventType::device_fatal; break;
    default: break;
    }
    switch (event.type) {
    case AsyncEventType::qp_fatal:
    case AsyncEventType::qp_request_error:
    case AsyncEventType::qp_access_error:
    case AsyncEventType::comm_established:
    case AsyncEventType::sq_drained:
    case AsyncEventType::path_migrated:
    case AsyncEventType::path_migration_error:
    case AsyncEventType::qp_last_wqe_reached:
        event.qp_num = e.element.qp->qp_num;
        event.qp_send_cq = e.element.qp->send_cq; // the QP lives until the event is acknowledged
        event.qp_recv_cq = e.element.qp->recv_cq;
        break;
    case AsyncEventType::port_active:
    case AsyncEventType::port_error:
    case AsyncEventType::lid_change:
    case AsyncEventType::pkey_change:
    case AsyncEventType::gid_change:
    case AsyncEventType::sm_change:
    case AsyncEventType::client_reregister: event.port = static_cast<std::uint8_t>(e.element.port_num); break;
    case AsyncEventType::cq_error: event.cq = e.element.cq; break;
    default: break;
    }
    return event;
}

} // namespace

std::string_view to_string(AsyncEventType type) noexcept {
    switch (type) {
    case AsyncEventType::qp_fatal: return "QP_FATAL";
    case AsyncEventType::qp_request_error: return "QP_REQ_ERR";
    case AsyncEventType::qp_access_error: return "QP_ACCESS_ERR";
    case AsyncEventType::comm_established: return "COMM_EST";
    case AsyncEventType::sq_drained: return "SQ_DRAINED";
    case AsyncEventType::path_migrated: return "PATH_MIG";
    case AsyncEventType::path_migration_error: return "PATH_MIG_ERR";
    case AsyncEventType::qp_last_wqe_reached: return "QP_LAST_WQE_REACHED";
    case AsyncEventType::cq_error: return "CQ_ERR";
    case AsyncEventType::srq_error: return "SRQ_ERR";
    case AsyncEventType::srq_limit_reached: return "SRQ_LIMIT_REACHED";
    case AsyncEventType::port_active: return "PORT_ACTIVE";
    case AsyncEventType::port_error: return "PORT_ERR";
    case AsyncEventType::lid_change: return "LID_CHANGE";
    case AsyncEventType::pkey_change: return "PKEY_CHANGE";
    case AsyncEventType::gid_change: return "GID_CHANGE";
    case AsyncEventType::sm_change: return "SM_CHANGE";
    case AsyncEventType::client_reregister: return "CLIENT_REREGISTER";
    case AsyncEventType::device_fatal: return "DEVICE_FATAL";
    case AsyncEventType::unknown: break;
    }
    return "unknown";
}

bool AsyncEvent::kills(std::uint32_t qp) const noexcept {
    switch (type) {
    case AsyncEventType::qp_fatal:
    case AsyncEventType::qp_request_error:
    case AsyncEventType::qp_access_error: return qp == 0 || qp == qp_num;
    case AsyncEventType::cq_error:
    case AsyncEventType::port_error:
    case AsyncEventType::device_fatal: return true;
    default: return false;
    }
}

Error event_error(const AsyncEvent& event) {
    switch (event.type) {
    case AsyncEventType::port_error:
        return Error::from_errno("async event", ENETDOWN, fmt::format("PORT_ERR: port {} is down", event.port));
    case AsyncEventType::cq_error: return Error::from_errno("async event", EIO, "CQ_ERR: the completion queue overflowed");
    case AsyncEventType::device_fatal: return Error::from_errno("async event", EIO, "DEVICE_FATAL");
    default:
        return Error::from_errno("async event", EIO, fmt::format("{} on QP {:#x}", to_string(event.type), event.qp_num));
    }
}

Result<AsyncEvents> AsyncEvents::open(const Context& context, std::source_location where) {
    const detail::DeviceHandle& device = context.handle(where);
    const int fd = device->context->async_fd;
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return std::unexpected(Error::from_last_errno("fcntl", "O_NONBLOCK on the async event fd"));
    return AsyncEvents(device);
}

Result<std::optional<AsyncEvent>> AsyncEvents::read_one(std::source_location where) {
    const detail::DeviceHandle& device = detail::live(device_, "AsyncEvents", where);
    ibv_async_event raw;
    if (ibv_get_async_event(device->context, &raw) != 0) {
        if (errno == EAGAIN)
            return std::nullopt;
        return std::unexpected(Error::from_last_errno("ibv_get_async_event"));
    }
    const AsyncEvent event = from_verbs(raw);
    // acknowledged at once: the value holds all a caller needs, and an unacked
    // event would block the destruction of its QP, CQ or SRQ
    ibv_ack_async_event(&raw);
    fatal_.remember(event, std::chrono::steady_clock::now());
    return event;
}

Result<std::optional<AsyncEvent>> AsyncEvents::next(std::source_location where) {
    if (pending_count_ != 0) {
        const AsyncEvent event = pending_[pending_head_];
        pending_head_ = (pending_head_ + 1) % pending_.size();
        --pending_count_;
        return event;
    }
    return read_one(where);
}

Result<AsyncEvent> AsyncEvents::wait(std::chrono::milliseconds timeout, std::source_location where) {
    const auto deadline = deadline_after(timeout);
    for (;;) {
        auto event = next(where);
        if (!event)
            return std::unexpected(std::move(event.error()));
        if (*event)
            return **event;
        const int left_ms = poll_timeout_until(deadline);
        if (left_ms == 0)
            return std::unexpected(
                Error::timeout("AsyncEvents::wait", fmt::format("no event within {} ms", timeout.count())));
        pollfd pfd{.fd = fd(), .events = POLLIN, .revents = 0};
        if (::poll(&pfd, 1, left_ms) < 0 && errno != EINTR)
            return std::unexpected(Error::from_last_errno("poll", "async event fd"));
    }
}

Result<void> AsyncEvents::check(const QueuePair* qp, const CompletionQueue* cq, std::source_location where) {
    for (;;) {
        auto event = read_one(where);
        if (!event)
            return std::unexpected(std::move(event.error()));
        if (!*event)
            break;
        if (pending_count_ == pending_.size()) {
            logger()->warn("async event {} dropped: 32 events were read and never taken by next()",
                           to_string(pending_[pending_head_].type));
            pending_head_ = (pending_head_ + 1) % pending_.size();
            --pending_count_;
        }
        pending_[(pending_head_ + pending_count_++) % pending_.size()] = **event;
    }
    detail::EventScope scope;
    if (qp) {
        scope.qp_num = qp->qpn();
        scope.qp_created = qp->created_at();
        scope.port = qp->port();
    }
    if (cq) {
        scope.cq = cq->get(where);
        scope.cq_created = cq->created_at();
    }
    const auto fatal = fatal_.find(scope);
    if (!fatal)
        return {};
    return std::unexpected(event_error(*fatal));
}

} // namespace rdmaxx
