#include <rdmaxx/ctrl/cm.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>

#include <netdb.h>

#include <fmt/format.h>

#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>

#include "resolve.hpp"

#include "cm_session.hpp"

namespace rdmaxx {
namespace {

using detail::CmSession;

// The endpoint message in CM private data, which arrives padded with zeros.
Result<EndpointMessage> decode_private_data(std::span<const std::byte> data) {
    if (data.size() < endpoint_codec::header_size)
        return std::unexpected(Error::protocol("rdma_cm", fmt::format("{} bytes of private data", data.size())));
    auto body = endpoint_codec::body_length(data.first<endpoint_codec::header_size>());
    if (!body)
        return std::unexpected(std::move(body.error()));
    if (data.size() < endpoint_codec::header_size + *body)
        return std::unexpected(Error::protocol("rdma_cm", "private data shorter than its header says"));
    return endpoint_codec::decode(data.first(endpoint_codec::header_size + *body));
}

// The peer offers exactly one QP, of `qp`'s type.
Result<void> check_offer(const EndpointMessage& offer, const QueuePair& qp, const std::string& peer) {
    if (offer.qps.size() != 1 || offer.qps[0].type != qp.type())
        return std::unexpected(Error::protocol(
            "rdma_cm", fmt::format("{} offers {} QP(s){}, we connect one {} QP", peer, offer.qps.size(),
                                   offer.qps.empty() ? "" : fmt::format(" ({})", to_string(offer.qps[0].type)),
                                   to_string(qp.type()))));
    return {};
}

// Our side of the handshake: `qp` and `metadata`, and the device's read limits.
struct Param {
    std::vector<std::byte> private_data;
    rdma_conn_param raw{};
};

Param conn_param(rdma_cm_id* id, const QueuePair& qp, std::span<const std::byte> metadata, std::uint8_t retry_cnt,
                 std::uint8_t rnr_retry) {
    Param p{endpoint_codec::encode({.qps = {{.endpoint = qp.endpoint(), .type = qp.type()}},
                                    .metadata = {metadata.begin(), metadata.end()}}),
            {}};
    ibv_device_attr limits{};
    if (id->verbs)
        ibv_query_device(id->verbs, &limits); // informational for the CM: zeros are harmless
    p.raw.private_data = p.private_data.data();
    p.raw.private_data_len = static_cast<std::uint8_t>(p.private_data.size());
    p.raw.responder_resources = static_cast<std::uint8_t>(std::min(limits.max_qp_rd_atom, 255));
    p.raw.initiator_depth = static_cast<std::uint8_t>(std::min(limits.max_qp_init_rd_atom, 255));
    p.raw.retry_count = retry_cnt;
    p.raw.rnr_retry_count = rnr_retry;
    p.raw.qp_num = qp.qpn();
    return p;
}

std::string device_of(const rdma_cm_id* id) { return id->verbs ? ibv_get_device_name(id->verbs->device) : ""; }

} // namespace

// --- CmConnection -----------------------------------------------------------------

CmConnection::CmConnection(std::unique_ptr<CmSession> session, std::string device, std::uint8_t ib_port)
    : session_(std::move(session)), device_(std::move(device)), ib_port_(ib_port) {}
CmConnection::CmConnection(CmConnection&&) noexcept = default;
CmConnection& CmConnection::operator=(CmConnection&&) noexcept = default;
CmConnection::~CmConnection() = default;

CmSession& CmConnection::session(std::string_view type, std::source_location where) const {
    return *detail::live(session_, type, where);
}

const std::string& CmConnection::peer(std::source_location where) const {
    return session("CmConnection", where).peer();
}
int CmConnection::fd(std::source_location where) const { return session("CmConnection", where).fd(); }
Result<void> CmConnection::check_alive(std::source_location where) {
    return session("CmConnection", where).check_alive();
}

Result<bool> CmConnection::established(std::source_location where) {
    // a deadline already passed: the event if it is there, else a timeout
    if (auto event = session("CmConnection", where).expect(RDMA_CM_EVENT_ESTABLISHED, Clock::now()); event)
        return true;
    else if (event.error().is_timeout())
        return false;
    else
        return std::unexpected(std::move(event.error()));
}

Result<CmConnection> CmConnection::resolve(std::string_view host, std::uint16_t port,
                                           std::chrono::milliseconds timeout) {
    const auto deadline = deadline_after(timeout);
    auto address = detail::cm_address(std::string(host), port, false, deadline);
    if (!address)
        return std::unexpected(std::move(address.error()));
    const std::string peer = fmt::format("{}:{}", host, port);
    // The kernel waits for the neighbour (ARP) until a netevent wakes it, or else until
    // the whole timeout it was given has passed; an answer that arrives before the
    // request is queued (a fast wire: veth, loopback-like paths) is missed, and the
    // resolution sleeps out that timeout. So it gets short attempts, each a new id.
    constexpr std::chrono::milliseconds attempt{250};
    for (;;) {
        auto session = CmSession::create();
        if (!session)
            return std::unexpected(std::move(session.error()));
        CmSession& cm = **session;
        cm.set_peer(peer);
        const auto step = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                                     std::chrono::milliseconds(1), attempt);
        if (rdma_resolve_addr(cm.id(), nullptr, reinterpret_cast<sockaddr*>(address->data()),
                              static_cast<int>(step.count())) != 0)
            return std::unexpected(Error::from_last_errno("rdma_resolve_addr", "{}", cm.peer()));
        auto resolved = cm.next(deadline);
        if (!resolved)
            return std::unexpected(std::move(resolved.error()));
        if (resolved->type == RDMA_CM_EVENT_ADDR_ERROR && resolved->status == -ETIMEDOUT && Clock::now() < deadline)
            continue; // the neighbour has not answered (or the kernel missed it): ask again
        if (resolved->type != RDMA_CM_EVENT_ADDR_RESOLVED) {
            if (resolved->type == RDMA_CM_EVENT_ADDR_ERROR && resolved->status == -ETIMEDOUT)
                return std::unexpected(
                    Error::timeout("rdma_resolve_addr", fmt::format("{}: no neighbour answered in time", peer)));
            return std::unexpected(Error::from_errno(
                "rdma_resolve_addr", resolved->status < 0 ? -resolved->status : EHOSTUNREACH,
                fmt::format("{}: {} (status {})", peer, rdma_event_str(resolved->type), resolved->status)));
        }
        // in ms, an int: -1 (no limit) is the longest, and at least 1
        const int left_ms = poll_timeout_until(deadline);
        const int timeout_ms = left_ms < 0 ? INT_MAX : std::max(1, left_ms);
        if (rdma_resolve_route(cm.id(), timeout_ms) != 0)
            return std::unexpected(Error::from_last_errno("rdma_resolve_route", "{}", cm.peer()));
        if (auto e = cm.expect(RDMA_CM_EVENT_ROUTE_RESOLVED, deadline); !e)
            return std::unexpected(std::move(e.error()));
        std::string device = device_of(cm.id());
        const std::uint8_t ib_port = cm.id()->port_num;
        return CmConnection(std::move(*session), std::move(device), ib_port);
    }
}

