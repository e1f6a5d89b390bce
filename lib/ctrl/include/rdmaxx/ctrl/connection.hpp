// A high-level connection in the spirit of async-rdma, without its flaws: one RC
// queue pair set up over TCP, two-sided messages with credits (a sender never drives
// the peer into RNR retries), one-sided operations, and memory regions lent, requested
// and returned under the owner's control (access ceiling, size quota, leases).
//
// Progress without threads: every call that waits also serves the peer (answers its
// memory requests, returns credits, expires leases). An application that would stay
// away from the connection for long calls progress() now and then.
//
// A Connection is used from one thread at a time, like the Listener and the
// connections it accepted (they share one context, PD and CQ). Every wait is bounded
// by ConnectionOptions::timeout; a dead peer (its TCP control socket closes) makes
// pending and later calls fail with an Error at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>

#include <rdmaxx/ctrl/cm.hpp>
#include <rdmaxx/ctrl/tcp.hpp>
#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

// How two peers find each other and exchange endpoints: the rdmaxx endpoint message
// over TCP, or RDMA CM (address and route resolution by the kernel, the endpoint
// message as private data; needs an IP address on the RDMA device's netdev).
enum class Transport : std::uint8_t { tcp, rdma_cm };

struct ConnectionOptions {
    Transport transport = Transport::tcp;
    std::string device;                       // empty: Context::open's default (RDMA CM: the
                                              // device the address resolves to)
    std::uint8_t port = 1;
    std::optional<std::uint32_t> gid_index{}; // default: Context::choose_gid
    ConnectOptions connect{};                 // MTU, retries, ...
    std::uint32_t max_message = 4096;         // largest message send() takes
    std::uint32_t receive_depth = 32;         // receive buffers posted: the peer's credits
    std::uint32_t max_send_wr = 64;
    std::chrono::milliseconds timeout{5000};  // bound of every wait
    // What the peer may get from request_remote_mr: rights no wider than this, at
    // most this many bytes alive at once, for at most this long.
    Access access_ceiling = Access::local_write | Access::remote_read | Access::remote_write | Access::remote_atomic;
    std::uint64_t quota_bytes = 64ull << 20;
    std::chrono::milliseconds max_lease{60'000};
};

// A region of the peer's memory we may access, and the lease under which we may.
struct RemoteMr {
    RemoteMemory memory;
    std::uint64_t token = 0;                  // names it to its owner
    Access access = Access::none;
    Clock::time_point expires{};              // by our clock: the owner's is stricter

    // Programming error: out of range, as RemoteMemory::slice.
    RemoteMemory slice(std::uint64_t offset, std::uint64_t length,
                       std::source_location where = std::source_location::current()) const {
        return memory.slice(offset, length, where);
    }
};

// What receive() delivered.
struct Received {
    std::size_t size = 0;
    std::optional<std::uint32_t> imm;
};

namespace detail {
struct Group;
struct Link;
} // namespace detail

class Connection : detail::MoveOnly {
public:
    // Connects to a Listener at host:port (over options.transport).
    static Result<Connection> connect(std::string_view host, std::uint16_t port, const ConnectionOptions& options = {});

    Connection(Connection&&) noexcept;
    Connection& operator=(Connection&&) noexcept;
    ~Connection();

    // --- memory ---
    // A region of our own, registered in the connection's PD.
    Result<MemoryRegion> alloc_local_mr(std::size_t size, Access access = access_all);
    // Lends `mr` to the peer for `lease` (at most max_lease): the connection keeps it
    // until the peer returns it (receive_local_mr hands it back) or the lease ends,
    // when it is deregistered before its memory can be reused.
    // Programming error: a region not registered in this connection's PD.
    Result<void> send_local_mr(MemoryRegion mr, std::chrono::milliseconds lease = std::chrono::seconds(30),
                               std::source_location where = std::source_location::current());
    // A region the peer lent with send_local_mr (or granted on request).
    Result<RemoteMr> receive_remote_mr();
    // Asks the peer to allocate `size` bytes for us with `access`. The owner refuses
    // (an Error) beyond its access ceiling or its quota.
    Result<RemoteMr> request_remote_mr(std::size_t size, Access access = access_all,
                                       std::chrono::milliseconds lease = std::chrono::seconds(30));
    // Gives a region back to its owner and waits for the owner's answer: an expired
    // or unknown region is refused (an Error).
    Result<void> send_remote_mr(const RemoteMr& mr);
    // A region we lent or granted, given back by the peer: ours again.
    Result<MemoryRegion> receive_local_mr();

    // --- one-sided: local slices from alloc_local_mr; each call waits for its completion ---
    Result<void> read(const LocalSlice& local, const RemoteMemory& remote);
    Result<void> write(const LocalSlice& local, const RemoteMemory& remote);
    // The peer sees the immediate through receive_write_imm(); uses one credit.
    Result<void> write_with_imm(const LocalSlice& local, const RemoteMemory& remote, std::uint32_t imm);
    // The old value of the remote 8 bytes lands in `result`.
    Result<void> compare_swap(const LocalSlice& result, const RemoteMemory& target, std::uint64_t compare,
                              std::uint64_t swap);
    Result<void> fetch_add(const LocalSlice& result, const RemoteMemory& target, std::uint64_t add);

    // --- two-sided: one message per receive ---
    // A message of at most the peer's max_message bytes (larger is an Error: nothing
    // is split), sent without a copy from a region of this connection's PD
    // (alloc_local_mr). Returns when it was delivered.
    Result<void> send(const LocalSlice& message);
    Result<void> send_with_imm(const LocalSlice& message, std::uint32_t imm);
    // The next message, copied into `into`; a message larger than `into` is an Error
    // and stays queued.
    Result<Received> receive(std::span<std::byte> into);
    // The immediate of the peer's next write_with_imm.
    Result<std::uint32_t> receive_write_imm();

    // Serves the peer without waiting: answers requests, returns credits, expires leases.
    Result<void> progress();

    const QueuePair& queue_pair() const;
    const ConnectionOptions& options() const;

private:
    friend class Listener;
    explicit Connection(std::unique_ptr<detail::Link> link);
    std::unique_ptr<detail::Link> link_;
};

// Accepts connections on host:port; all of them share one context, PD and CQ.
class Listener : detail::MoveOnly {
public:
    static Result<Listener> listen(std::string_view host, std::uint16_t port, const ConnectionOptions& options = {});

    Listener(Listener&&) noexcept;
    Listener& operator=(Listener&&) noexcept;
    ~Listener();

    std::uint16_t port() const;
    // The next client, connected and ready, within `timeout`; meanwhile the
    // connections already accepted are served. A client that fails the handshake is
    // an Error (and a warning in the log); the listener serves the next one.
    Result<Connection> accept(std::chrono::milliseconds timeout);

private:
    Listener() = default;
    Result<Connection> accept_tcp();
    Result<Connection> accept_cm(std::chrono::milliseconds timeout);
    std::optional<TcpListener> tcp_;
    std::optional<CmListener> cm_;
    std::shared_ptr<detail::Group> group_;
    ConnectionOptions options_;
};

} // namespace rdmaxx
