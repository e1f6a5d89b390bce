// The high-level Connection (rdmaxx/ctrl/connection.hpp) on an io_context: every call
// of it is a coroutine here, and many are in flight at once, on one connection and
// across connections, from one thread, beside the program's sockets and timers.
//
//   asio::co_spawn(io, [](asio::io_context& io) -> asio::awaitable<void> {
//       auto c = co_await rdmaxx::async::Connection::connect(io.get_executor(), "10.0.0.1", 7471);
//       if (!c) { fmt::print("{}\n", c.error()); co_return; }
//       auto mr = c->alloc_local_mr(4096);
//       auto remote = co_await c->request_remote_mr(4096);
//       auto done = co_await c->write(mr->slice(0, 4096), remote->memory);
//   }(io), asio::detached);
//
// The protocol is the blocking Connection's, byte for byte (either side may be
// blocking or async), and so are its bounds, errors and options. What differs:
//  * No call blocks the io_context's thread: the TCP handshake goes through Asio; the
//    serving that the blocking Connection does inside its waits (answering the peer's
//    memory requests, returning credits, expiring leases, noticing the peer's death)
//    runs on the io_context whether or not anyone awaits. A live Connection or
//    Listener therefore keeps run() going: close them to let it return.
//  * The device's async events are watched too: one that leaves a connection's QP
//    unable to complete work (QP fatal, its port down, the CQ in error, the device
//    fatal) ends that connection, and its pending calls end with the event's Error
//    (a port down: ENETDOWN) instead of waiting out their timeout.
//  * Completions are event-driven (the CQ's channel in the io_context's reactor); the
//    busy and hybrid modes are for the data layer's async::QueuePair, where latency is
//    the point.
//  * In flight at once per connection: ConnectionOptions::max_send_wr one-sided
//    operations and up to 32 messages (more wait for room, within their bound).
//  * Cancellation (an `op || timer`, a cancellation slot): a call that has posted
//    nothing yet ends with Error::cancelled and leaves the connection as it was. A call
//    whose work request is posted (read, write, write_with_imm, atomics, send) ENDS
//    the connection, as its timeout does: the QP goes to the error state and the call
//    completes, with Error::cancelled, only once its flushed completion arrived, so the
//    NIC never touches the caller's memory after the coroutine resumes.
//  * Arguments are taken by value; the memory a slice names must stay valid until the
//    call completes (co_await guarantees it).
//  * With g++ 12, build an options struct before the co_await, not braced inside the
//    call (`co_await Connection::connect(ex, host, port, {.device = d})`): g++ 12
//    mishandles such a temporary in a coroutine (examples/kv hit
//    it as an invalid free in ~ConnectionOptions). Name it: `ConnectionOptions o{...};
//    co_await Connection::connect(ex, host, port, o);`.
//  * Transports: TCP and RDMA CM. RDMA CM's active side waits inside librdmacm
//    (resolution, the connect request's answer): like Asio's resolver, connect runs
//    those waits on a private thread and finishes on the io_context's.
//
// Lifetimes: a Connection or Listener must not outlive its io_context. Destroying a
// Connection with calls in flight ends it (QP to error) and lets each call complete
// with its flushed completion; one without calls in flight and not closed is closed in
// the background (goodbye sent, within its timeout) while the io_context runs.
//
// Thread safety: none; as the io_context, which one thread runs
// (rdmaxx/async/completions.hpp). Connections sharing a group (a Listener and those it
// accepted; connect_another) are one object in this respect.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <source_location>
#include <span>
#include <string>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <rdmaxx/ctrl/connection.hpp>

namespace rdmaxx::async {

namespace detail {
class LinkDriver;
struct Peer;
struct ListenerState;
} // namespace detail

class Connection {
public:
    // Connects to a (blocking or async) Listener at host:port (over options.transport).
    // Programming error: options out of range (ConnectionOptions).
    static asio::awaitable<Result<Connection>> connect(asio::any_io_executor executor, std::string host,
                                                       std::uint16_t port, ConnectionOptions options = {},
                                                       std::source_location where = std::source_location::current());
    // Another connection on this one's context, PD and CQ, with its options.
    asio::awaitable<Result<Connection>> connect_another(std::string host, std::uint16_t port,
                                                        std::source_location where = std::source_location::current());

    Connection(Connection&&) noexcept;
    Connection& operator=(Connection&&) noexcept;
    ~Connection();

