#include "stats.hpp"

#include <algorithm>
#include <cmath>

#include <sys/resource.h>

namespace rdmaxx::perf {

double median_of_sorted(std::span<const double> sorted) {
    const std::size_t middle = sorted.size() / 2;
    return sorted.size() % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return median_of_sorted(values);
}

Latency summarize_latency(std::span<const Clock::time_point> stamps, double divisor) {
    std::vector<double> samples;
    for (std::size_t i = 1; i < stamps.size(); ++i)
        samples.push_back(std::chrono::duration<double, std::micro>(stamps[i] - stamps[i - 1]).count() / divisor);
    std::sort(samples.begin(), samples.end());
    if (samples.size() > 2)
        samples.resize(samples.size() - 2);
    if (samples.empty())
        return {};
    const auto n = static_cast<double>(samples.size());
    const auto at = [&](double q) {
        return samples[std::min(static_cast<std::size_t>(std::ceil(n * q)), samples.size() - 1)];
    };
    double sum = 0;
    for (const double s : samples)
        sum += s;
    const double avg = sum / n;
    double squares = 0;
    for (const double s : samples)
        squares += (s - avg) * (s - avg);
    return {.t_min = samples.front(),
            .t_max = samples.back(),
            .t_typical = median_of_sorted(samples),
            .t_avg = avg,
            .t_stdev = std::sqrt(squares / n),
            .p99 = at(0.99),
            .p999 = at(0.999)};
}

Bandwidth bandwidth(std::uint64_t size, std::uint64_t messages, Clock::duration elapsed) {
    const double seconds = std::chrono::duration<double>(elapsed).count();
    if (seconds <= 0)
        return {};
    const double bytes = static_cast<double>(size) * static_cast<double>(messages);
    return {.gbit_per_s = bytes * 8 / seconds / 1e9,
            .mib_per_s = bytes / seconds / (1 << 20),
            .mpps = static_cast<double>(messages) / seconds / 1e6};
}

Clock::duration cpu_time() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const auto us = [](const timeval& t) { return std::chrono::seconds(t.tv_sec) + std::chrono::microseconds(t.tv_usec); };
    return us(usage.ru_utime) + us(usage.ru_stime);
}

} // namespace rdmaxx::perf
