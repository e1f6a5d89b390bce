/// @file
/// A high-level connection in the spirit of async-rdma, without its flaws: one RC
/// queue pair set up over TCP or RDMA CM, two-sided messages with credits (a sender
/// never drives the peer into RNR retries), one-sided operations, and memory regions
/// lent, requested and returned under the owner's control (access ceiling, quota,
/// leases).
///
/// Progress without threads: every call that waits also serves the peer (answers its
/// memory requests, returns credits, expires leases). An application that would stay
/// away from the connection for long calls progress() now and then.
///
/// Bounds: every wait ends by its deadline: the call's own `timeout` when given, else
/// ConnectionOptions::timeout plus timeout_per_mib for each MiB the call moves. A peer
/// that dies (its control channel closes) fails pending and later calls at once, but
/// only after what it sent before was delivered.
///
/// A one-sided call or a send that runs out of time ENDS the connection: its queue
/// pair is moved to the error state and the flushed work request is taken off the CQ
/// before the call returns, so the NIC no longer reads or writes the caller's memory
/// (a retransmission cannot land late). Every later call fails.
///
/// The handshake (both transports) exchanges an endpoint message (endpoint_codec.hpp:
/// one RC QP, QP type encoded there) whose 8 metadata bytes are this connection's
/// limits, big-endian: max_message u32 (1..2^30), receive_depth u32 (4..32768). A
/// peer announcing anything else is refused (a protocol Error) before a QP is made.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>

#include <rdmaxx/ctrl/tcp.hpp>
#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pool.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

/// How two peers find each other and exchange endpoints: the rdmaxx endpoint message
/// over TCP, or RDMA CM (address and route resolution by the kernel, the endpoint
/// message as private data; needs an IP address on the RDMA device's netdev).
enum class Transport : std::uint8_t { tcp, rdma_cm };

/// How a region from the connection's pool (alloc_local_mr, the regions granted on
/// the peer's requests) is exposed to the peer. A pooled region shares its arena's
/// registration, so it never goes out under the arena's rkey:
/// - memory_window: a type 2 window bound to exactly its bytes with exactly the lent
///   rights, through this connection's QP (the key works on no other QP), destroyed
///   when the lease ends or the region comes back. No registration per lend.
/// - registration: a registration of its bytes of its own, deregistered then (the
///   rdmaxx 0.1 behaviour, and what a region the caller registered always uses).
/// - automatic: memory_window where the device has type 2 windows AND refuses an
///   access outside a window (probed once per device and process:
///   window_bounds_enforced; Soft-RoCE in Linux 6.1 does not), else registration.
///
/// The path taken is logged when the context is opened and told by Connection::lending().
/// Forcing memory_window on a device without type 2 windows is an Error at connect or
/// listen; forcing it where windows do not bound accesses is allowed, with a warning.
enum class Lending : std::uint8_t { automatic, memory_window, registration };

