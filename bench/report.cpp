#include "report.hpp"

#include <fmt/format.h>

namespace rdmaxx::perf {
namespace {

constexpr std::string_view rule =
    "---------------------------------------------------------------------------------------\n";

std::string_view verb_title(const Setup& s) {
    switch (s.test.verb) {
    case Verb::write: return "RDMA_Write";
    case Verb::read: return "RDMA_Read";
    case Verb::send: return "Send";
    case Verb::write_imm: return "RDMA_Write_with_imm";
    case Verb::atomic: return s.atomic == AtomicOp::fetch_add ? "Atomic FETCH_AND_ADD" : "Atomic CMP_AND_SWAP";
    case Verb::rpc: return "RPC";
    }
    return "?";
}

// What every JSON line carries besides its figures.
std::string json_prefix(const Setup& s, std::uint32_t size, std::uint64_t iters) {
    return fmt::format("{{\"tool\":\"rdmaxx-perf\",\"test\":\"{}\",\"atomic\":\"{}\",\"device\":\"{}\","
                       "\"transport\":\"{}\",\"qps\":{},\"tx_depth\":{},\"post_list\":{},\"cq_mod\":{},"
                       "\"inline\":{},\"mtu\":{},\"size\":{},\"iters\":{}",
                       test_name(s.test), s.atomic == AtomicOp::fetch_add ? "fetch_add" : "compare_swap", s.device,
                       s.rdma_cm ? "rdma_cm" : "tcp", s.qps, s.tx_depth, s.post_list, s.cq_mod, s.inline_size,
                       s.mtu_bytes, size, iters);
}

// A run through lib/async says so, with its CPU time per operation; an RPC run also
// gives its window, sessions and the packets its client sent again.
std::string async_suffix(const Setup& s, double cpu_us_per_op, std::uint64_t retransmissions) {
    if (s.async == AsyncMode::off)
        return {};
    std::string out =
        fmt::format(",\"async\":\"{}\",\"cpu_us_per_op\":{:.3f}", async_mode_name(s.async), cpu_us_per_op);
    if (s.test.verb == Verb::rpc)
        out += fmt::format(",\"window\":{},\"sessions\":{},\"one_way\":{},\"form\":\"{}\",\"retransmissions\":{}",
                           s.window, s.sessions, s.one_way, call_form_name(s.form), retransmissions);
    return out;
}

} // namespace

std::string table_head(const Setup& s) {
    const bool latency = s.test.measure == Measure::latency;
    std::string out = fmt::format("{}                    {} {} Test (rdmaxx-perf)\n", rule, verb_title(s),
                                  latency ? "Latency" : "BW");
    if (s.test.verb == Verb::rpc)
        out += fmt::format(" Device         : {}\n Transport      : UD, lib/rpc sessions set up over TCP\n"
                           " Sessions       : {}\n Window         : {} call(s) in flight per session\n"
                           " Completions    : {}, to {}\n Mtu            : {}[B]\n"
                           " Calls          : {}\n Figures        : {}\n{}",
                           s.device, s.sessions, s.window, async_mode_name(s.async),
                           call_form_name(s.form), s.mtu_bytes,
                           s.one_way ? "SIZE bytes to a handler that answers empty" : "SIZE bytes each way (echo)",
                           latency ? "each call's whole round trip (not half of it, as perftest's ping-pong)"
                                   : "calls per second (MsgRate), the bytes of the requests (BW)",
                           rule);
    else {
        out += fmt::format(" Device         : {}\n Transport      : RC, QPs connected over {}\n Number of qps  : {}\n",
                       s.device, s.rdma_cm ? "RDMA CM" : "the TCP exchange", s.qps);
        out += fmt::format(" TX depth       : {}\n Post list      : {}\n", s.tx_depth, s.post_list);
        if (!latency)
            out += fmt::format(" CQ Moderation  : {} (every WR above 8 KiB)\n", s.cq_mod);
        else if (s.test.verb == Verb::send || s.test.verb == Verb::write_imm)
            out += fmt::format(" CQ Moderation  : {}\n", s.cq_mod);
        out += fmt::format(" Mtu            : {}[B]\n Max inline data: {}[B]\n{}", s.mtu_bytes, s.inline_size, rule);
    }
    if (latency)
        out += " #bytes   #iterations  t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
               "t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]\n";
    else
        out += " #bytes     #iterations    BW average[Gb/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n";
    return out;
}

std::string latency_row(std::uint32_t size, std::uint32_t iters, const Latency& l) {
    return fmt::format(" {:<9}{:<13}{:<15.2f}{:<13.2f}{:<19.2f}{:<15.2f}{:<16.2f}{:<23.2f}{:.2f}\n", size, iters,
                       l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p999);
}

std::string bandwidth_row(std::uint32_t size, std::uint64_t iters, const Bandwidth& b) {
    return fmt::format(" {:<11}{:<15}{:<22.4f}{:<22.2f}{:.6f}\n", size, iters, b.gbit_per_s, b.mib_per_s, b.mpps);
}

std::string latency_json(const Setup& s, std::uint32_t size, std::uint32_t iters, const Latency& l) {
    return fmt::format("{},\"t_min\":{:.3f},\"t_max\":{:.3f},\"t_typical\":{:.3f},\"t_avg\":{:.3f},"
                       "\"t_stdev\":{:.3f},\"p99\":{:.3f},\"p99_9\":{:.3f}{}}}\n",
                       json_prefix(s, size, iters), l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p999,
                       async_suffix(s, l.cpu_us_per_op, l.retransmissions));
}

std::string bandwidth_json(const Setup& s, std::uint32_t size, std::uint64_t iters, const Bandwidth& b) {
    return fmt::format("{},\"gbit_per_s\":{:.6f},\"mib_per_s\":{:.4f},\"mpps\":{:.6f}{}}}\n",
                       json_prefix(s, size, iters), b.gbit_per_s, b.mib_per_s, b.mpps, async_suffix(s, b.cpu_us_per_op, b.retransmissions));
}

} // namespace rdmaxx::perf
