// rdmaxx-perf's command line: perftest's knobs, perftest's letters where it has them,
// so a user moves between the two without a manual. Pure logic, tested on the host.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <rdmaxx/wrap/device.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::perf {

// rpc: lib/rpc's calls (an echo handler), not a verb of the device's: rpc_lat, rpc_bw.
enum class Verb : std::uint8_t { write, read, send, write_imm, atomic, rpc };
enum class Measure : std::uint8_t { latency, bandwidth };
enum class AtomicOp : std::uint8_t { fetch_add, compare_swap };
// The client's loop through lib/async (co_await per operation, every operation
// signaled) in one of its completion modes, or the data layer's own loop (off).
enum class AsyncMode : std::uint8_t { off, busy, event, hybrid };
std::string_view async_mode_name(AsyncMode mode) noexcept;
// RPC tests: what a call completes to: a coroutine that co_awaits it (asio::awaitable,
// lib/rpc's default token), an rdmaxx::async::Task that co_awaits it (use_task), or a
// callback that makes the next call.
enum class CallForm : std::uint8_t { awaitable, task, callback };
std::string_view call_form_name(CallForm form) noexcept;

// "write_lat", "atomic_bw", ...
struct Test {
    Verb verb = Verb::write;
    Measure measure = Measure::latency;
    friend bool operator==(const Test&, const Test&) = default;
};
std::string test_name(Test test);
std::optional<Test> parse_test(std::string_view name);
std::string_view verb_name(Verb verb) noexcept;

inline constexpr std::uint32_t min_size = 2;
inline constexpr std::uint32_t max_size = 8u << 20; // perftest's -a goes 2 B .. 8 MiB
inline constexpr std::uint32_t atomic_size = 8;
inline constexpr std::uint32_t max_post_list = 64;
// The RPC tests: the largest call (what their server agrees to, each way), the default
// size, the most calls in flight per session and the most sessions.
inline constexpr std::uint32_t rpc_max_size = 1u << 20;
inline constexpr std::uint32_t rpc_default_size = 32;
inline constexpr std::uint32_t rpc_max_window = 1024;
inline constexpr std::uint32_t rpc_max_sessions = 64;
inline constexpr std::uint32_t max_qps = 64;
// Bandwidth WRs above this many bytes are all signaled (perftest does the same).
inline constexpr std::uint32_t signal_every_wr_above = 8192;

// What a run does. The client's values are the run's: the server takes them from the
// client's request, so only the connection knobs matter on the server's command line.
struct Options {
    Test test;
    std::string host;                        // empty: server
    std::uint16_t port = 18515;              // perftest's
    std::string device;                      // empty: RDMAXX_DEVICE or the first
    std::uint8_t ib_port = 1;
    std::optional<std::uint32_t> gid_index;
    bool rdma_cm = false;                    // connect QPs through RDMA CM instead of the TCP exchange
    std::vector<std::uint32_t> sizes{};      // resolved: one size, or the sweep
    std::uint32_t iters = 0;                 // resolved: 1000 latency, 5000 bandwidth (perftest's)
    std::uint32_t tx_depth = 128;             // resolved: 1 latency, 128 bandwidth (perftest's)
    std::uint32_t rx_depth = 512;
    std::uint32_t post_list = 1;
    std::uint32_t cq_mod = 100;              // signal one WR in cq_mod (bandwidth)
    std::optional<std::uint32_t> inline_size; // default: see default_inline()
    std::optional<Mtu> mtu;                  // default: min of both ports' active MTU
    std::uint32_t qps = 1;
    AtomicOp atomic = AtomicOp::fetch_add;
    AsyncMode async = AsyncMode::off;         // client only: one-sided tests (READ, atomics; WRITE bandwidth);
                                              // RPC tests: the endpoint's mode, either side (busy by default)
    std::uint32_t window = 1;                 // RPC tests: calls in flight per session (resolved: 1 latency, 32 bandwidth)
    std::uint32_t sessions = 1;               // RPC tests: sessions of the client's endpoint (bandwidth)
    bool one_way = false;                     // RPC tests: empty responses (SIZE bytes one way)
    CallForm form = CallForm::awaitable;      // RPC tests: what each call completes to
    std::optional<std::uint32_t> rdma_threshold; // RPC tests: EndpointOptions::rdma_threshold (lib/rpc's default)
    bool windows = false;                     // RPC tests: EndpointOptions::lend_through_windows (client)
    bool json = false;
    std::chrono::milliseconds timeout{10'000}; // longest silence of the peer before an Error
    bool help = false;
};

// argv without the program name. A bad argument is an Error (EINVAL) whose text says
// which and why; `help` is set for -h/--help and nothing else is checked then.
Result<Options> parse_options(std::span<const std::string_view> args);
std::string usage();

// The sizes a run sweeps (-a): 2 B to 8 MiB, doubling; 8 B only for atomics; 2 B to
// 1 MiB for the RPC tests.
std::vector<std::uint32_t> sweep_sizes(Verb verb);

// The signal interval a bandwidth run uses at `size`: cq_mod, or every WR above 8 KiB,
// rounded up to whole post lists and at most the TX depth (SignaledSendQueue's rule).
std::uint32_t signal_interval(const Options& options, std::uint32_t size);

// Inline bytes by default (perftest's): latency WRITE/WRITE_IMM 220 B and SEND 236 B
// on mlx5, the device's own limit elsewhere; nothing for READ, atomics and bandwidth.
// `device_limit` is what the device grants, `mlx5` whether it is an mlx5 device.
std::uint32_t default_inline(Test test, bool mlx5, std::uint32_t device_limit);

} // namespace rdmaxx::perf