/// How a Connection or a Listener is made, and the limits it keeps.
///
/// Programming errors (checked by connect and listen, naming the caller's line):
/// max_message outside 1..2^30, receive_depth outside 4..32768 (4: one user message and
/// a credit-only message must both fit beside the reserve for control messages),
/// max_send_wr below 2, a timeout that is not positive (or a negative timeout_per_mib),
/// backlog or max_pending_handshakes below 1, max_lease outside 0..2^32-1 ms (the wire's
/// u32), pool.arena_bytes below MemoryPool::max_block. Values above the device's limits
/// are an Error.
struct ConnectionOptions {
    Transport transport = Transport::tcp;     ///< TCP or RDMA CM, on both sides alike
    std::string device;                       ///< empty: Context::open's default (RDMA CM: the
                                              ///< device the address resolves to)
    std::uint8_t port = 1;                    ///< the device's port (RDMA CM: the one resolved to)
    std::optional<std::uint32_t> gid_index{}; ///< default: Context::choose_gid
    QpConnectOptions qp{};                    ///< the QP's MTU, ACK timeout, retries, ...
    /// Largest message we receive (receive buffers take at least a control message's
    /// 52 bytes, whatever this is; a longer user message breaks the connection)
    std::uint32_t max_message = 4096;
    std::uint32_t receive_depth = 32;         ///< receive buffers posted: the peer's credits
    /// One-sided operations in flight at once (and messages in flight, up to 32).
    std::uint32_t max_send_wr = 64;
    /// The bound of a wait: timeout, plus timeout_per_mib for each MiB the call moves.
    /// At RoCE MTU 1024 and 5 % loss each lost packet costs an ACK timeout (67 ms at
    /// QpConnectOptions::ack_timeout 14): a 1 MiB operation took over 5 s there, and it
    /// completes within these defaults. milliseconds::max() in either sets no limit.
    std::chrono::milliseconds timeout{5000};
    /// Added to `timeout` for each MiB a call moves.
    std::chrono::milliseconds timeout_per_mib{30'000};
    /// Listener: clients the kernel queues before the listener takes them in (TCP
    /// listen backlog, RDMA CM's).
    int backlog = 1024;
    /// Listener: clients taken in and not yet handed out by accept(), their handshakes
    /// running or done (more are refused at the door): what clients an application
    /// slow to accept() makes it hold. When they run short, the running handshakes are
    /// shared out by the clients' hosts (ListenerStats::evicted): one host's clients,
    /// however many and however slow, cannot keep another host's out.
    std::uint32_t max_pending_handshakes = 1024;
    /// What the peer may get from request_remote_mr: rights no wider than this, at
    /// most this many bytes alive at once, for at most this long.
    Access access_ceiling = Access::local_write | Access::remote_read | Access::remote_write | Access::remote_atomic;
    /// What the regions granted and not yet taken back may cost, at most. Each costs
    /// its pool block (the power of two that holds it) and at least a page: a peer
    /// asking for a byte at a time gets at most quota_bytes / 4096 regions (each a
    /// registration or a window of ours).
    std::uint64_t quota_bytes = 64ull << 20;
    std::chrono::milliseconds max_lease{60'000}; ///< the longest lease (send_local_mr's too)
    /// The registered pool of the connection's context (alloc_local_mr, granted
    /// regions) and how its regions are lent.
    PoolOptions pool{};
    Lending lending = Lending::automatic; ///< how pooled regions are lent
};

/// A region of the peer's memory we may access, and the lease under which we may.
struct RemoteMr {
    RemoteMemory memory;                      ///< address, length and key
    std::uint64_t token = 0;                  ///< names it to its owner
    Access access = Access::none;             ///< the rights the owner gave
    Clock::time_point expires{};              ///< by our clock: the owner's is stricter

    /// `length` bytes at `offset` of the region.
    /// @misuse out of range, as RemoteMemory::slice.
    RemoteMemory slice(std::uint64_t offset, std::uint64_t length,
                       std::source_location where = std::source_location::current()) const {
        return memory.slice(offset, length, where);
    }
};

/// What receive() delivered.
struct Received {
    std::size_t size = 0;             ///< the message's length: its bytes lead `into`
    std::optional<std::uint32_t> imm; ///< send_with_imm's immediate
};

namespace detail {
struct Group;
class Link;
class ServerHandshake;
} // namespace detail

/// A per-call bound instead of the connection's rule (ConnectionOptions::timeout).
using Timeout = std::optional<std::chrono::milliseconds>;

/// One RC queue pair to a peer and what runs over it: messages with credits, one-sided
/// operations, memory lent under leases. How it progresses, what bounds each wait and
/// what a timeout does: connection.hpp.
///
/// @threadsafety None. A Connection is used from one thread at a time, and so are all
/// connections that share a context, PD and CQ (a Listener and those it accepted;
/// connections made by connect_another and their origin), as one.
///
/// @errors Every call that waits fails when its deadline passes (kind timeout), and
/// once the connection is broken: the peer gone or closed (ECONNRESET), closed here
/// (ENOTCONN), a failed completion, a peer that broke the protocol (kind protocol), a
/// failed ibv_poll_cq or completion-channel wait. Each call lists what it adds.
///
/// The peer is held to the protocol: a message (or WRITE_WITH_IMM) beyond the credits
/// we gave it, an answer to a region request or a return we are not waiting for, and
/// more than max_unreceived regions lent or immediates written that this side has not
/// received yet each break the connection (kind protocol), so what a peer sends never
/// grows this side's memory without bound.
///
/// @misuse any call on a moved-from Connection.
class Connection : detail::MoveOnly {
public:
    /// Regions the peer lent, or immediates it wrote, that may wait for
    /// receive_remote_mr or receive_write_imm at once (see above).
    static constexpr std::size_t max_unreceived = 65'536;

