// The RPC engine's retransmission timeout (lib/rpc/src/retransmit.hpp), against values
// computed by hand from RFC 6298's formulas.
#include <doctest/doctest.h>

#include "../support/check.hpp"
#include "retransmit.hpp"

using namespace rdmaxx::rpc::detail;
using namespace std::chrono_literals;

TEST_CASE("rto: the initial value until the first sample, then srtt + 4 rttvar") {
    RtoEstimator rto;
    CHECK(rto.rto() == 50ms);
    rto.measured(1ms, Transmissions::once); // srtt 1 ms, rttvar 500 us
    CHECK(rto.rto() == 3ms);
    rto.measured(1ms, Transmissions::once); // rttvar 3/4 * 500 = 375 us
    CHECK(rto.rto() == 2500us);
    rto.measured(3ms, Transmissions::once); // rttvar (3 * 375 + 2000) / 4 = 781.25 us, srtt (7 + 3) / 8 = 1.25 ms
    CHECK(rto.rto() == 1250us + 4 * 781250ns);
}

TEST_CASE("rto: a steady round trip converges to srtt + granularity") {
    RtoEstimator rto;
    for (int i = 0; i < 100; ++i) // rttvar = 500 us * (3/4)^n, in whole ns: 0 after ~46 samples
        rto.measured(1ms, Transmissions::once);
    CHECK(rto.rto() == 1ms + 1us);
    rto.measured(5ms, Transmissions::once); // rttvar |1 - 5| / 4 = 1 ms, srtt (7 + 5) / 8 = 1.5 ms
    CHECK(rto.rto() == 5500us);
}

TEST_CASE("rto: clamped to the floor and the ceiling") {
    RtoEstimator rto;
    rto.measured(10us, Transmissions::once); // 10 + 4 * 5 = 30 us
    CHECK(rto.rto() == 500us);
    rto.measured(-5us, Transmissions::once); // a clock mix-up counts as 0
    CHECK(rto.rto() == 500us);
    RtoEstimator slow;
    slow.measured(1s, Transmissions::once); // 1 s + 2 s
    CHECK(slow.rto() == 2s);
    RtoEstimator custom(RtoConfig{.initial = 5ms, .floor = 2ms, .ceiling = 8ms, .granularity = 1us, .max_timeouts = 3});
    custom.measured(100us, Transmissions::once);
    CHECK(custom.rto() == 2ms);
    custom.measured(20ms, Transmissions::once);
    CHECK(custom.rto() == 8ms);
}

TEST_CASE("rto: a timeout doubles it up to the ceiling; the next sample resets it") {
    RtoEstimator rto;
    rto.measured(1ms, Transmissions::once);
    CHECK(rto.rto() == 3ms);
    CHECK(rto.timed_out(1) == OnTimeout::retransmit);
    CHECK(rto.rto() == 6ms);
    CHECK(rto.timed_out(2) == OnTimeout::retransmit);
    CHECK(rto.rto() == 12ms);
    for (std::uint32_t t = 3; t <= 7; ++t)
        CHECK(rto.timed_out(t) == OnTimeout::retransmit);
    CHECK(rto.rto() == 384ms);
    RtoEstimator capped;
    for (int i = 0; i < 7; ++i) // 50 ms doubled 6 times is 3.2 s
        CHECK(capped.timed_out(1) == OnTimeout::retransmit);
    CHECK(capped.rto() == 2s);
    rto.measured(1ms, Transmissions::once); // srtt 1 ms, rttvar 375 us: no backoff left
    CHECK(rto.rto() == 2500us);
}

TEST_CASE("rto: backed_off doubles the RTO per step up to the ceiling, and leaves the RTO as it is") {
    RtoEstimator rto;
    rto.measured(1ms, Transmissions::once);
    CHECK(rto.backed_off(0) == 3ms);
    CHECK(rto.backed_off(1) == 6ms);
    CHECK(rto.backed_off(3) == 24ms);
    CHECK(rto.backed_off(9) == 1536ms);
    CHECK(rto.backed_off(10) == 2s);
    CHECK(rto.backed_off(UINT32_MAX) == 2s);
    CHECK(rto.rto() == 3ms);
}

TEST_CASE("rto: the max_timeouts-th timeout of a request gives up") {
    RtoEstimator rto;
    for (std::uint32_t t = 1; t < 8; ++t)
        CHECK(rto.timed_out(t) == OnTimeout::retransmit);
    const auto before = rto.rto();
    CHECK(rto.timed_out(8) == OnTimeout::give_up);
    CHECK(rto.rto() == before);
    RtoEstimator once(RtoConfig{.max_timeouts = 1});
    CHECK(once.timed_out(1) == OnTimeout::give_up);
    CHECK(once.rto() == 50ms);
}

TEST_CASE("rto: Karn's rule: a retransmitted request's round trip is no sample") {
    RtoEstimator rto;
    rto.measured(100ms, Transmissions::retransmitted);
    CHECK(rto.rto() == 50ms);
    rto.measured(1ms, Transmissions::once);
    CHECK(rto.timed_out(1) == OnTimeout::retransmit);
    CHECK(rto.rto() == 6ms);
    rto.measured(1ms, Transmissions::retransmitted); // the backoff stays
    CHECK(rto.rto() == 6ms);
    rto.measured(1ms, Transmissions::once);
    CHECK(rto.rto() == 2500us);
}

TEST_CASE("rto: a configuration it cannot honour is a programming error") {
    RDMAXX_CHECK_DEATH((void)RtoEstimator(RtoConfig{.floor = 0ns}), "floor 0 ns");
    RDMAXX_CHECK_DEATH((void)RtoEstimator(RtoConfig{.floor = 3s}), "floor 3000000000 ns, ceiling 2000000000 ns");
    RDMAXX_CHECK_DEATH((void)RtoEstimator(RtoConfig{.initial = 100us}), "initial 100000 ns outside");
    RDMAXX_CHECK_DEATH((void)RtoEstimator(RtoConfig{.granularity = -1ns}), "granularity -1 ns");
    RDMAXX_CHECK_DEATH((void)RtoEstimator(RtoConfig{.max_timeouts = 0}), "max_timeouts 0");
}
