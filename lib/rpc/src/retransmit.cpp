#include "retransmit.hpp"

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