    /// Connects to a Listener at host:port (over options.transport).
    /// @errors opening the device or creating the PD, CQ, pool or QP fails (values above
    /// the device's limits); Lending::memory_window without type 2 windows; the TCP
    /// connection or RDMA CM resolution fails or is refused; a malformed answer or limits
    /// out of range (kind protocol); connecting the QP fails; `options.timeout` passes.
    /// @misuse options out of range (ConnectionOptions); ConnectionOptions::pool's
    /// arena_bytes below MemoryPool::max_block.
    static Result<Connection> connect(std::string_view host, std::uint16_t port, const ConnectionOptions& options = {},
                                      std::source_location where = std::source_location::current());
    /// Another client connection on this one's context, PD and CQ (regions of either
    /// serve both), with this one's options. RDMA CM: host must be reached through the
    /// same device, else an Error.
    /// @errors as connect()'s; RDMA CM: host reached through another device (EXDEV);
    /// the shared CQ at the device's max_cqe has no room for another connection
    /// (ENOBUFS; Listener tells how connections share a CQ).
    Result<Connection> connect_another(std::string_view host, std::uint16_t port,
                                       std::source_location where = std::source_location::current());

    /// Takes `other`'s connection; `other` is left moved-from.
    Connection(Connection&&) noexcept;
    /// Closes this connection as the destructor does, then takes `other`'s.
    Connection& operator=(Connection&&) noexcept;
    /// Closes as close() does, within the connection's timeout; a failure is logged.
    ~Connection();

    /// Graceful end: sends what is queued and a goodbye, and waits until the peer's NIC
    /// took all of it. The peer gets every message sent before, then "closed". Later
    /// calls fail (ENOTCONN). Closing twice is fine, and so is closing while the peer
    /// closes: once its goodbye is here, nothing more is waited for.
    /// @errors a wait's: what is queued is not taken in time (kind timeout), or the
    /// connection breaks meanwhile. A connection broken before closes without an Error.
    Result<void> close(Timeout timeout = {}, std::source_location where = std::source_location::current());

