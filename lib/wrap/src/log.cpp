#include <rdmaxx/wrap/log.hpp>

#include <atomic>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace rdmaxx {
namespace {

std::shared_ptr<spdlog::logger> make_default() {
    auto log = std::make_shared<spdlog::logger>(
        "rdmaxx", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    log->set_level(spdlog::level::warn);
    return log;
}

// atomic: set_logger may race with logging from another thread
std::atomic<std::shared_ptr<spdlog::logger>>& slot() {
    static std::atomic<std::shared_ptr<spdlog::logger>> current{make_default()};
    return current;
}

} // namespace

std::shared_ptr<spdlog::logger> logger() { return slot().load(); }

void set_logger(std::shared_ptr<spdlog::logger> replacement) {
    if (!replacement)
        replacement = std::make_shared<spdlog::logger>("rdmaxx");
    slot().store(std::move(replacement));
}

} // namespace rdmaxx
