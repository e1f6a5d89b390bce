// rdmaxx-perf's output: a table like perftest's for people, one JSON object per
// result line (--json) for scripts. Returns strings: tested on the host.
#pragma once

#include <cstdint>
#include <string>

#include "options.hpp"
#include "stats.hpp"

namespace rdmaxx::perf {

// The settings a run ended up with, as both sides resolved them.
struct Setup {
    Test test;
    AtomicOp atomic = AtomicOp::fetch_add;
    std::string device;
    bool rdma_cm = false;
    std::uint32_t qps = 1;
    std::uint32_t tx_depth = 0;
    std::uint32_t post_list = 1;
    std::uint32_t cq_mod = 0;
    std::uint32_t inline_size = 0;
    std::uint32_t mtu_bytes = 0;
    AsyncMode async = AsyncMode::off; // the client's loop (RPC tests: its endpoint's mode)
    std::uint32_t window = 0;         // RPC tests: calls in flight per session
    std::uint32_t sessions = 0;       // RPC tests
    bool one_way = false;             // RPC tests: empty responses
    CallForm form = CallForm::awaitable; // RPC tests: what calls complete to
};

// The banner and the column heads, perftest's layout (the RPC tests': their own banner,
// the same columns).
std::string table_head(const Setup& setup);
std::string latency_row(std::uint32_t size, std::uint32_t iters, const Latency& l);
std::string bandwidth_row(std::uint32_t size, std::uint64_t iters, const Bandwidth& b);
std::string latency_json(const Setup& setup, std::uint32_t size, std::uint32_t iters, const Latency& l);
std::string bandwidth_json(const Setup& setup, std::uint32_t size, std::uint64_t iters, const Bandwidth& b);

} // namespace rdmaxx::perf