    // --- memory ---
    /// A region of our own from the connection's pool (no registration once the pool
    /// has grown: rdmaxx/wrap/pool.hpp), zeroed unless `allocate.zeroed` is false;
    /// `access` is what it may be lent with. A pooled region has no rkey of its own:
    /// lend it (send_local_mr) to share it. An alignment above 4 KiB or
    /// HugePages::require in `allocate` gives a region registered on its own instead.
    /// A pooled region goes back to the pool when destroyed: destroy it on the thread
    /// that uses the connection (the pool is not thread-safe: rdmaxx/wrap/pool.hpp).
    /// @errors the pool must grow and cannot (mmap, ibv_reg_mr); for a region of its
    /// own, MemoryRegion::allocate's.
    /// @misuse size 0; for a region of its own, MemoryRegion::allocate's.
    Result<MemoryRegion> alloc_local_mr(std::size_t size, Access access = access_all, AllocateOptions allocate = {},
                                        std::source_location where = std::source_location::current());
    /// Registers memory the caller owns (it must outlive the region).
    /// @errors ibv_reg_mr fails.
    /// @misuse empty memory.
    Result<MemoryRegion> register_local_mr(std::span<std::byte> memory, Access access = access_all,
                                           std::source_location where = std::source_location::current());
    /// Lends `mr` to the peer for `lease` (at most max_lease) with mr.access()'s remote
    /// rights: the connection keeps it until the peer returns it (receive_local_mr hands
    /// it back), the lease ends, or the connection ends (closed here or by the peer, or
    /// broken: every lease ends at once). Then the peer's key is destroyed before the memory
    /// can be reused: a pooled region's window or registration (see Lending); a region
    /// of its own registration is lent through a second registration of its bytes (its
    /// own key, alive when it is handed back, is never told). A late access fails at
    /// the NIC with a remote access error.
    /// @errors a wait's (see the class); registering the bytes or allocating the window
    /// fails (this loan only); the window's bind cannot be posted (the connection ends).
    /// @misuse a region not registered in this connection's PD, or with no remote
    /// rights; a negative lease; a moved-from region.
    Result<void> send_local_mr(MemoryRegion mr, std::chrono::milliseconds lease = std::chrono::seconds(30),
                               std::source_location where = std::source_location::current());
    /// A region the peer lent with send_local_mr.
    /// @errors a wait's (see the class).
    Result<RemoteMr> receive_remote_mr(Timeout timeout = {},
                                       std::source_location where = std::source_location::current());
    /// Asks the peer to allocate `size` bytes for us with `access`. The owner refuses
    /// (an Error) beyond its access ceiling or its quota, which counts every region it
    /// granted until the owner took it back with receive_local_mr.
    /// @errors a wait's (see the class); the owner's refusal, with its errno: EACCES (the
    /// ceiling), EDQUOT (the quota), EINVAL (size 0, no remote right), EBUSY, ENOMEM (the
    /// owner logs why, at most 10 such warnings a second per connection).
    /// @misuse rights beyond local_write and the remote ones (what can be lent); a lease
    /// outside 0..2^32-1 ms (the wire's u32).
    Result<RemoteMr> request_remote_mr(std::size_t size, Access access = access_all,
                                       std::chrono::milliseconds lease = std::chrono::seconds(30), Timeout timeout = {},
                                       std::source_location where = std::source_location::current());
    /// Gives a region back to its owner and waits for the owner's answer: an expired
    /// or unknown region is refused (an Error).
    /// @errors a wait's (see the class); the owner's refusal (ESTALE).
    Result<void> send_remote_mr(const RemoteMr& mr, Timeout timeout = {},
                                std::source_location where = std::source_location::current());
    /// A region we lent or granted, given back by the peer: ours again.
    /// @errors a wait's (see the class).
    Result<MemoryRegion> receive_local_mr(Timeout timeout = {},
                                          std::source_location where = std::source_location::current());

