// When to retransmit: a session's retransmission timeout (RTO), after RFC 6298.
//
//   first sample r:  srtt = r, rttvar = r / 2
//   next samples:    rttvar = 3/4 rttvar + 1/4 |srtt - r|, then srtt = 7/8 srtt + 1/8 r
//   rto = clamp(srtt + max(granularity, 4 rttvar), floor, ceiling)
//
// A timeout doubles the RTO (capped at the ceiling) until the next sample sets it from
// srtt and rttvar again. Karn's rule: a round trip measured on a request any of whose
// packets was retransmitted is ambiguous (which transmission does the answer belong
// to?), so it is no sample: the caller says how the request went (Transmissions) and
// such a sample is ignored.
//
// The retry cap: the caller counts the consecutive timeouts of each request (reset when
// the request makes progress) and passes the count to timed_out(), which answers
// retransmit or give_up; on give_up the caller must fail the call.
//
// Time is whatever the caller measured (integer nanoseconds, no clock read here).
// Thread safety: distinct objects: safe; shared: unsafe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <source_location>

namespace rdmaxx::rpc::detail {

struct RtoConfig {
    // Before the first sample. Covers an emulated device (soft RoCE in a VM: round trips
    // of milliseconds) without a spurious first retransmission.
    std::chrono::nanoseconds initial = std::chrono::milliseconds(50);
    // Hardware round trips are microseconds, but a busy server thread answers later: a
    // floor well above them keeps the RTO from firing on a scheduling hiccup.
    std::chrono::nanoseconds floor = std::chrono::microseconds(500);
    std::chrono::nanoseconds ceiling = std::chrono::seconds(2);
    // RFC 6298's G: the least variance allowed for (rttvar reaches 0 on a steady path).
    std::chrono::nanoseconds granularity = std::chrono::microseconds(1);
    // The timeout of one request that fails it: the 8th in a row by default (7
    // retransmissions; with the defaults above at least 127.5 ms, at most ~7 s).
    std::uint32_t max_timeouts = 8;
};

// Whether the request's packets went once, or some more than once (Karn's rule).
enum class Transmissions : std::uint8_t { once, retransmitted };

// What to do about a request whose RTO expired.
enum class OnTimeout : std::uint8_t { retransmit, give_up };

class RtoEstimator {
public:
    // Programming error: floor 0, floor > ceiling, initial outside [floor, ceiling],
    // granularity negative, max_timeouts 0.
    explicit RtoEstimator(const RtoConfig& config = {}, std::source_location where = std::source_location::current());

    // The current RTO: how long to wait for an answer before retransmitting.
    std::chrono::nanoseconds rto() const noexcept { return rto_; }

    // A round trip measured on a request that went `sent`; ignored unless once. A
    // negative round trip (a caller's clock mix-up) counts as 0. Here, inlined: a
    // call's answer takes a sample.
    [[gnu::always_inline]] void measured(std::chrono::nanoseconds round_trip, Transmissions sent) noexcept {
        if (sent != Transmissions::once)
            return;
        const std::chrono::nanoseconds r = std::max(round_trip, std::chrono::nanoseconds(0));
        if (!sampled_) {
            srtt_ = r;
            rttvar_ = r / 2;
            sampled_ = true;
        } else {
            rttvar_ = (3 * rttvar_ + (srtt_ > r ? srtt_ - r : r - srtt_)) / 4;
            srtt_ = (7 * srtt_ + r) / 8;
        }
        rto_ = std::clamp(srtt_ + std::max(config_.granularity, 4 * rttvar_), config_.floor, config_.ceiling);
    }

    // A request's RTO expired; `timeouts` counts this one (1 at the first timeout since
    // the request last made progress). retransmit: the RTO has doubled (capped), resend;
    // give_up: this was the max_timeouts-th, fail the call (the RTO is left as it is).
    OnTimeout timed_out(std::uint32_t timeouts) noexcept;

    // The RTO doubled `doublings` times, capped at the ceiling, without changing it: how
    // long a caller waits before asking again about a request that is in progress, the
    // `doublings`-th time in a row it was told so (a long handler is asked less and less
    // often; its response comes when it is ready anyway).
    std::chrono::nanoseconds backed_off(std::uint32_t doublings) const noexcept;

private:
    RtoConfig config_;
    std::chrono::nanoseconds srtt_{0};
    std::chrono::nanoseconds rttvar_{0};
    std::chrono::nanoseconds rto_;
    bool sampled_ = false;
};

} // namespace rdmaxx::rpc::detail
