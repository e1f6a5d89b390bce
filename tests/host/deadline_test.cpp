// Deadlines from timeouts (rdmaxx/wrap/deadline.hpp): saturating, and poll(2)'s
// timeout argument.
#include <chrono>
#include <climits>

#include <doctest/doctest.h>

#include <rdmaxx/wrap/deadline.hpp>

using rdmaxx::deadline_after;
using rdmaxx::poll_timeout_until;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST_CASE("a deadline is now plus its span, or the clock's end where that overflows") {
    const Clock::time_point now = Clock::now();
    CHECK(deadline_after(now, milliseconds(250)) == now + milliseconds(250));
    CHECK(deadline_after(now, milliseconds(-5)) == now - milliseconds(5));
    CHECK(deadline_after(now, milliseconds::max()) == Clock::time_point::max());
    const auto room = std::chrono::duration_cast<milliseconds>(Clock::time_point::max() - now);
    CHECK(deadline_after(now, room) == now + room);
    CHECK(deadline_after(now, room + milliseconds(1)) == Clock::time_point::max());
    // now + milliseconds::max() wraps to a deadline already past: what the waits did
    CHECK(deadline_after(milliseconds::max()) > Clock::now() + std::chrono::hours(24 * 365 * 100));
}

TEST_CASE("poll's timeout until a deadline: 0 when none is left, at most INT_MAX ms, -1 at the clock's end") {
    const Clock::time_point now = Clock::now();
    CHECK(poll_timeout_until(now - milliseconds(3)) == 0);
    CHECK(poll_timeout_until(now) == 0);
    const int left = poll_timeout_until(Clock::now() + milliseconds(1500));
    CHECK(left > 0); // (1500 less what passed since the clock was read)
    CHECK(left <= 1500);
    const auto days_30 = std::chrono::hours(24 * 30); // above INT_MAX ms (24.8 days): cast to int, it was negative
    CHECK(poll_timeout_until(now + days_30) == INT_MAX);
    CHECK(poll_timeout_until(deadline_after(now, milliseconds::max())) == -1);
}
