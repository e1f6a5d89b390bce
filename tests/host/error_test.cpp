#include <cerrno>
#include <cstring>
#include <sstream>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <infiniband/verbs.h>
#include <spdlog/sinks/ostream_sink.h>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/log.hpp>

#include "../support/check.hpp"

using rdmaxx::Error;

TEST_CASE("an errno Error names the call, the reason and the detail") {
    const Error e = Error::from_errno("ibv_create_qp", ENOMEM, "max_send_wr 100000");
    CHECK(e.kind() == Error::Kind::system);
    CHECK(e.code() == ENOMEM);
    CHECK(e.is_errno(ENOMEM));
    CHECK(std::string_view(e.call()) == "ibv_create_qp");
    CHECK(e.message() == fmt::format("ibv_create_qp: {} (errno {}): max_send_wr 100000", std::strerror(ENOMEM), ENOMEM));
    CHECK(fmt::format("{}", e) == e.message());
    // format specs apply to the message as to any string
    const Error short_one = Error::timeout("x");
    CHECK(fmt::format("[{:>40}]", short_one) == fmt::format("[{:>40}]", short_one.message()));
    CHECK(fmt::format("[{:>40}]", short_one).size() == 42);
}

TEST_CASE("Result is a std::expected that must not be ignored") {
    static_assert(std::is_base_of_v<std::expected<int, Error>, rdmaxx::Result<int>>);
    const rdmaxx::Result<int> value = 7;
    const rdmaxx::Result<int> failed = std::unexpected(Error::timeout("x"));
    const std::expected<int, Error>& as_expected = failed;
    CHECK(*value == 7);
    CHECK(as_expected.error().is_timeout());
    const rdmaxx::Result<void> converted = std::expected<void, Error>{};
    CHECK(converted.has_value());
}

TEST_CASE("from_last_errno reads errno, and never reports success") {
    errno = EACCES;
    CHECK(Error::from_last_errno("ibv_reg_mr").code() == EACCES);
    errno = 0;
    CHECK(Error::from_last_errno("ibv_reg_mr").code() == EIO);
}

namespace {
// A detail argument whose formatting changes errno, as an allocation may.
struct ClobbersErrno {};
} // namespace
template <>
struct fmt::formatter<ClobbersErrno> : fmt::formatter<std::string_view> {
    auto format(ClobbersErrno, format_context& ctx) const {
        errno = ENOMEM;
        return fmt::formatter<std::string_view>::format("clobbered", ctx);
    }
};

TEST_CASE("from_last_errno reads errno before it formats the detail") {
    errno = EACCES;
    const Error e = Error::from_last_errno("ibv_reg_mr", "{} bytes, {}", 4096, ClobbersErrno{});
    CHECK(e.code() == EACCES);
    CHECK(e.detail() == "4096 bytes, clobbered");
}

TEST_CASE("a completion Error carries the ibv_wc_status and its text") {
    const Error e = Error::completion(IBV_WC_REM_ACCESS_ERR, "RDMA WRITE wr_id 7");
    CHECK(e.kind() == Error::Kind::completion);
    CHECK(e.code() == IBV_WC_REM_ACCESS_ERR);
    CHECK(e.message().find(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)) != std::string::npos);
    CHECK(e.message().find("RDMA WRITE wr_id 7") != std::string::npos);
}

TEST_CASE("timeout, protocol, unsupported and cancelled Errors say what they are") {
    CHECK(Error::timeout("wait_event").is_timeout());
    CHECK(Error::timeout("wait_event").code() == ETIMEDOUT);
    CHECK(Error::protocol("parse", "short").message() == "parse: protocol: short");
    CHECK(Error::unsupported("mlx5dv", "not mlx5").kind() == Error::Kind::unsupported);
    CHECK(rdmaxx::to_string(Error::Kind::completion) == "completion");
    CHECK(Error::cancelled("async_read").is_cancelled());
    CHECK(Error::cancelled("async_read").code() == ECANCELED);
    CHECK(Error::cancelled("async_read", "flushed").message() == "async_read: cancelled: flushed");
}

TEST_CASE("a programming error aborts naming the caller's file") {
    RDMAXX_CHECK_DEATH(rdmaxx::require(false, std::source_location::current(), "bad {}", 42), "bad 42");
}

TEST_CASE("a silenced logger still explains a programming error on stderr") {
    RDMAXX_CHECK_DEATH(
        {
            rdmaxx::set_logger(nullptr);
            rdmaxx::require(1 + 1 == 3, std::source_location::current(), "arithmetic");
        },
        "arithmetic");
}

TEST_CASE("an application logger receives the library's messages") {
    std::ostringstream out;
    auto previous = rdmaxx::logger();
    rdmaxx::set_logger(std::make_shared<spdlog::logger>("app", std::make_shared<spdlog::sinks::ostream_sink_st>(out)));
    rdmaxx::logger()->warn("hello {}", 1);
    rdmaxx::set_logger(previous);
    CHECK(out.str().find("hello 1") != std::string::npos);
}

namespace {

// The library's log, each line as `pattern` makes it, while this lives.
class LogLines {
public:
    explicit LogLines(const char* pattern) {
        auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out_);
        sink->set_pattern(pattern);
        rdmaxx::set_logger(std::make_shared<spdlog::logger>("app", sink));
    }
    LogLines(const LogLines&) = delete;
    LogLines& operator=(const LogLines&) = delete;
    ~LogLines() { rdmaxx::set_logger(previous_); }
    std::string text() const { return out_.str(); }

private:
    std::shared_ptr<spdlog::logger> previous_ = rdmaxx::logger();
    std::ostringstream out_;
};

} // namespace

TEST_CASE("a LogBudget lets a burst of warnings a second go, holds back the rest, and says how many before the next") {
    const LogLines out("%v");
    rdmaxx::detail::LogBudget budget(3);
    const std::chrono::steady_clock::time_point t0{std::chrono::hours(1)};
    for (int client = 0; client < 1000; ++client) // a flood within one second
        budget.warn(t0 + std::chrono::microseconds(client * 900), "refused client {}", client);
    CHECK(budget.held_back() == 997);
    budget.warn(t0 + std::chrono::seconds(1), "refused client {}", 1000); // the next second
    CHECK(budget.held_back() == 0);
    CHECK(out.text() == "refused client 0\nrefused client 1\nrefused client 2\n"
                       "rdmaxx: 997 messages like the next held back\nrefused client 1000\n");
}

TEST_CASE("a LogBudget's errors share its warnings' budget and keep their level") {
    const LogLines out("%l %v");
    rdmaxx::detail::LogBudget budget(2);
    const std::chrono::steady_clock::time_point t0{std::chrono::hours(1)};
    budget.warn(t0, "sent {}", 1);
    budget.error(t0, "failed {}", 2);
    budget.error(t0, "failed {}", 3); // the third in the second
    budget.error(t0 + std::chrono::seconds(1), "failed {}", 4);
    CHECK(out.text() == "warning sent 1\nerror failed 2\nerror rdmaxx: 1 messages like the next held back\n"
                       "error failed 4\n");
}

TEST_CASE("a LogBudget under no flood holds nothing back") {
    rdmaxx::detail::LogBudget budget(2);
    const std::chrono::steady_clock::time_point t0{std::chrono::hours(1)};
    for (int i = 0; i < 100; ++i)
        CHECK(budget.take(t0 + std::chrono::milliseconds(500 * i))); // two a second: the burst
    CHECK(budget.held_back() == 0);
    CHECK_FALSE(budget.take(t0 + std::chrono::milliseconds(500 * 99 + 1))); // a third in that second
    CHECK(budget.held_back() == 1);
}
