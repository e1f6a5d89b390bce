#include <rdmaxx/rpc/congestion.hpp>

#include <algorithm>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::rpc {

Aimd::Aimd(AimdOptions options, std::source_location where) : options_(options), window_(options.initial) {
    require(options.least > 0 && options.least <= options.initial && options.initial <= options.most, where,
            "Aimd: least {}, initial {}, most {}: need 0 < least <= initial <= most", options.least, options.initial,
            options.most);
}

void Aimd::answered(std::optional<std::chrono::nanoseconds> round_trip) noexcept {
    if (round_trip && options_.high_rtt.count() > 0 && *round_trip > options_.high_rtt)
        shrink();
    if (++answers_ < window_)
        return;
    answers_ = 0;
    if (!shrunk_this_window_)
        window_ = std::min(options_.most, window_ + 1);
    shrunk_this_window_ = false;
}

void Aimd::timed_out() noexcept { shrink(); }

void Aimd::shrink() noexcept {
    if (shrunk_this_window_)
        return;
    window_ = std::max(options_.least, window_ / 2);
    shrunk_this_window_ = true;
    answers_ = 0;
}

} // namespace rdmaxx::rpc
