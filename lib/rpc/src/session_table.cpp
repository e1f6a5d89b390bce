#include "session_table.hpp"

#include <algorithm>

namespace rdmaxx::rpc::detail {

SessionLimits agree(const SessionLimits& asked, const SessionLimits& most, std::source_location where) {
    const auto asked_fit = check_limits(asked);
    require(asked_fit.has_value(), where, "agree: the limits asked: {}", asked_fit ? "" : asked_fit.error().detail());
    const auto most_fit = check_limits(most);
    require(most_fit.has_value(), where, "agree: the server's maxima: {}", most_fit ? "" : most_fit.error().detail());
    const std::uint32_t payload = std::min(asked.payload_per_packet, most.payload_per_packet);
    // at most 266,338,304 (max_packets packets of 4064 bytes): fits
    const auto largest = static_cast<std::uint32_t>(std::uint64_t{max_packets} * payload);
    return {.window = std::min(asked.window, most.window),
            .credits = std::min(asked.credits, most.credits),
            .max_request = std::min({asked.max_request, most.max_request, largest}),
            .max_response = std::min({asked.max_response, most.max_response, largest}),
            .payload_per_packet = payload};
}

} // namespace rdmaxx::rpc::detail
