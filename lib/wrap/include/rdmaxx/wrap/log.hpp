// rdmaxx logs through one spdlog logger. By default it writes warnings and worse to
// stderr; an application replaces it with its own logger (sinks, level, pattern) or
// silences it. The data path (post, poll) never logs.
#pragma once

#include <memory>

#include <spdlog/logger.h>

namespace rdmaxx {

// The library's logger; never null.
std::shared_ptr<spdlog::logger> logger();

// Replaces the library's logger; nullptr installs a logger with no sinks (silence).
// Programming errors are still printed to stderr when the logger would drop them:
// an abort must never be unexplained.
void set_logger(std::shared_ptr<spdlog::logger> replacement);

} // namespace rdmaxx