    // Graceful end, as Connection::close: what is queued and a goodbye reach the peer.
    asio::awaitable<Result<void>> close(Timeout timeout = {});

    // --- memory: as Connection's ---
    Result<MemoryRegion> alloc_local_mr(std::size_t size, Access access = access_all, AllocateOptions allocate = {});
    Result<MemoryRegion> register_local_mr(std::span<std::byte> memory, Access access = access_all);
    asio::awaitable<Result<void>> send_local_mr(MemoryRegion mr,
                                                std::chrono::milliseconds lease = std::chrono::seconds(30),
                                                std::source_location where = std::source_location::current());
    asio::awaitable<Result<RemoteMr>> receive_remote_mr(Timeout timeout = {});
    asio::awaitable<Result<RemoteMr>> request_remote_mr(std::size_t size, Access access = access_all,
                                                        std::chrono::milliseconds lease = std::chrono::seconds(30),
                                                        Timeout timeout = {});
    asio::awaitable<Result<void>> send_remote_mr(RemoteMr mr, Timeout timeout = {});
    asio::awaitable<Result<MemoryRegion>> receive_local_mr(Timeout timeout = {});

    // --- one-sided, as Connection's (a timeout or a cancellation after the post ends
    // the connection: see above) ---
    asio::awaitable<Result<void>> read(LocalSlice local, RemoteMemory remote, Timeout timeout = {});
    asio::awaitable<Result<void>> write(LocalSlice local, RemoteMemory remote, Timeout timeout = {});
    asio::awaitable<Result<void>> write_with_imm(LocalSlice local, RemoteMemory remote, std::uint32_t imm,
                                                 Timeout timeout = {});
    asio::awaitable<Result<void>> compare_swap(LocalSlice result, RemoteMemory target, std::uint64_t compare,
                                               std::uint64_t swap, Timeout timeout = {});
    asio::awaitable<Result<void>> fetch_add(LocalSlice result, RemoteMemory target, std::uint64_t add,
                                            Timeout timeout = {});

    // --- two-sided, as Connection's ---
    asio::awaitable<Result<void>> send(LocalSlice message, Timeout timeout = {});
    asio::awaitable<Result<void>> send_with_imm(LocalSlice message, std::uint32_t imm, Timeout timeout = {});
    asio::awaitable<Result<Received>> receive(std::span<std::byte> into, Timeout timeout = {});
    asio::awaitable<Result<std::uint32_t>> receive_write_imm(Timeout timeout = {});

    std::uint64_t pinned_for_peer(std::source_location where = std::source_location::current()) const;
    Lending lending(std::source_location where = std::source_location::current()) const;
    const rdmaxx::QueuePair& queue_pair(std::source_location where = std::source_location::current()) const;
    const ConnectionOptions& options(std::source_location where = std::source_location::current()) const;

private:
    friend class Listener;
    explicit Connection(std::shared_ptr<detail::Peer> peer);
    detail::Peer& peer(std::source_location where) const;
    std::shared_ptr<detail::Peer> peer_; // shared with the calls in flight
};

// Accepts connections (TCP or RDMA CM) on host:port; all of them share one context,
// PD and CQ. Handshakes run concurrently on the io_context, each bounded by
// ConnectionOptions::timeout: a client that says nothing, sends garbage or dies holds
// up no one, and is only counted (stats()) and logged. Unlike the blocking Listener,
// handshakes advance whether or not anyone is in accept().
class Listener {
public:
    static Result<Listener> listen(asio::any_io_executor executor, std::string_view host, std::uint16_t port,
                                   const ConnectionOptions& options = {},
                                   std::source_location where = std::source_location::current());
    Listener(Listener&&) noexcept;
    Listener& operator=(Listener&&) noexcept;
    ~Listener();

    std::uint16_t port(std::source_location where = std::source_location::current()) const;
    // The next client whose handshake completed, within `timeout`. An Error only for a
    // timeout, a cancellation or a failure of the listener itself, never for a bad client.
    asio::awaitable<Result<Connection>> accept(std::chrono::milliseconds timeout,
                                               std::source_location where = std::source_location::current());
    ListenerStats stats(std::source_location where = std::source_location::current()) const;

private:
    explicit Listener(std::shared_ptr<detail::ListenerState> state);
    std::shared_ptr<detail::ListenerState> state_; // shared with accept() calls in flight
};

} // namespace rdmaxx::async
