// perftest's arithmetic, so that rdmaxx-perf's figures compare with its figures.
// Pure logic, tested on the host.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

namespace rdmaxx::perf {

using Clock = std::chrono::steady_clock;

// In microseconds.
struct Latency {
    double t_min = 0, t_max = 0, t_typical = 0, t_avg = 0, t_stdev = 0, p99 = 0, p999 = 0;
    double cpu_us_per_op = 0; // the client's CPU time (user + system) per operation; 0: not measured
    std::uint64_t retransmissions = 0; // RPC tests: packets the client sent again
};

// The middle of `values`, or the mean of the two middle ones of an even count (as
// perftest's get_median). `values` must not be empty.
double median(std::vector<double> values);
// The same of values sorted already.
double median_of_sorted(std::span<const double> sorted);

// From the initiator's timestamps, one per post plus one after the last: each sample is
// the gap between consecutive posts, divided by `divisor` (2 for a ping-pong, whose
// round trip is two one-way trips; 1 for READ and atomics, whose one operation is the
// round trip). The two largest samples are dropped; t_typical is the median (the
// element at n/2 of the sorted samples, or the mean of the two middle ones of an even
// count, as perftest's), p99 and p99.9 the element at ceil(n*p), clamped to the last.
Latency summarize_latency(std::span<const Clock::time_point> stamps, double divisor);

struct Bandwidth {
    double gbit_per_s = 0, mib_per_s = 0, mpps = 0;
    double cpu_us_per_op = 0; // as in Latency
    std::uint64_t retransmissions = 0; // as in Latency
};

// This process's CPU time so far (user + system).
Clock::duration cpu_time();

// `messages` of `size` bytes moved between the first post and the last completion.
Bandwidth bandwidth(std::uint64_t size, std::uint64_t messages, Clock::duration elapsed);

} // namespace rdmaxx::perf