    // --- one-sided: local slices from this connection's PD; each call waits for its
    // completion (see "Bounds" above: a timeout ends the connection) ---
    /// An RDMA READ of `remote` into `local`, waited for. Like every one-sided call: a
    /// timeout once the WR is posted ends the connection (connection.hpp, "Bounds").
    /// @errors a wait's (see the class); a failed completion (a remote access error, say),
    /// which ends the connection.
    /// @misuse more bytes in `local` than `remote` holds.
    Result<void> read(const LocalSlice& local, const RemoteMemory& remote, Timeout timeout = {},
                      std::source_location where = std::source_location::current());
    /// An RDMA WRITE of `local` into `remote`, waited for.
    /// @errors as read()'s.
    /// @misuse as read()'s.
    Result<void> write(const LocalSlice& local, const RemoteMemory& remote, Timeout timeout = {},
                       std::source_location where = std::source_location::current());
    /// An RDMA WRITE with an immediate, waited for. The peer sees the immediate through
    /// receive_write_imm(); uses one credit.
    /// @errors as read()'s (waiting for the credit is a wait too).
    /// @misuse as read()'s.
    Result<void> write_with_imm(const LocalSlice& local, const RemoteMemory& remote, std::uint32_t imm,
                                Timeout timeout = {}, std::source_location where = std::source_location::current());
    /// An atomic compare-and-swap, waited for: the remote 8 bytes become `swap` if they
    /// equal `compare`. The old value of the remote 8 bytes lands in `result`.
    /// @errors as read()'s; a device without atomics (kind unsupported).
    /// @misuse `result` not 8 bytes, 8-aligned; `target` shorter than 8 bytes or not
    /// 8-aligned.
    Result<void> compare_swap(const LocalSlice& result, const RemoteMemory& target, std::uint64_t compare,
                              std::uint64_t swap, Timeout timeout = {},
                              std::source_location where = std::source_location::current());
    /// Adds `add` to the remote 8 bytes; their old value lands in `result`.
    /// @errors as compare_swap()'s.
    /// @misuse as compare_swap()'s.
    Result<void> fetch_add(const LocalSlice& result, const RemoteMemory& target, std::uint64_t add,
                           Timeout timeout = {}, std::source_location where = std::source_location::current());

    // --- two-sided: one message per receive ---
    /// A message of at most the peer's max_message bytes (larger is an Error: nothing
    /// is split), sent without a copy from a region of this connection's PD. Returns
    /// when it was delivered.
    /// @errors a wait's (see the class); above the peer's max_message (EMSGSIZE); a failed
    /// completion. A timeout once the message is posted ends the connection.
    Result<void> send(const LocalSlice& message, Timeout timeout = {},
                      std::source_location where = std::source_location::current());
    /// send() with an immediate, which the peer's receive() returns in Received::imm.
    /// @errors as send()'s.
    Result<void> send_with_imm(const LocalSlice& message, std::uint32_t imm, Timeout timeout = {},
                               std::source_location where = std::source_location::current());
    /// The next message, copied into `into`; a message larger than `into` is an Error
    /// and stays queued. Messages not yet received hold the peer's credits.
    /// @errors a wait's (see the class); a message larger than `into` (EMSGSIZE).
    Result<Received> receive(std::span<std::byte> into, Timeout timeout = {},
                             std::source_location where = std::source_location::current());
    /// The immediate of the peer's next write_with_imm.
    /// @errors a wait's (see the class).
    Result<std::uint32_t> receive_write_imm(Timeout timeout = {},
                                            std::source_location where = std::source_location::current());

    /// Serves the peer without waiting: answers requests, returns credits, expires leases.
    /// @errors the connection is broken (see the class); ibv_poll_cq fails.
    Result<void> progress(std::source_location where = std::source_location::current());

