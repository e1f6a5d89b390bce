// Test helpers shared by the host and device suites.
#pragma once

#include <csignal>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::test {

// The value of a Result that must succeed; otherwise the test fails with the Error.
template <class T>
T must(Result<T> result) {
    if (!result)
        FAIL(result.error().message());
    if constexpr (!std::is_void_v<T>)
        return std::move(*result);
}

// The Error of a Result that must fail.
template <class T>
Error must_fail(Result<T> result) {
    if (result)
        FAIL("expected an Error, the call succeeded");
    return std::move(result.error());
}

// Runs `body` in a child process and checks that it aborts (a programming error)
// after writing a message that contains `expected` and names `caller_file`, the
// test's own source file: the abort must point at the user's call site.
inline void check_death(const std::function<void()>& body, std::string_view expected,
                        std::string_view caller_file) {
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        // the test framework's own crash handler must not report the expected abort
        std::signal(SIGABRT, SIG_DFL);
        ::dup2(pipe_fds[1], STDOUT_FILENO);
        ::dup2(pipe_fds[1], STDERR_FILENO);
        ::close(pipe_fds[0]);
        body();
        ::_exit(0); // survived: the parent reports it
    }
    ::close(pipe_fds[1]);
    std::string output;
    char buffer[4096];
    for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
        output.append(buffer, static_cast<std::size_t>(n));
    ::close(pipe_fds[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("child output: ", output);
    REQUIRE_MESSAGE(WIFSIGNALED(status), "the child did not abort");
    CHECK(WTERMSIG(status) == SIGABRT);
    CHECK(output.find("programming error") != std::string::npos);
    CHECK(output.find(expected) != std::string::npos);
    const auto slash = caller_file.rfind('/');
    CHECK(output.find(caller_file.substr(slash == std::string_view::npos ? 0 : slash + 1)) != std::string::npos);
}

// Runs `body` in a child process, whose device objects (and what a failure leaks) go
// with it, and checks that it exits with 0: `body` returns a bit per failed check.
inline void check_in_child(const std::function<int()>& body) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        std::signal(SIGABRT, SIG_DFL); // an abort is the parent's to report
        ::_exit(body());
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE_MESSAGE(WIFEXITED(status), "the child died of signal ", WTERMSIG(status));
    CHECK(WEXITSTATUS(status) == 0);
}

// Checks that `result` failed with an Error of kind protocol whose message says `what`.
template <class T>
void check_protocol_error(Result<T> result, std::string_view what) {
    const Error e = must_fail(std::move(result));
    INFO(e.message());
    CHECK(e.kind() == Error::Kind::protocol);
    CHECK(e.message().find(what) != std::string::npos);
}

#define RDMAXX_CHECK_DEATH(body, expected) ::rdmaxx::test::check_death([&] { body; }, expected, __FILE__)

} // namespace rdmaxx::test
