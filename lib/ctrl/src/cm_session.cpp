#include "cm_session.hpp"

#include <cstring>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>

#include <fmt/format.h>

#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>

#include "resolve.hpp"

namespace rdmaxx::detail {
namespace {

Result<rdma_event_channel*> make_channel() {
    rdma_event_channel* channel = rdma_create_event_channel();
    if (!channel)
        return std::unexpected(Error::from_last_errno("rdma_create_event_channel"));
    const int flags = fcntl(channel->fd, F_GETFL);
    if (flags < 0 || fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        const Error e = Error::from_last_errno("fcntl", "O_NONBLOCK on the CM event channel");
        rdma_destroy_event_channel(channel);
        return std::unexpected(e);
    }
    return channel;
}

} // namespace

Result<std::unique_ptr<CmSession>> CmSession::create() {
    auto channel = make_channel();
    if (!channel)
        return std::unexpected(std::move(channel.error()));
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(*channel, &id, nullptr, RDMA_PS_TCP) != 0) {
        const Error e = Error::from_last_errno("rdma_create_id");
        rdma_destroy_event_channel(*channel);
        return std::unexpected(e);
    }
    return std::unique_ptr<CmSession>(new CmSession(*channel, id));
}

Result<std::unique_ptr<CmSession>> CmSession::adopt(rdma_cm_id* id) {
    auto channel = make_channel();
    if (!channel)
        return std::unexpected(std::move(channel.error()));
    if (rdma_migrate_id(id, *channel) != 0) {
        const Error e = Error::from_last_errno("rdma_migrate_id");
        rdma_destroy_event_channel(*channel);
        return std::unexpected(e);
    }
    return std::unique_ptr<CmSession>(new CmSession(*channel, id));
}

CmSession::~CmSession() {
    if (!disconnected_)
        rdma_disconnect(id_); // may fail when never connected: nothing to undo then
    if (rdma_destroy_id(id_) != 0)
        logger()->error("{}", Error::from_last_errno("rdma_destroy_id", "{}", peer_));
    rdma_destroy_event_channel(channel_);
}

Result<CmEvent> CmSession::next(Clock::time_point deadline) {
    for (;;) {
        rdma_cm_event* raw = nullptr;
        if (rdma_get_cm_event(channel_, &raw) == 0) {
            CmEvent event{.type = raw->event, .id = raw->id, .status = raw->status, .private_data = {}};
            if (raw->param.conn.private_data && raw->param.conn.private_data_len != 0) {
                const auto* data = static_cast<const std::byte*>(raw->param.conn.private_data);
                event.private_data.assign(data, data + raw->param.conn.private_data_len);
            }
            rdma_ack_cm_event(raw);
            if (event.type == RDMA_CM_EVENT_DISCONNECTED)
                disconnected_ = true;
            return event;
        }
        if (errno != EAGAIN)
            return std::unexpected(Error::from_last_errno("rdma_get_cm_event", "{}", peer_));
        const int left_ms = poll_timeout_until(deadline);
        if (left_ms == 0)
            return std::unexpected(Error::timeout("rdma_get_cm_event", fmt::format("no CM event from {} in time", peer_)));
        pollfd pfd{.fd = channel_->fd, .events = POLLIN, .revents = 0};
        if (::poll(&pfd, 1, left_ms) < 0 && errno != EINTR)
            return std::unexpected(Error::from_last_errno("poll", "CM event channel"));
    }
}

Result<CmEvent> CmSession::expect(rdma_cm_event_type wanted, Clock::time_point deadline) {
    auto event = next(deadline);
    if (!event)
        return event;
    if (event->type != wanted)
        return std::unexpected(Error::from_errno(
            "rdma_get_cm_event", event->status < 0 ? -event->status : ECONNREFUSED,
            fmt::format("{}: {} while waiting for {} (status {})", peer_, rdma_event_str(event->type),
                        rdma_event_str(wanted), event->status)));
    return event;
}

Result<void> CmSession::check_alive() {
    if (!disconnected_) {
        rdma_cm_event* raw = nullptr;
        while (rdma_get_cm_event(channel_, &raw) == 0) {
            const auto type = raw->event;
            rdma_ack_cm_event(raw);
            if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
                type == RDMA_CM_EVENT_TIMEWAIT_EXIT)
                disconnected_ = true;
        }
    }
    if (disconnected_)
        return std::unexpected(Error::from_errno("Connection", ECONNRESET, fmt::format("peer {} disconnected", peer_)));
    return {};
}

Result<std::vector<std::byte>> cm_address(const std::string& host, std::uint16_t port, bool passive,
                                          Clock::time_point deadline) {
    auto addresses = resolve_host(host, port, AF_INET, passive, deadline);
    if (!addresses)
        return std::unexpected(std::move(addresses.error()));
    if (addresses->empty())
        return std::unexpected(Error::from_errno("getaddrinfo", EHOSTUNREACH,
                                                 fmt::format("{}:{}: no IPv4 address", host, port)));
    const SocketAddress& first = addresses->front();
    const auto* bytes = reinterpret_cast<const std::byte*>(first.get());
    return std::vector<std::byte>(bytes, bytes + first.length);
}

} // namespace rdmaxx::detail
