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

/// poll(2)'s timeout until `deadline`: -1 (no limit) at the clock's end; else what is
/// left rounded up to whole milliseconds (a wait does not wake just before its deadline
/// to poll once more for nothing), 0 when none is left, at most INT_MAX (a longer wait
/// polls again).
inline int poll_timeout_until(std::chrono::steady_clock::time_point deadline) noexcept {
    using Clock = std::chrono::steady_clock;
    if (deadline == Clock::time_point::max())
        return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left <= 0 ? 0 : left >= INT_MAX ? INT_MAX : static_cast<int>(left);
}

} // namespace rdmaxx
