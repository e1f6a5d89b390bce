/// @file
/// rdmaxx logs through one spdlog logger. By default it writes warnings and worse to
/// stderr; an application replaces it with its own logger (sinks, level, pattern) or
/// silences it. The data path (post, poll) never logs.
#pragma once

#include <memory>

#include <spdlog/logger.h>

namespace rdmaxx {

/// The library's logger; never null.
///
/// @threadsafety Safe from any thread, also while another thread calls set_logger():
/// the logger is held in an atomic shared_ptr, and a caller keeps the one it got alive.
std::shared_ptr<spdlog::logger> logger();

/// Replaces the library's logger; nullptr installs a logger with no sinks (silence).
/// Programming errors are still printed to stderr when the logger would drop them:
/// an abort must never be unexplained.
///
/// @threadsafety Safe from any thread (as logger()).
void set_logger(std::shared_ptr<spdlog::logger> replacement);

} // namespace rdmaxx
