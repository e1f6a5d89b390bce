/// @file
/// Out-of-band TCP for connection setup: a listener, a stream with bounded reads and
/// writes, and the endpoint exchange that brings queue pairs of two processes to RTS.
/// Every call takes a timeout; a dead, silent or lying peer is an Error, never a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <string_view>

#include <rdmaxx/ctrl/endpoint_codec.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

/// The clock of every deadline in lib/ctrl.
using Clock = std::chrono::steady_clock;

/// A connected TCP socket (non-blocking, TCP_NODELAY) whose reads and writes end by a
/// deadline: connection setup's out-of-band channel. Closed when destroyed.
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class TcpStream : detail::MoveOnly {
public:
    /// Connects to host:port (a name or a numeric address) within `timeout`.
    /// @errors the name lookup fails or outlasts `timeout`; socket(2) fails; every
    /// address refuses (the last connect(2) error); `timeout` (kind timeout).
    static Result<TcpStream> connect(std::string_view host, std::uint16_t port, std::chrono::milliseconds timeout);
    /// Takes ownership of a connected socket made elsewhere (Asio's socket.release(), say)
    /// and makes it non-blocking: the deadlines of write_all() and read_exact() rely on it.
    /// @misuse `fd` not an open file descriptor.
    static TcpStream adopt(int fd, std::string peer, std::source_location where = std::source_location::current());

    /// Takes `other`'s socket; `other` is left without one.
    TcpStream(TcpStream&& other) noexcept;
    /// Closes this stream's socket, then takes `other`'s.
    TcpStream& operator=(TcpStream&& other) noexcept;
    ~TcpStream();

    /// All of `bytes`, or an Error (peer gone, deadline passed).
    /// @errors send(2) fails (EPIPE, ECONNRESET: the peer is gone); the deadline passes
    /// (kind timeout); poll(2) fails.
    Result<void> write_all(std::span<const std::byte> bytes, Clock::time_point deadline);
    /// Exactly `bytes.size()` bytes, or an Error; a peer that closes first is an Error
    /// saying how many bytes came.
    /// @errors the peer closes first (ECONNRESET); recv(2) or poll(2) fails; the deadline
    /// passes (kind timeout).
    Result<void> read_exact(std::span<std::byte> bytes, Clock::time_point deadline);

    /// One endpoint message each way: ours out, the peer's in, checked (codec).
    /// @errors as write_all's and read_exact's, within `timeout`; the peer's message is
    /// malformed (kind protocol: endpoint_codec::decode).
    /// @misuse as endpoint_codec::encode's, for `mine`.
    Result<EndpointMessage> exchange(const EndpointMessage& mine, std::chrono::milliseconds timeout,
                                     std::source_location where = std::source_location::current());
    /// One byte each way (ready_byte) once both sides are ready (receives posted):
    /// after it, a SEND from either side finds a receive. No sleeps anywhere.
    /// @errors as write_all's and read_exact's, within `timeout`; the peer sends another
    /// byte (kind protocol).
    Result<void> confirm_ready(std::chrono::milliseconds timeout);
    static constexpr std::byte ready_byte{'R'}; ///< what confirm_ready() sends and expects

    /// The socket, for poll(); -1 for a moved-from stream.
    int fd() const noexcept { return fd_; }
    /// "host:port" of the peer, for messages.
    const std::string& peer() const noexcept { return peer_; }

private:
    TcpStream(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
    friend class TcpListener;
    int fd_ = -1;
    std::string peer_;
};

/// A listening TCP socket (non-blocking, SO_REUSEADDR) whose accept() ends by a
/// deadline. Closed when destroyed.
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class TcpListener : detail::MoveOnly {
public:
    /// Listens on host:port; port 0 picks a free port (see port()). An empty host or
    /// "*" listens on every address.
    /// @errors the name lookup fails or takes over 5 s; socket(2) fails; no address can
    /// be bound and listened on (the last bind(2) or listen(2) error).
    static Result<TcpListener> listen(std::string_view host, std::uint16_t port, int backlog = 64);

    /// Takes `other`'s socket; `other` is left without one.
    TcpListener(TcpListener&& other) noexcept;
    /// Closes this listener's socket, then takes `other`'s.
    TcpListener& operator=(TcpListener&& other) noexcept;
    ~TcpListener();

    /// The port listened on (the one picked, for port 0).
    std::uint16_t port() const noexcept { return port_; }
    /// The listening socket, for poll(); -1 for a moved-from listener.
    int fd() const noexcept { return fd_; }
    /// The next client, within `timeout`.
    /// @errors `timeout` (kind timeout); accept4(2) or poll(2) fails.
    Result<TcpStream> accept(std::chrono::milliseconds timeout);

private:
    TcpListener(int fd, std::uint16_t port) : fd_(fd), port_(port) {}
    int fd_ = -1;
    std::uint16_t port_ = 0;
};

/// When a listener accepts again after accepting failed: a failure for want of
/// descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) leaves the client queued, so
/// the next accept would fail at once; the listener rests instead, 10 ms after the first
/// such failure, twice as long after each next one in a row, at most 1 s, while the
/// connections it serves end and give their descriptors back. Every rdmaxx listener
/// keeps one.
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class AcceptBackoff {
public:
    /// After an accept that failed with errno `error`: how long to rest, or 0 for a
    /// failure that resting does not cure (the next accept may go on at once).
    std::chrono::milliseconds failed(int error) noexcept;
    /// After an accept that succeeded: the next failure rests 10 ms again.
    void succeeded() noexcept { rest_ = {}; }

private:
    std::chrono::milliseconds rest_{};
};

/// The host of a peer named by a numeric "address:port" (TcpStream::peer(),
/// Connection::peer_address()): its IPv4 address, or its IPv6 address's /64 (a host's own
/// addresses, which it may choose at will, share one); an IPv4-mapped address as the
/// IPv4 one. "" if it names no numeric address. What a Listener shares its pending
/// handshakes out by (ListenerStats::evicted), and lib/async's PeerTurn its lanes.
std::string peer_host(std::string_view numeric_address_port);

/// Exchanges endpoints over `stream` and connects each of `qps` to its counterpart
/// (RC/UC: connect(peer); UD: activate()). The peer must offer as many QPs, of the
/// same types, else an Error. Returns the peer's message (its metadata). Then post
/// the receives and call stream.confirm_ready().
/// @errors as TcpStream::exchange's; the peer offers another number of QPs or another
/// type (kind protocol); QueuePair::connect or activate fails.
/// @misuse a null QP; as QueuePair::connect's and activate's (a QP not in RESET); as
/// endpoint_codec::encode's (no QP, more than max_qps, metadata above max_metadata).
Result<EndpointMessage> connect_over_tcp(TcpStream& stream, std::span<QueuePair* const> qps,
                                         std::span<const std::byte> metadata, const QpConnectOptions& options,
                                         std::chrono::milliseconds timeout,
                                         std::source_location where = std::source_location::current());

} // namespace rdmaxx
