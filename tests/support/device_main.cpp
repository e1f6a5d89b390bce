// main() of the device suite. Without an RDMA device it skips (exit 77, meson's
// "skipped"): run it in the VM with scripts/vm/run.sh. After the tests it checks
// that the process left no QP, CQ, MR or PD behind on the device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "device.hpp"

namespace rdmaxx::test {

std::vector<std::string> leftover_resources() {
    std::vector<std::string> lines;
    const std::string own = fmt::format(" pid {} ", ::getpid());
    for (const char* kind : {"qp", "cq", "mr", "pd"}) {
        const std::string command = fmt::format("rdma res show {} 2>&1", kind);
        std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), &::pclose);
        if (!pipe) {
            lines.push_back(fmt::format("cannot run '{}'", command));
            continue;
        }
        char line[1024];
        while (std::fgets(line, sizeof line, pipe.get()))
            if (std::string text = line; (text + " ").find(own) != std::string::npos)
                lines.push_back(kind + std::string(": ") + text);
    }
    return lines;
}

namespace {

// Counts what the library logs at error level: a destroy that failed inside a
// destructor can only be logged, and must still fail the suite.
std::atomic<int> logged_errors{0};

class ErrorCounter final : public spdlog::sinks::base_sink<std::mutex> {
    void sink_it_(const spdlog::details::log_msg& msg) override {
        if (msg.level >= spdlog::level::err)
            ++logged_errors;
    }
    void flush_() override {}
};

} // namespace
} // namespace rdmaxx::test

int main(int argc, char** argv) {
    auto devices = rdmaxx::list_devices();
    if (!devices || devices->empty()) {
        std::printf("no RDMA device: device suite skipped (run it with scripts/vm/run.sh)\n");
        return 77;
    }
    if (auto opened = rdmaxx::Context::open())
        std::printf("device suite on %s\n", opened->name().c_str());
    rdmaxx::set_logger(std::make_shared<spdlog::logger>(
        "rdmaxx", spdlog::sinks_init_list{std::make_shared<spdlog::sinks::stderr_color_sink_mt>(),
                                          std::make_shared<rdmaxx::test::ErrorCounter>()}));
    doctest::Context context(argc, argv);
    const int rc = context.run();
    if (context.shouldExit())
        return rc;
    const auto leaks = rdmaxx::test::leftover_resources();
    for (const auto& line : leaks)
        std::printf("LEAK %s", line.c_str());
    const int errors = rdmaxx::test::logged_errors.load();
    if (errors != 0)
        std::printf("FAILED: rdmaxx logged %d error(s) during the suite\n", errors);
    return rc != 0 ? rc : leaks.empty() && errors == 0 ? 0 : 1;
}
