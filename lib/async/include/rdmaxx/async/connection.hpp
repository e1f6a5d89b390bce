/// @file
/// The high-level Connection (rdmaxx/ctrl/connection.hpp) on an io_context: every call
/// of it is a coroutine here, and many are in flight at once, on one connection and
/// across connections, from one thread, beside the program's sockets and timers.
///
/// @code
/// asio::co_spawn(io, [](asio::io_context& io) -> asio::awaitable<void> {
///     auto c = co_await rdmaxx::async::Connection::connect(io.get_executor(), "10.0.0.1", 7471);
///     if (!c) { fmt::print("{}\n", c.error()); co_return; }
///     auto mr = c->alloc_local_mr(4096);
///     auto remote = co_await c->request_remote_mr(4096);
///     auto done = co_await c->write(mr->slice(0, 4096), remote->memory);
/// }(io), asio::detached);
/// @endcode
///
/// The protocol is the blocking Connection's, byte for byte (either side may be
/// blocking or async), and so are its bounds, errors and options. What differs:
///  * No call blocks the io_context's thread: the TCP handshake goes through Asio; the
///    serving that the blocking Connection does inside its waits (answering the peer's
///    memory requests, returning credits, expiring leases, noticing the peer's death)
///    runs on the io_context whether or not anyone awaits. A live Connection or
///    Listener therefore keeps run() going: close them to let it return.
///  * The device's async events are watched too: one that leaves a connection's QP
///    unable to complete work (QP fatal, its port down, the CQ in error, the device
///    fatal) ends that connection, and its pending calls end with the event's Error
///    (a port down: ENETDOWN) instead of waiting out their timeout.
///  * Completions are event-driven (the CQ's channel in the io_context's reactor); the
///    busy and hybrid modes are for the data layer's async::QueuePair, where latency is
///    the point.
///  * In flight at once per connection: ConnectionOptions::max_send_wr one-sided
///    operations and up to 32 messages (more wait for room, within their bound).
///  * Cancellation (an `op || timer`, a cancellation slot): a call that has posted
///    nothing yet ends with Error::cancelled and leaves the connection as it was. A call
///    whose work request is posted (read, write, write_with_imm, atomics, send) ENDS
///    the connection, as its timeout does: the QP goes to the error state and the call
///    completes, with Error::cancelled, only once its flushed completion arrived, so the
///    NIC never touches the caller's memory after the coroutine resumes.
///  * Arguments are taken by value; the memory a slice names must stay valid until the
///    call completes (co_await guarantees it).
///  * With g++ 12, build an options struct before the co_await, not braced inside the
///    call (`co_await Connection::connect(ex, host, port, {.device = d})`): g++ 12
///    mishandles such a temporary in a coroutine (examples/kv hit
///    it as an invalid free in ~ConnectionOptions). Name it: `ConnectionOptions o{...};
///    co_await Connection::connect(ex, host, port, o);`.
///  * Transports: TCP and RDMA CM. RDMA CM's active side waits inside librdmacm
///    (resolution, the connect request's answer): like Asio's resolver, connect runs
///    those waits on a private thread and finishes on the io_context's.
///
/// Lifetimes: a Connection or Listener must not outlive its io_context. Destroying a
/// Connection with calls in flight ends it (QP to error) and lets each call complete
/// with its flushed completion; one without calls in flight and not closed is closed in
/// the background (goodbye sent, within its timeout) while the io_context runs.
///
/// @threadsafety None; as the io_context, which one thread runs
/// (rdmaxx/async/completions.hpp). Connections sharing a group (a Listener and those it
/// accepted; connect_another) are one object in this respect.
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

