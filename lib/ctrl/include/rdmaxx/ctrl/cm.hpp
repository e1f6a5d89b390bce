/// @file
/// RDMA CM for rdmaxx's own queue pairs. The kernel resolves the peer's address to a
/// local device and port; create the QP on a Context of that device (device(),
/// ib_port()), then connect: the endpoint message (endpoint_codec) travels as CM
/// private data, the QP is connected exactly as over TCP, and the CM reports the
/// peer's disconnect. RDMA CM needs an IP address on the RDMA device's netdev (not
/// loopback).
///
/// ~~~{.unparsed}
///   active:  resolve -> create the QP -> connect (QP connected) -> post receives -> establish
///   passive: listen -> next request -> create the QP -> connect (QP connected)
///            -> post receives -> accept (or answer, then established() until true:
///            a server that serves many clients at once never waits on one)
/// ~~~
///
/// Private data is 56 bytes on a connect request (RDMA_PS_TCP): one QP and at most
/// `max_connect_metadata` bytes of metadata; the answer may carry up to
/// `max_accept_metadata`. Send larger descriptors over the connected QP or another channel.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <rdmaxx/ctrl/endpoint_codec.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

namespace detail {
class CmSession;
} // namespace detail

/// The most metadata a connect request carries: its 56 bytes of private data less an
/// endpoint message of one QP.
inline constexpr std::size_t max_connect_metadata = 56 - (endpoint_codec::header_size + 8 + endpoint_codec::qp_size);
/// The most metadata an answer (CmRequest::accept, CmRequest::answer) carries: its 196
/// bytes of private data less an endpoint message of one QP.
inline constexpr std::size_t max_accept_metadata = 196 - (endpoint_codec::header_size + 8 + endpoint_codec::qp_size);

/// One RDMA CM connection: its CM id and event channel. Destroying it disconnects.
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class CmConnection {
public:
    /// Active side: resolves host:port (address and route) within `timeout`.
    /// @errors the name lookup fails or finds no IPv4 address; creating the event
    /// channel or CM id fails; rdma_resolve_addr or rdma_resolve_route fails or ends in
    /// an error event; no neighbour answers within `timeout` (kind timeout).
    static Result<CmConnection> resolve(std::string_view host, std::uint16_t port, std::chrono::milliseconds timeout);

    /// Takes `other`'s CM id; `other` is left moved-from.
    CmConnection(CmConnection&&) noexcept;
    /// Disconnects this connection, then takes `other`'s CM id.
    CmConnection& operator=(CmConnection&&) noexcept;
    ~CmConnection();

    /// The local device through which the peer is reached.
    const std::string& device() const noexcept { return device_; }
    /// The port of device() through which the peer is reached.
    std::uint8_t ib_port() const noexcept { return ib_port_; }
    /// "host:port" of the peer, for messages.
    /// @misuse a moved-from object (here and in every call below).
    const std::string& peer(std::source_location where = std::source_location::current()) const;

    /// Active side: offers `qp` (in RESET, on device()) and `metadata`, and connects
    /// `qp` to the QP of the server's answer; returns the server's message. A server
    /// that rejects, answers garbage or offers not exactly one QP of qp's type is an
    /// Error. Then post the receives and call establish().
    /// @errors rdma_connect fails; a reject (ECONNREFUSED) or any event but the answer;
    /// no answer within `timeout` (kind timeout); garbage or another offer (kind
    /// protocol); QueuePair::connect fails.
    /// @misuse metadata above max_connect_metadata; as QueuePair::connect's (a UD QP, a
    /// QP not in RESET).
    Result<EndpointMessage> connect(QueuePair& qp, std::span<const std::byte> metadata, const QpConnectOptions& options,
                                    std::chrono::milliseconds timeout,
                                    std::source_location where = std::source_location::current());
    /// Active side: tells the server we are ready (our receives are posted).
    /// @errors rdma_establish fails.
    Result<void> establish(std::source_location where = std::source_location::current());

    /// Passive side, after CmRequest::answer, without waiting: true once the client's
    /// establish arrived, false while it has not; a reject, an error or any other event
    /// is an Error.
    /// @errors any other event (ECONNREFUSED, or the event's status); rdma_get_cm_event
    /// fails.
    Result<bool> established(std::source_location where = std::source_location::current());
    /// Without waiting: an Error once the peer disconnected (or the device went away).
    /// @errors the peer disconnected, or the device was removed (ECONNRESET).
    Result<void> check_alive(std::source_location where = std::source_location::current());
    /// Readable when a CM event arrived (for poll()).
    int fd(std::source_location where = std::source_location::current()) const;

private:
    friend class CmRequest;
    friend class CmListener;
    CmConnection(std::unique_ptr<detail::CmSession> session, std::string device, std::uint8_t ib_port);
    // The session; programming error: a moved-from object (`type` names it).
    detail::CmSession& session(std::string_view type, std::source_location where) const;
    std::unique_ptr<detail::CmSession> session_;
    std::string device_;
    std::uint8_t ib_port_ = 0;
};