Result<EndpointMessage> CmConnection::connect(QueuePair& qp, std::span<const std::byte> metadata,
                                              const QpConnectOptions& options, std::chrono::milliseconds timeout,
                                              std::source_location where) {
    require(metadata.size() <= max_connect_metadata, where, "{} bytes of metadata in a CM connect request (at most {})",
            metadata.size(), max_connect_metadata);
    CmSession& cm = session("CmConnection", where);
    Param param = conn_param(cm.id(), qp, metadata, options.retry_cnt, options.rnr_retry);
    if (rdma_connect(cm.id(), &param.raw) != 0)
        return std::unexpected(Error::from_last_errno("rdma_connect", "{}", cm.peer()));
    auto response = cm.expect(RDMA_CM_EVENT_CONNECT_RESPONSE, deadline_after(timeout));
    if (!response)
        return std::unexpected(std::move(response.error()));
    auto peer = decode_private_data(response->private_data);
    if (!peer)
        return peer;
    if (auto ok = check_offer(*peer, qp, cm.peer()); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto ok = qp.connect(peer->qps[0].endpoint, options, where); !ok)
        return std::unexpected(std::move(ok.error()));
    return peer;
}

Result<void> CmConnection::establish(std::source_location where) {
    CmSession& cm = session("CmConnection", where);
    if (rdma_establish(cm.id()) != 0)
        return std::unexpected(Error::from_last_errno("rdma_establish", "{}", cm.peer()));
    return {};
}

// --- CmRequest --------------------------------------------------------------------

CmRequest::Pending& CmRequest::Pending::operator=(Pending&& other) noexcept {
    if (this != &other) {
        reject_unanswered();
        connection = std::move(other.connection);
        answered = other.answered;
    }
    return *this;
}

void CmRequest::Pending::reject_unanswered() noexcept {
    if (!answered && connection.session_) // a moved-from connection has no session
        rdma_reject(connection.session_->id(), nullptr, 0);
}

const std::string& CmRequest::peer(std::source_location where) const {
    return pending_.connection.session("CmRequest", where).peer();
}

void CmRequest::reject(std::source_location where) && {
    rdma_reject(pending_.connection.session("CmRequest", where).id(), nullptr, 0);
    pending_.answered = true;
}

