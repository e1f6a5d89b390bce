/// @file
/// Deadlines from timeouts, saturating: a timeout of milliseconds::max() ("no limit")
/// is a deadline that never passes. Plain `now + timeout` overflows there (steady_clock
/// counts nanoseconds in 64 bits, ~292 years) into a deadline already past.
///
/// @threadsafety Functions without state: safe.
#pragma once

#include <chrono>
#include <climits>

namespace rdmaxx {

/// `now` + `span`, or the clock's end where that overflows.
constexpr std::chrono::steady_clock::time_point deadline_after(std::chrono::steady_clock::time_point now,
                                                               std::chrono::milliseconds span) noexcept {
    using Clock = std::chrono::steady_clock;
    if (span > std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now))
        return Clock::time_point::max();
    return now + span;
}

/// steady_clock::now() + `span`, or the clock's end where that overflows.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds span) noexcept {
    return deadline_after(std::chrono::steady_clock::now(), span);
}

/// poll(2)'s timeout for `left`: 0 when none is left, at most INT_MAX ms (a longer
/// wait is polled again).
constexpr int poll_timeout(std::chrono::milliseconds left) noexcept {
    return left.count() <= 0 ? 0 : left.count() >= INT_MAX ? INT_MAX : static_cast<int>(left.count());
}

} // namespace rdmaxx