/// A connection of the blocking rdmaxx::Connection's protocol whose calls are
/// coroutines on an io_context (the top of connection.hpp). Move-only.
///
/// @anchor async_connection_errors
/// @par Runtime errors of every call
/// As the blocking Connection's same call, and:
///  - its bound passed (the call's `timeout`, else ConnectionOptions::timeout plus
///    timeout_per_mib per MiB moved): kind timeout;
///  - the awaiting coroutine cancelled: kind cancelled;
///  - the connection ended: the Error that ended it (the peer closed or died, a failed
///    completion, a device event, an earlier call's timeout or cancellation after its
///    post); ECONNABORTED for a call in flight when the Connection is destroyed.
///
/// A one-sided call or a send that times out or is cancelled after its post ends the
/// connection (the top of connection.hpp).
///
/// @threadsafety None; as the io_context, which one thread runs. Connections sharing a
/// group (a Listener and those it accepted; connect_another) are one object in this
/// respect.
class Connection {
public:
    /// Connects to a (blocking or async) Listener at host:port (over options.transport).
    /// Over RDMA CM its waits for librdmacm run on a thread of the io_context's own (made
    /// at its first such connect): an io_context destroyed meanwhile waits for the wait
    /// under way (within options.timeout), then destroys the connect.
    /// @errors As rdmaxx::Connection::connect: the device's (opening it, resources,
    /// values above its limits), resolving and connecting (errno), a peer that refuses
    /// or answers malformed (protocol) or not within options.timeout (timeout).
    /// @misuse Options out of range (ConnectionOptions).
    static asio::awaitable<Result<Connection>> connect(asio::any_io_executor executor, std::string host,
                                                       std::uint16_t port, ConnectionOptions options = {},
                                                       std::source_location where = std::source_location::current());
    /// Another connection on this one's context, PD and CQ, with its options (its setup
    /// bounded by `timeout` if given, else by the options' timeout). This one may have
    /// ended: the context lives while any connection of it does.
    /// @errors As connect().
    /// @misuse A moved-from Connection.
    asio::awaitable<Result<Connection>> connect_another(std::string host, std::uint16_t port, Timeout timeout = {},
                                                        std::source_location where = std::source_location::current());

    /// Takes over `other`'s connection; `other` is left moved-from.
    Connection(Connection&&) noexcept;
    /// Ends this one's connection, as the destructor does, then takes over `other`'s.
    Connection& operator=(Connection&&) noexcept;
    /// Ends the connection: with calls in flight, QP to error (each completes with its
    /// flushed completion); without, closed in the background (connection.hpp).
    ~Connection();

    /// Graceful end, as rdmaxx::Connection::close: what is queued and a goodbye reach the peer.
    /// @errors @ref async_connection_errors "Those of every call": what is queued not taken in
    /// time, the connection ended first.
    /// @misuse A moved-from Connection.
    asio::awaitable<Result<void>> close(Timeout timeout = {},
                                        std::source_location where = std::source_location::current());

    /// @name Memory, as rdmaxx::Connection's
    /// @{

    /// A region of our own from the connection's pool, as rdmaxx::Connection::alloc_local_mr
    /// (registered on its own for an alignment above 4 KiB or HugePages::require).
    /// @errors Allocating or registering the memory (its errno).
    /// @misuse A moved-from Connection.
    Result<MemoryRegion> alloc_local_mr(std::size_t size, Access access = access_all, AllocateOptions allocate = {},
                                        std::source_location where = std::source_location::current());
    /// Registers memory the caller owns (it must outlive the region) in the
    /// connection's PD.
    /// @errors ibv_reg_mr's failure (its errno).
    /// @misuse A moved-from Connection.
    Result<MemoryRegion> register_local_mr(std::span<std::byte> memory, Access access = access_all,
                                           std::source_location where = std::source_location::current());
    /// Lends `mr` to the peer for `lease` (at most max_lease), as
    /// rdmaxx::Connection::send_local_mr.
    /// @errors @ref async_connection_errors "Those of every call"; exposing the region (a window
    /// bind or registration refused).
    /// @misuse A moved-from Connection; a region registered in another PD, a region without remote
    /// rights; a negative lease.
    asio::awaitable<Result<void>> send_local_mr(MemoryRegion mr,
                                                std::chrono::milliseconds lease = std::chrono::seconds(30),
                                                std::source_location where = std::source_location::current());
    /// A region the peer lent with send_local_mr.
    /// @errors @ref async_connection_errors "Those of every call".
    /// @misuse A moved-from Connection.
    asio::awaitable<Result<RemoteMr>> receive_remote_mr(Timeout timeout = {},
                                                        std::source_location where = std::source_location::current());
    /// Asks the peer to allocate `size` bytes for us with `access`, as
    /// rdmaxx::Connection::request_remote_mr.
    /// @errors @ref async_connection_errors "Those of every call"; the owner's refusal: rights
    /// beyond its access ceiling (EACCES), size 0 or no remote rights (EINVAL), its quota (EDQUOT),
    /// no window free (EBUSY), no memory (ENOMEM).
    /// @misuse A moved-from Connection; as rdmaxx::Connection::request_remote_mr's.
    asio::awaitable<Result<RemoteMr>> request_remote_mr(std::size_t size, Access access = access_all,
                                                        std::chrono::milliseconds lease = std::chrono::seconds(30),
                                                        Timeout timeout = {},
                                                        std::source_location where = std::source_location::current());
    /// Gives a region back to its owner and waits for the owner's answer.
    /// @errors @ref async_connection_errors "Those of every call"; an expired or unknown region is
    /// refused (ESTALE).
    /// @misuse A moved-from Connection.
    asio::awaitable<Result<void>> send_remote_mr(RemoteMr mr, Timeout timeout = {},
                                                 std::source_location where = std::source_location::current());
    /// A region we lent or granted, given back by the peer: ours again.
    /// @errors @ref async_connection_errors "Those of every call".
    /// @misuse A moved-from Connection.
    asio::awaitable<Result<MemoryRegion>> receive_local_mr(
        Timeout timeout = {}, std::source_location where = std::source_location::current());