Result<void> CmRequest::connect(QueuePair& qp, const QpConnectOptions& options, std::source_location where) {
    if (auto ok = check_offer(offer_, qp, peer(where)); !ok)
        return ok;
    if (auto ok = qp.connect(offer_.qps[0].endpoint, options, where); !ok)
        return ok;
    connected_qpn_ = qp.qpn();
    retry_cnt_ = options.retry_cnt;
    rnr_retry_ = options.rnr_retry;
    return {};
}

Result<CmConnection> CmRequest::accept(const QueuePair& qp, std::span<const std::byte> metadata,
                                       std::chrono::milliseconds timeout, std::source_location where) && {
    auto answered = std::move(*this).answer(qp, metadata, where);
    if (!answered)
        return answered;
    if (auto e = answered->session_->expect(RDMA_CM_EVENT_ESTABLISHED, deadline_after(timeout)); !e)
        return std::unexpected(std::move(e.error()));
    return answered;
}

Result<CmConnection> CmRequest::answer(const QueuePair& qp, std::span<const std::byte> metadata,
                                       std::source_location where) && {
    require(metadata.size() <= max_accept_metadata, where, "{} bytes of metadata in a CM answer (at most {})",
            metadata.size(), max_accept_metadata);
    require(connected_qpn_ == qp.qpn(), where, "CmRequest::accept with QP {:#x}, which its connect() did not connect",
            qp.qpn());
    CmSession& cm = pending_.connection.session("CmRequest", where);
    Param param = conn_param(cm.id(), qp, metadata, retry_cnt_, rnr_retry_);
    pending_.answered = true;
    if (rdma_accept(cm.id(), &param.raw) != 0)
        return std::unexpected(Error::from_last_errno("rdma_accept", "{}", cm.peer()));
    return std::move(pending_.connection);
}

// --- CmListener -------------------------------------------------------------------

CmListener::CmListener(std::unique_ptr<CmSession> session)
    : session_(std::move(session)), device_(device_of(session_->id())), ib_port_(session_->id()->port_num) {}
CmListener::CmListener(CmListener&&) noexcept = default;
CmListener& CmListener::operator=(CmListener&&) noexcept = default;
CmListener::~CmListener() = default;

CmSession& CmListener::session(std::source_location where) const { return *detail::live(session_, "CmListener", where); }

std::uint16_t CmListener::port(std::source_location where) const {
    return ntohs(rdma_get_src_port(session(where).id()));
}
int CmListener::fd(std::source_location where) const { return session(where).fd(); }

Result<CmListener> CmListener::listen(std::string_view host, std::uint16_t port, int backlog) {
    auto session = CmSession::create();
    if (!session)
        return std::unexpected(std::move(session.error()));
    auto address = detail::cm_address(std::string(host), port, true, Clock::now() + detail::listen_lookup_bound);
    if (!address)
        return std::unexpected(std::move(address.error()));
    if (rdma_bind_addr((*session)->id(), reinterpret_cast<sockaddr*>(address->data())) != 0)
        return std::unexpected(Error::from_last_errno("rdma_bind_addr", "{}:{}", host, port));
    if (rdma_listen((*session)->id(), backlog) != 0)
        return std::unexpected(Error::from_last_errno("rdma_listen", "{}:{}", host, port));
    return CmListener(std::move(*session));
}

Result<CmRequest> CmListener::next(std::chrono::milliseconds timeout, std::source_location where) {
    auto event = session(where).next(deadline_after(timeout));
    if (!event)
        return std::unexpected(std::move(event.error()));
    if (event->type != RDMA_CM_EVENT_CONNECT_REQUEST)
        return std::unexpected(
            Error::protocol("CmListener::next", fmt::format("{} on the listening id", rdma_event_str(event->type))));
    // A request that is no offer is refused on the listener's own channel: a flood of
    // garbage costs a reject and a destroy each, seven calls into the kernel fewer than
    // a request adopted first (its own channel opened and set up, the migration, a
    // disconnect, the channel's close).
    auto offer = decode_private_data(event->private_data);
    const auto refuse = [&event] {
        rdma_reject(event->id, nullptr, 0);
        rdma_destroy_id(event->id);
    };
    if (!offer) {
        refuse();
        return std::unexpected(std::move(offer.error()));
    }
    auto session = CmSession::adopt(event->id);
    if (!session) {
        refuse();
        return std::unexpected(std::move(session.error()));
    }
    rdma_cm_id* id = (*session)->id();
    char host[NI_MAXHOST] = "?";
    getnameinfo(rdma_get_peer_addr(id), sizeof(sockaddr_storage), host, sizeof host, nullptr, 0, NI_NUMERICHOST);
    (*session)->set_peer(fmt::format("{}:{}", host, ntohs(rdma_get_dst_port(id))));
    return CmRequest(CmConnection(std::move(*session), device_of(id), id->port_num), std::move(*offer));
}

} // namespace rdmaxx
