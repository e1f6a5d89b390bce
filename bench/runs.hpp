// The measurements: what the client times and what the server does meanwhile, one
// run (one size) at a time, as perftest runs them. The hot loops post through
// rdmaxx's data layer and poll its CQs: no allocation, lock or log inside them.
#pragma once

#include <cstdint>
#include <variant>

#include "side.hpp"
#include "stats.hpp"

namespace rdmaxx::perf {

using Figures = std::variant<Latency, Bandwidth>;

// Client: one run of `size` bytes x `iters`, both sides' data checked afterwards.
Result<Figures> run_client(Side& side, std::uint32_t size, std::uint32_t iters);
// Client: tells the server the runs are over.
Result<void> finish_client(Side& side);
// Server: serves the client's runs until it says finish; how many runs it served.
Result<std::uint32_t> serve(Side& side);

} // namespace rdmaxx::perf