    /// @}

    /// @name One-sided, as rdmaxx::Connection's
    /// Local slices from this connection's PD; each call completes with its work
    /// completion. A timeout or a cancellation after the post ends the connection (the
    /// top of connection.hpp).
    /// @{

    /// RDMA READ of `remote` into `local`.
    /// @errors @ref async_connection_errors "Those of every call"; the device's refusal of the
    /// post; a failed work completion.
    /// @misuse A moved-from Connection; rdmaxx/data/post.hpp's checks (a remote slice smaller than
    /// `local`).
    asio::awaitable<Result<void>> read(LocalSlice local, RemoteMemory remote, Timeout timeout = {},
                                       std::source_location where = std::source_location::current());
    /// RDMA WRITE of `local` into `remote`.
    /// @errors As read().
    /// @misuse As read().
    asio::awaitable<Result<void>> write(LocalSlice local, RemoteMemory remote, Timeout timeout = {},
                                        std::source_location where = std::source_location::current());
    /// RDMA WRITE whose immediate the peer sees through receive_write_imm(); uses one
    /// credit.
    /// @errors As read().
    /// @misuse As read().
    asio::awaitable<Result<void>> write_with_imm(LocalSlice local, RemoteMemory remote, std::uint32_t imm,
                                                 Timeout timeout = {},
                                                 std::source_location where = std::source_location::current());
    /// Atomic compare-and-swap of the remote 8 bytes; their old value lands in `result`.
    /// @errors As read(); a device without atomics.
    /// @misuse A moved-from Connection; rdmaxx/data/post.hpp's checks (8 bytes,
    /// 8-aligned on both sides).
    asio::awaitable<Result<void>> compare_swap(LocalSlice result, RemoteMemory target, std::uint64_t compare,
                                               std::uint64_t swap, Timeout timeout = {},
                                               std::source_location where = std::source_location::current());
    /// Atomic fetch-and-add to the remote 8 bytes; their old value lands in `result`.
    /// @errors As compare_swap().
    /// @misuse As compare_swap().
    asio::awaitable<Result<void>> fetch_add(LocalSlice result, RemoteMemory target, std::uint64_t add,
                                            Timeout timeout = {},
                                            std::source_location where = std::source_location::current());

    /// @}

    /// @name Two-sided, as rdmaxx::Connection's
    /// One message per receive, with credits.
    /// @{

    /// A message of at most the peer's max_message bytes, sent without a copy from a region of this
    /// connection's PD; completes when it was delivered.
    /// @errors @ref async_connection_errors "Those of every call"; a message above the peer's
    /// max_message (EMSGSIZE); a failed work completion.
    /// @misuse A moved-from Connection.
    asio::awaitable<Result<void>> send(LocalSlice message, Timeout timeout = {},
                                       std::source_location where = std::source_location::current());
    /// send() with an immediate the peer's receive() gets.
    /// @errors As send().
    /// @misuse As send().
    asio::awaitable<Result<void>> send_with_imm(LocalSlice message, std::uint32_t imm, Timeout timeout = {},
                                                std::source_location where = std::source_location::current());
    /// The next message, copied into `into`.
    /// @errors @ref async_connection_errors "Those of every call"; a message larger than `into`
    /// (EMSGSIZE: it stays queued).
    /// @misuse A moved-from Connection.
    asio::awaitable<Result<Received>> receive(std::span<std::byte> into, Timeout timeout = {},
                                              std::source_location where = std::source_location::current());
    /// The immediate of the peer's next write_with_imm.
    /// @errors @ref async_connection_errors "Those of every call".
    /// @misuse A moved-from Connection.
    asio::awaitable<Result<std::uint32_t>> receive_write_imm(
        Timeout timeout = {}, std::source_location where = std::source_location::current());

