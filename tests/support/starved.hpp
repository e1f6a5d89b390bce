// What the tests of listeners out of file descriptors and of floods of warnings share:
// the library's log captured (its warnings counted, also per second), and the
// process's descriptor limit lowered to what it has open, each put back however the
// test ends.
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>

#include <sys/resource.h>

#include <doctest/doctest.h>

#include <spdlog/logger.h>
#include <spdlog/sinks/ostream_sink.h>

#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx::test {

// rdmaxx's logger writes here while this lives.
class CapturedLog {
public:
    CapturedLog() {
        auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
        sink->set_pattern("%E %l %v"); // each line's second (since the epoch), its level, its text
        rdmaxx::set_logger(std::make_shared<spdlog::logger>("test", sink));
    }
    CapturedLog(const CapturedLog&) = delete;
    CapturedLog& operator=(const CapturedLog&) = delete;
    ~CapturedLog() { rdmaxx::set_logger(was_); }

    std::string text() const { return log_.str(); }
    // How many times `what` was said.
    std::size_t count(std::string_view what) const {
        const std::string said = log_.str();
        std::size_t n = 0;
        for (auto at = said.find(what); at != std::string::npos; at = said.find(what, at + 1))
            ++n;
        return n;
    }
    // The most lines saying `what` within one second of the clock (a budget's second,
    // LogBudget, may straddle two of them).
    std::size_t most_in_a_second(std::string_view what) const {
        std::map<long, std::size_t> per_second;
        std::size_t most = 0;
        std::istringstream lines(log_.str());
        for (std::string line; std::getline(lines, line);)
            if (line.find(what) != std::string::npos)
                most = std::max(most, ++per_second[std::stol(line)]);
        return most;
    }

private:
    std::shared_ptr<spdlog::logger> was_ = rdmaxx::logger();
    std::ostringstream log_;
};

// While this lives, the process opens no descriptor more (EMFILE): RLIMIT_NOFILE is
// what it has open.
class NoMoreFiles {
public:
    NoMoreFiles() {
        REQUIRE(getrlimit(RLIMIT_NOFILE, &was_) == 0);
        rlimit files = was_;
        // the directory iterator's own descriptor is among those it counts
        files.rlim_cur = static_cast<rlim_t>(std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {}) - 1);
        REQUIRE(setrlimit(RLIMIT_NOFILE, &files) == 0);
    }
    NoMoreFiles(const NoMoreFiles&) = delete;
    NoMoreFiles& operator=(const NoMoreFiles&) = delete;
    ~NoMoreFiles() { setrlimit(RLIMIT_NOFILE, &was_); }

private:
    rlimit was_{};
};

} // namespace rdmaxx::test