    /// What the regions this side granted on the peer's requests, and has not taken back,
    /// cost (ConnectionOptions::quota_bytes says how each counts).
    std::uint64_t pinned_for_peer(std::source_location where = std::source_location::current()) const;
    /// How pooled regions are lent here: memory_window or registration, never automatic.
    Lending lending(std::source_location where = std::source_location::current()) const;
    /// The connection's RC queue pair.
    const QueuePair& queue_pair(std::source_location where = std::source_location::current()) const;
    /// The options the connection was made with (RDMA CM: on the device and port
    /// resolved to).
    const ConnectionOptions& options(std::source_location where = std::source_location::current()) const;
    /// The peer's "host:port": as given to connect(), or for a connection a Listener
    /// accepted, the numeric address and port the client's connection came from.
    const std::string& peer_address(std::source_location where = std::source_location::current()) const;

private:
    friend class Listener;
    explicit Connection(std::unique_ptr<detail::Link> link);
    detail::Link& link(std::source_location where) const;
    std::unique_ptr<detail::Link> link_;
};

/// What a Listener did with the clients that knocked.
struct ListenerStats {
    std::uint64_t accepted = 0;  ///< handed out by accept()
    std::uint64_t failed = 0;    ///< refused: garbage, a protocol error, a client gone
    std::uint64_t timed_out = 0; ///< silent or slow past the timeout
    std::uint64_t turned_away = 0; ///< past max_pending_handshakes (pending + ready)
    /// Dropped to make room past max_pending_handshakes: a pending handshake of the host
    /// holding the most, for a client of a host holding at least two fewer
    std::uint64_t evicted = 0;
    std::size_t pending = 0;     ///< handshakes running now
    std::size_t ready = 0;       ///< finished, waiting for accept()
};

/// Accepts connections on host:port; all of them share one context, PD and CQ.
/// The CQ is sized for all of them at once, so that no burst of completions from every
/// peer together can overflow it: each connection holds entries for its send and
/// receive queues (receive_depth + max_send_wr + min(max_send_wr, 32), and 16 more where
/// regions are lent through memory windows), and the CQ grows (ibv_resize_cq, doubling
/// from 8,192) as they come, up to the device's max_cqe; a client past that is refused
/// (ENOBUFS, counted in stats().failed) until connections close. connect_another's
/// connections share their CQ the same way (there it is connect_another's Error).
/// Handshakes run concurrently, each bounded by ConnectionOptions::timeout: a client
/// that says nothing, sends garbage or dies holds up no one, and is only counted
/// (stats()) and logged as a warning, at most 10 such warnings a second (a flood's
/// others are held back, and their number logged before the next). Each client's QP
/// connects on a thread of its own:
/// on RoCE, RTR towards the GID the client announced waits for its MAC, up to a second
/// when nobody answers for it (that handshake's timeout waits for the connect;
/// destroying the Listener too).
///
/// @threadsafety None. A Listener and the connections it accepted share a context, PD
/// and CQ: they are used from one thread at a time, as one (see Connection).
class Listener : detail::MoveOnly {
public:
    /// Listens on host:port with `options` for every connection it accepts.
    /// @errors TcpListener::listen's or CmListener::listen's; opening the device or
    /// creating the PD, CQ or pool fails; Lending::memory_window without type 2 windows.
    /// @misuse options out of range (ConnectionOptions); ConnectionOptions::pool's
    /// arena_bytes below MemoryPool::max_block.
    static Result<Listener> listen(std::string_view host, std::uint16_t port, const ConnectionOptions& options = {},
                                   std::source_location where = std::source_location::current());

    /// Takes `other`'s listener; `other` is left moved-from.
    Listener(Listener&&) noexcept;
    /// Closes this listener, then takes `other`'s.
    Listener& operator=(Listener&&) noexcept;
    ~Listener();

    /// The port listened on.
    /// @misuse a moved-from listener (here, in accept() and in stats()).
    std::uint16_t port(std::source_location where = std::source_location::current()) const;
    /// The next client whose handshake completed, within `timeout`; meanwhile the
    /// connections already accepted are served. An Error only for a timeout or a
    /// failure of the listener itself, never for a bad client. Handshakes advance only
    /// inside accept(): a server busy in one connection's receive() leaves new clients
    /// waiting (their connect runs out of time), so keep calling accept() meanwhile.
    /// @errors no client within `timeout` (kind timeout); ibv_poll_cq, arming the CQ,
    /// taking its events or poll(2) fails.
    Result<Connection> accept(std::chrono::milliseconds timeout,
                              std::source_location where = std::source_location::current());
    /// The counts so far, and the handshakes pending and ready now.
    ListenerStats stats(std::source_location where = std::source_location::current()) const;

private:
    struct State;
    explicit Listener(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
};

} // namespace rdmaxx