/// A peer's connect request, not yet answered; dropping it unanswered rejects it.
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class CmRequest {
public:
    /// Takes `other`'s request; `other` is left moved-from.
    CmRequest(CmRequest&&) noexcept = default;
    /// Rejects this request if it is unanswered (as the destructor does), then takes `other`'s.
    CmRequest& operator=(CmRequest&&) noexcept = default;
    /// Rejects the request if it is unanswered.
    ~CmRequest() = default;

    /// The local device the request came through: create the QP on a Context of it.
    const std::string& device() const noexcept { return pending_.connection.device(); }
    /// The port of device() the request came through.
    std::uint8_t ib_port() const noexcept { return pending_.connection.ib_port(); }
    /// "host:port" of the peer, for messages.
    /// @misuse a moved-from request (here, in connect(), accept(), answer() and reject()).
    const std::string& peer(std::source_location where = std::source_location::current()) const;
    /// What the peer offered: one QP and its metadata (decoded, checked).
    const EndpointMessage& offer() const noexcept { return offer_; }

    /// Connects `qp` (in RESET, on device()) to the offered QP. An offer of another QP
    /// type is an Error.
    /// @errors an offer of another QP type (kind protocol); QueuePair::connect fails.
    /// @misuse as QueuePair::connect's (a UD QP, a QP not in RESET).
    Result<void> connect(QueuePair& qp, const QpConnectOptions& options,
                         std::source_location where = std::source_location::current());
    /// Answers with `qp` (connected by connect(), receives posted) and `metadata`, and
    /// waits for the peer's establish.
    /// @errors rdma_accept fails; the peer's establish does not come within `timeout`
    /// (kind timeout), or another event comes (a reject: ECONNREFUSED).
    /// @misuse metadata above max_accept_metadata, a QP that connect() did not connect.
    Result<CmConnection> accept(const QueuePair& qp, std::span<const std::byte> metadata,
                                std::chrono::milliseconds timeout,
                                std::source_location where = std::source_location::current()) &&;
    /// accept() without the wait: the answer is sent; the connection is ready once its
    /// established() returns true.
    /// @errors rdma_accept fails.
    /// @misuse same as accept()'s.
    Result<CmConnection> answer(const QueuePair& qp, std::span<const std::byte> metadata,
                                std::source_location where = std::source_location::current()) &&;
    /// Refuses the peer (what the destructor does to an unanswered request).
    void reject(std::source_location where = std::source_location::current()) &&;

private:
    friend class CmListener;
    CmRequest(CmConnection connection, EndpointMessage offer)
        : pending_(std::move(connection)), offer_(std::move(offer)) {}
    // The request's connection and whether it was answered: dropped or replaced while
    // unanswered, it rejects the peer (so that CmRequest's own moves stay the defaults).
    struct Pending {
        explicit Pending(CmConnection c) noexcept : connection(std::move(c)) {}
        Pending(Pending&&) noexcept = default;
        Pending& operator=(Pending&& other) noexcept;
        ~Pending() { reject_unanswered(); }
        void reject_unanswered() noexcept;
        CmConnection connection;
        bool answered = false;
    };
    Pending pending_;
    EndpointMessage offer_;
    std::uint32_t connected_qpn_ = 0;
    std::uint8_t retry_cnt_ = 7, rnr_retry_ = 6; // connect()'s options
};

/// Listens for RDMA CM connect requests on an address: next() hands out each one as a
/// CmRequest.
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class CmListener {
public:
    /// Listens on host:port; an empty host listens on every address (then device() is
    /// empty: each request names its own). `backlog`: connect requests the kernel keeps
    /// until next() takes them (capped by the rdma_ucm module's max_backlog, 1024 by
    /// default); beyond it a request is dropped and the client must ask again.
    /// @errors the name lookup fails, takes over 5 s or finds no IPv4 address; creating
    /// the event channel or CM id fails; rdma_bind_addr or rdma_listen fails.
    static Result<CmListener> listen(std::string_view host, std::uint16_t port, int backlog = 1024);

    /// Takes `other`'s CM id; `other` is left moved-from.
    CmListener(CmListener&&) noexcept;
    /// Stops listening (destroys this listener's CM id), then takes `other`'s.
    CmListener& operator=(CmListener&&) noexcept;
    ~CmListener();

    /// The port listened on.
    /// @misuse a moved-from object (here, in fd() and in next()).
    std::uint16_t port(std::source_location where = std::source_location::current()) const;
    /// The device of the address listened on; empty for every address.
    const std::string& device() const noexcept { return device_; }
    /// The port of device() the address is on.
    std::uint8_t ib_port() const noexcept { return ib_port_; }
    /// Readable when a connect request (or another CM event) arrived (for poll()).
    int fd(std::source_location where = std::source_location::current()) const;
    /// The next connect request within `timeout`. A request whose private data is not
    /// a well-formed offer is rejected and returned as an Error.
    /// @errors no request within `timeout` (kind timeout); rdma_get_cm_event, poll(2) or
    /// taking the request's CM id over fails; another event on the listening id, or
    /// private data that is not a well-formed offer (kind protocol).
    Result<CmRequest> next(std::chrono::milliseconds timeout, std::source_location where = std::source_location::current());

private:
    explicit CmListener(std::unique_ptr<detail::CmSession> session);
    detail::CmSession& session(std::source_location where) const;
    std::unique_ptr<detail::CmSession> session_;
    std::string device_;
    std::uint8_t ib_port_ = 0;
};

} // namespace rdmaxx
