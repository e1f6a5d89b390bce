// rdmaxx-perf: perftest's latency and bandwidth tests (ib_write_lat, ib_write_bw, ...)
// measured the way perftest measures them, on rdmaxx's own layers, so that the two
// compare figure for figure, and lib/rpc's calls beside them (rpc_lat, rpc_bw: rpc.hpp).
// `rdmaxx-perf TEST` serves, `rdmaxx-perf TEST HOST` runs; see usage() in options.cpp.
#include <cstdio>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "options.hpp"
#include "report.hpp"
#include "rpc.hpp"
#include "runs.hpp"
#include "side.hpp"

using namespace rdmaxx;
using namespace rdmaxx::perf;

namespace {

int fail(const Error& error) {
    fmt::print(stderr, "rdmaxx-perf: {}\n", error);
    return 1;
}

// S: Side (the device's tests, runs.hpp) or RpcSide (lib/rpc's, rpc.hpp).
template <class S>
int client(const Options& options) {
    auto side = S::connect(options);
    if (!side)
        return fail(side.error());
    const Setup& setup = side->setup();
    // a progress line on long sweeps, for people watching a terminal
    const bool progress = options.sizes.size() > 1 && isatty(STDOUT_FILENO);
    if (!options.json)
        fmt::print("{}", table_head(setup));
    std::size_t done = 0;
    for (const std::uint32_t size : options.sizes) {
        if (progress)
            fmt::print("\r[{}/{}] {} B x {}...", ++done, options.sizes.size(), size, options.iters), std::fflush(stdout);
        auto figures = run_client(*side, size, options.iters);
        if (progress)
            fmt::print("\r\033[K");
        if (!figures)
            return fail(figures.error());
        if (const auto* l = std::get_if<Latency>(&*figures))
            fmt::print("{}", options.json ? latency_json(setup, size, options.iters, *l)
                                          : latency_row(size, options.iters, *l));
        else {
            const auto& b = std::get<Bandwidth>(*figures);
            // perftest's column counts one QP's iterations; the JSON every message
            const std::uint64_t messages = std::uint64_t{options.iters} * options.qps * options.sessions;
            fmt::print("{}", options.json ? bandwidth_json(setup, size, messages, b) : bandwidth_row(size, options.iters, b));
        }
        std::fflush(stdout);
    }
    if (!options.json)
        fmt::print("---------------------------------------------------------------------------------------\n");
    if (auto ok = finish_client(*side); !ok)
        return fail(ok.error());
    return 0;
}

template <class S>
int server(const Options& options) {
    auto side = S::accept(options);
    if (!side)
        return fail(side.error());
    auto served = serve(*side);
    if (!served)
        return fail(served.error());
    fmt::print(stderr, "rdmaxx-perf: served {} {} of {} on {}\n", *served,
               options.test.verb == Verb::rpc ? "call(s)" : "run(s)", test_name(options.test), side->setup().device);
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    const std::vector<std::string_view> args(argv + 1, argv + argc);
    auto options = parse_options(args);
    if (!options) {
        fmt::print(stderr, "rdmaxx-perf: {}\n{}", options.error(), usage());
        return 2;
    }
    if (options->help) {
        fmt::print("{}", usage());
        return 0;
    }
    if (options->test.verb == Verb::rpc)
        return options->host.empty() ? server<RpcSide>(*options) : client<RpcSide>(*options);
    return options->host.empty() ? server<Side>(*options) : client<Side>(*options);
}
