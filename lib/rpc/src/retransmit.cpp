#include "retransmit.hpp"

#include <algorithm>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::rpc::detail {

using std::chrono::nanoseconds;

RtoEstimator::RtoEstimator(const RtoConfig& config, std::source_location where)
    : config_(config), rto_(config.initial) {
    require(config.floor > nanoseconds(0) && config.floor <= config.ceiling, where,
            "RtoConfig: floor {} ns, ceiling {} ns", config.floor.count(), config.ceiling.count());
    require(config.initial >= config.floor && config.initial <= config.ceiling, where,
            "RtoConfig: initial {} ns outside [{}, {}] ns", config.initial.count(), config.floor.count(),
            config.ceiling.count());
    require(config.granularity >= nanoseconds(0), where, "RtoConfig: granularity {} ns",
            config.granularity.count());
    require(config.max_timeouts > 0, where, "RtoConfig: max_timeouts 0");
}

void RtoEstimator::measured(nanoseconds round_trip, Transmissions sent) noexcept {
    if (sent != Transmissions::once)
        return;
    const nanoseconds r = std::max(round_trip, nanoseconds(0));
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

OnTimeout RtoEstimator::timed_out(std::uint32_t timeouts) noexcept {
    if (timeouts >= config_.max_timeouts)
        return OnTimeout::give_up;
    rto_ = rto_ > config_.ceiling / 2 ? config_.ceiling : 2 * rto_;
    return OnTimeout::retransmit;
}

std::chrono::nanoseconds RtoEstimator::backed_off(std::uint32_t doublings) const noexcept {
    nanoseconds wait = rto_;
    for (std::uint32_t i = 0; i < doublings && wait < config_.ceiling; ++i)
        wait = wait > config_.ceiling / 2 ? config_.ceiling : 2 * wait;
    return wait;
}

} // namespace rdmaxx::rpc::detail
