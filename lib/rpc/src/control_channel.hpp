// A session's control connection (endpoint.hpp): the setup request and reply, then the
// RC path's messages and the goodbye (rc_codec.hpp), in order both ways; its end is the
// session's end (the peer closed it or died). Over TCP (an Asio socket) or over RDMA CM
// (lib/async's Connection: lib/ctrl's protocol on an RC QP of small messages, whose end
// a dead peer's kernel reports as a TCP connection's is). A byte stream either way, so
// the session's protocol is one: over RDMA CM a write goes as messages of at most
// cm_max_message bytes, and reads take the bytes the messages brought, in order.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <rdmaxx/async/connection.hpp>
#include <rdmaxx/ctrl/tcp.hpp>

namespace rdmaxx::rpc::detail {

using Deadline = std::chrono::steady_clock::time_point;
inline constexpr Deadline no_deadline = Deadline::max();

// The largest message of an RDMA CM control connection (a session's messages are
// 40 to 68 bytes; a longer write goes as several).
inline constexpr std::uint32_t cm_max_message = 128;

// One session's control connection. One read and one write may be in flight at once
// (the session's watcher reads while its writer writes); close() ends both, and every
// later one, with an Error of kind cancelled. Errors keep what the connection said
// (a session that ends by it says why: the peer's close, the port gone down, a failed
// completion): timeout past a deadline; ECONNRESET once the peer closed it; else the
// connection's own, TCP's errno or over RDMA CM lib/async's Error as it came.
// Thread safety: none; as the io_context, which one thread runs.
class ControlChannel {
public:
    using Executor = asio::io_context::executor_type;

    struct State;

    // A connection to the listener at host:port over `transport`, by `deadline`.
    // `call` names the Error's caller: resolving or connecting (errno), no answer by
    // the deadline (timeout), RDMA CM's own errors (as async::Connection::connect's).
    // RDMA CM: on the device context, PD and CQ of `sibling` while it lives (an
    // endpoint's client sessions share one: as_sibling()), else on a context of its own.
    static asio::awaitable<Result<ControlChannel>> connect(Executor executor, Transport transport, std::string host,
                                                           std::uint16_t port, Deadline deadline, const char* call,
                                                           std::weak_ptr<State> sibling);
    // A connected TCP socket (TCP_NODELAY set here).
    explicit ControlChannel(asio::ip::tcp::socket socket);
    // An RDMA CM connection (its send memory registered here: ibv_reg_mr's errors).
    static Result<ControlChannel> over(Executor executor, async::Connection connection);
    ControlChannel(ControlChannel&&) noexcept = default;
    ControlChannel(const ControlChannel&) = delete;
    ControlChannel& operator=(const ControlChannel&) = delete;

    // Exactly into.size() bytes, by `deadline`.
    asio::awaitable<Result<void>> read(std::span<std::byte> into, Deadline deadline = no_deadline);
    // All of `bytes`, by `deadline`.
    asio::awaitable<Result<void>> write(std::span<const std::byte> bytes, Deadline deadline = no_deadline);
    // Ends the connection: what is in flight ends cancelled, and so does every later
    // read and write.
    void close() noexcept;
    // This connection as the `sibling` of later connects (empty for TCP).
    std::weak_ptr<State> as_sibling() const;
    // TCP: a peer host silent for about `silence` (gone, or cut off) fails the
    // connection: keepalive probes from silence / 3 idle, silence / 6 apart (whole
    // seconds, at least 1), and TCP_USER_TIMEOUT `silence`, which ends both the probes
    // and the wait for bytes the peer never ACKs.
    // Over RDMA CM: nothing (an idle RC QP hears of no loss): its user says still-here
    // and reads by a deadline (the endpoint's watch()).
    void watch_peer(std::chrono::milliseconds silence) noexcept;
    // TCP, where watch_peer() works; false: RDMA CM.
    bool over_tcp() const noexcept;
    // The host the connection comes from, as a lane of async::PeerTurn: an IPv4
    // address, or an IPv6 address's /64 (a host's own addresses, which it may choose
    // at will, share one); "" once the connection is gone.
    std::string peer_host() const;

private:
    explicit ControlChannel(std::shared_ptr<State> state) : state_(std::move(state)) {}
    // The connection, shared with the reads and writes in flight: a ControlChannel
    // destroyed (its session's watcher done) while its writer's last write still winds
    // down leaves that write its connection, timer and send memory.
    std::shared_ptr<State> state_;
};

// A listener of control connections: TCP or RDMA CM on address:port.
// Thread safety: none; as the io_context, which one thread runs.
class ControlListener {
public:
    // `setup_timeout` bounds an RDMA CM client's handshake (a TCP accept has none).
    // Errors: binding and listening (errno: the port in use; an invalid address, EINVAL).
    static Result<std::shared_ptr<ControlListener>> listen(ControlChannel::Executor executor, Transport transport,
                                                           const std::string& address, std::uint16_t port,
                                                           std::chrono::milliseconds setup_timeout);
    // The next client's connection; an Error of kind cancelled once closed. Other
    // errors (a failed accept, an RDMA CM client's failed handshake) leave the listener
    // open; one for want of descriptors or memory returns after a pause, growing while
    // they last (no loop of accepts spins on them).
    asio::awaitable<Result<ControlChannel>> accept();
    void close() noexcept;
    bool is_open() const noexcept { return open_; }

    ControlListener(ControlChannel::Executor executor, asio::ip::tcp::acceptor acceptor);
    ControlListener(ControlChannel::Executor executor, async::Listener listener);

private:
    ControlChannel::Executor executor_;
    std::variant<asio::ip::tcp::acceptor, async::Listener> link_;
    asio::steady_timer closed_; // as ControlChannel's
    bool open_ = true;
    AcceptBackoff backoff_; // after accepts that failed for want of resources
};

// `e`, of a step of a session's setup, as `call`'s Error: its kind and code kept,
// `doing` in front of what it said.
Error setup_error(const Error& e, const char* call, std::string_view doing);

} // namespace rdmaxx::rpc::detail