    /// @}

    /// What the regions this side granted on the peer's requests, and has not taken back,
    /// cost (ConnectionOptions::quota_bytes says how each counts).
    /// @misuse A moved-from Connection.
    std::uint64_t pinned_for_peer(std::source_location where = std::source_location::current()) const;
    /// How pooled regions are lent here: memory_window or registration, never automatic.
    /// @misuse A moved-from Connection.
    Lending lending(std::source_location where = std::source_location::current()) const;
    /// The connection's RC queue pair.
    /// @misuse A moved-from Connection.
    const rdmaxx::QueuePair& queue_pair(std::source_location where = std::source_location::current()) const;
    /// The options it runs with (a Listener's, for the connections it accepted).
    /// @misuse A moved-from Connection.
    const ConnectionOptions& options(std::source_location where = std::source_location::current()) const;
    /// The peer's "host:port", as rdmaxx::Connection::peer_address: as given to
    /// connect(), or a Listener's client's numeric address and port.
    /// @misuse A moved-from Connection.
    const std::string& peer_address(std::source_location where = std::source_location::current()) const;

private:
    friend class Listener;
    explicit Connection(std::shared_ptr<detail::Peer> peer);
    detail::Peer& peer(std::source_location where) const;
    std::shared_ptr<detail::Peer> peer_; // shared with the calls in flight
};

/// Accepts connections (TCP or RDMA CM) on host:port; all of them share one context,
/// PD and CQ. Handshakes run concurrently on the io_context, each bounded by
/// ConnectionOptions::timeout: a client that says nothing, sends garbage or dies holds
/// up no one, and is only counted (stats()) and logged (as the blocking Listener's,
/// at most 10 warnings a second). Unlike the blocking Listener,
/// handshakes advance whether or not anyone is in accept(). Each client's QP connects
/// (up to a second towards an address the client announced and nobody answers for) on
/// a helper thread of the io_context, at a peer's turn (run_blocking and PeerTurn,
/// blocking.hpp, in the lane of the client's host): however many clients do that at
/// once, their connects take two helper threads, shared with every listener and
/// rpc::Endpoint on the io_context, and one host's clients delay another host's by one
/// turn at most; a client whose turn has not come by its handshake's deadline fails.
/// Meanwhile it holds one of max_pending_handshakes: when they run short, a client of
/// a host holding fewer takes one from the host holding the most (its oldest still
/// waiting for a turn, or silent: ListenerStats::evicted), so one host's flood keeps no
/// other host out. Destroying the Listener waits for the connects under way (a second
/// at most).
/// Move-only.
/// @threadsafety None; as the io_context, which one thread runs. A Listener and the
/// connections it accepted are one object in this respect.
class Listener {
public:
    /// Listens on host:port (over options.transport), serving handshakes on
    /// `executor`'s io_context from now on.
    /// @errors As rdmaxx::Listener::listen: the device's (opening it, resources),
    /// binding and listening (errno: the port in use, say).
    /// @misuse Options out of range (ConnectionOptions).
    static Result<Listener> listen(asio::any_io_executor executor, std::string_view host, std::uint16_t port,
                                   const ConnectionOptions& options = {},
                                   std::source_location where = std::source_location::current());
    /// Takes over `other`'s listener; `other` is left moved-from.
    Listener(Listener&&) noexcept;
    /// Lets go of this one's listener, as the destructor does, then takes over `other`'s.
    Listener& operator=(Listener&&) noexcept;
    /// Stops listening (once no accept() in flight holds it); the connections it
    /// accepted live on.
    ~Listener();

    /// The port it listens on.
    /// @misuse A moved-from Listener.
    std::uint16_t port(std::source_location where = std::source_location::current()) const;
    /// The next client whose handshake completed, within `timeout`. An Error only for a
    /// timeout, a cancellation or a failure of the listener itself, never for a bad client.
    /// @errors No client within `timeout` (timeout); the awaiting coroutine cancelled
    /// (cancelled).
    /// @misuse A moved-from Listener.
    asio::awaitable<Result<Connection>> accept(std::chrono::milliseconds timeout,
                                               std::source_location where = std::source_location::current());
    /// What it did with the clients that knocked.
    /// @misuse A moved-from Listener.
    ListenerStats stats(std::source_location where = std::source_location::current()) const;

private:
    explicit Listener(std::shared_ptr<detail::ListenerState> state);
    std::shared_ptr<detail::ListenerState> state_; // shared with accept() calls in flight
};

} // namespace rdmaxx::async
