/// @file
/// rdmaxx logs through one spdlog logger. By default it writes warnings and worse to
/// stderr; an application replaces it with its own logger (sinks, level, pattern) or
/// silences it. The data path (post, poll) never logs.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>

#include <spdlog/logger.h>

namespace rdmaxx {

/// The library's logger; never null.
///
/// @threadsafety Safe from any thread, also while another thread calls set_logger():
/// the logger is held in an atomic shared_ptr, and a caller keeps the one it got alive.
std::shared_ptr<spdlog::logger> logger();

/// Replaces the library's logger; nullptr installs a logger with no sinks (silence).
/// Programming errors are still printed to stderr when the logger would drop them:
/// an abort must never be unexplained.
///
/// @threadsafety Safe from any thread (as logger()).
void set_logger(std::shared_ptr<spdlog::logger> replacement);

namespace detail {

/// What keeps a place of the library that peers can make log at will (a listener's
/// refusals, a Connection's denied regions, an rpc::Endpoint's warnings) to a few lines
/// a second: at most `burst` warnings (or errors) a second go; past that the place is
/// quiet until the second ends, and its next message is preceded by how many it held
/// back. A flood of hostile clients then costs the log `burst` lines a second, not one
/// per client; the place's counters (ListenerStats, rpc::Counters) still count each.
///
/// @threadsafety None: one place's, used from one thread at a time (its owner's).
class LogBudget {
public:
    explicit LogBudget(std::uint32_t burst = 10) noexcept : burst_(burst) {}

    /// The warning `format` makes of `args`, if the budget allows one at `now`.
    template <class... Args>
    void warn(std::chrono::steady_clock::time_point now, spdlog::format_string_t<Args...> format, Args&&... args) {
        say(spdlog::level::warn, now, format, std::forward<Args>(args)...);
    }
    /// The same for an error: warnings and errors share the budget.
    template <class... Args>
    void error(std::chrono::steady_clock::time_point now, spdlog::format_string_t<Args...> format, Args&&... args) {
        say(spdlog::level::err, now, format, std::forward<Args>(args)...);
    }
    /// Whether a warning may go at `now` (then it counts against this second's burst);
    /// else it counts as held back.
    bool take(std::chrono::steady_clock::time_point now) noexcept {
        if (now - second_began_ >= std::chrono::seconds(1)) {
            second_began_ = now;
            taken_ = 0;
        }
        if (taken_ < burst_) {
            ++taken_;
            return true;
        }
        ++held_back_;
        return false;
    }
    /// Held back since the last warning that went.
    std::uint64_t held_back() const noexcept { return held_back_; }

private:
    template <class... Args>
    void say(spdlog::level::level_enum level, std::chrono::steady_clock::time_point now,
             spdlog::format_string_t<Args...> format, Args&&... args) {
        if (!take(now))
            return;
        const auto log = logger();
        if (held_back_ > 0)
            log->log(level, "rdmaxx: {} messages like the next held back", std::exchange(held_back_, 0));
        log->log(level, format, std::forward<Args>(args)...);
    }

    std::uint32_t burst_;
    std::chrono::steady_clock::time_point second_began_{};
    std::uint32_t taken_ = 0;
    std::uint64_t held_back_ = 0;
};

} // namespace detail

} // namespace rdmaxx
