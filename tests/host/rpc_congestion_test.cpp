// lib/rpc's AIMD congestion window (rdmaxx/rpc/congestion.hpp): pure logic, no clock.
#include <chrono>
#include <cstdint>
#include <optional>

#include <doctest/doctest.h>

#include <rdmaxx/rpc/congestion.hpp>

#include "../support/check.hpp"

using namespace std::chrono_literals;
using rdmaxx::rpc::Aimd;

namespace {

void answer(Aimd& aimd, int times, std::optional<std::chrono::nanoseconds> round_trip = std::nullopt) {
    for (int i = 0; i < times; ++i)
        aimd.answered(round_trip);
}

} // namespace

TEST_CASE("rpc congestion: the window grows by one after each window's worth of answers, up to its most") {
    Aimd aimd({.initial = 4, .least = 1, .most = 6});
    CHECK(aimd.window() == 4);
    answer(aimd, 3);
    CHECK(aimd.window() == 4);
    answer(aimd, 1);
    CHECK(aimd.window() == 5);
    answer(aimd, 5);
    CHECK(aimd.window() == 6);
    answer(aimd, 60);
    CHECK(aimd.window() == 6);
}

TEST_CASE("rpc congestion: a timeout halves the window, once per window's worth of answers, never below its least") {
    Aimd aimd({.initial = 16, .least = 3});
    aimd.timed_out();
    CHECK(aimd.window() == 8);
    aimd.timed_out(); // the same loss episode: the other calls' timers
    CHECK(aimd.window() == 8);
    answer(aimd, 8); // a window of answers: no growth (it shrank in it), the episode is over
    CHECK(aimd.window() == 8);
    aimd.timed_out();
    CHECK(aimd.window() == 4);
    answer(aimd, 4);
    aimd.timed_out();
    CHECK(aimd.window() == 3);
    answer(aimd, 3);
    CHECK(aimd.window() == 3); // shrank in this window: no growth yet
    answer(aimd, 3);
    CHECK(aimd.window() == 4);
}

TEST_CASE("rpc congestion: a round trip above high_rtt shrinks the window as a timeout does; no sample never does") {
    Aimd aimd({.initial = 8, .high_rtt = 100us});
    answer(aimd, 7, 99us);
    answer(aimd, 20, std::nullopt);
    const auto grown = aimd.window();
    CHECK(grown > 8);
    aimd.answered(101us);
    CHECK(aimd.window() == grown / 2);
    answer(aimd, 3, 500us); // the same queue episode
    CHECK(aimd.window() == grown / 2);
    aimd.answered(500us); // the window's last answer: the episode is over
    CHECK(aimd.window() == grown / 2);
    aimd.answered(500us); // still congested: again
    CHECK(aimd.window() == grown / 4);

    Aimd blind({.initial = 8}); // high_rtt 0: round trips say nothing
    answer(blind, 8, 10s);
    CHECK(blind.window() == 9);
}

TEST_CASE("rpc congestion: options out of order are a programming error naming the caller") {
    RDMAXX_CHECK_DEATH(Aimd({.initial = 4, .least = 0}), "least 0");
    RDMAXX_CHECK_DEATH(Aimd({.initial = 2, .least = 3}), "least 3, initial 2");
    RDMAXX_CHECK_DEATH(Aimd({.initial = 9, .least = 1, .most = 8}), "most 8");
}
