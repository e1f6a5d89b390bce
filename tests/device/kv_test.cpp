// examples/kv's mirror listener (PORT + 1) against readers that misbehave, on a real
// device: the kv server runs as its own process (RDMAXX_KV, built with the examples).
// A reader that asks the server for memory is refused; readers that come and go are
// forgotten (the server's descriptors come back to where they were); at most 16
// readers at once, one more closed as it comes; a reader after all that gets the mirror.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/async/connection.hpp>

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

extern char** environ;

using namespace rdmaxx;
using namespace std::chrono_literals;

namespace {

constexpr std::uint16_t kv_port = 18950; // the mirror on 18951
constexpr std::size_t max_readers = 16;  // examples/kv/main.cpp's
constexpr std::uint64_t mirror_bytes = 16384ull * 312; // its mirror_slots * slot_bytes

// The kv server, SIGINT at the end (its graceful shutdown: exit status 0).
struct KvServer {
    pid_t pid = -1;
    KvServer() {
        const std::string port = std::to_string(kv_port);
        std::vector<std::string> args = {RDMAXX_KV, "--serve", "-p", port};
        std::vector<char*> argv;
        for (std::string& arg : args)
            argv.push_back(arg.data());
        argv.push_back(nullptr);
        REQUIRE(::posix_spawn(&pid, RDMAXX_KV, nullptr, nullptr, argv.data(), environ) == 0);
    }
    ~KvServer() {
        ::kill(pid, SIGINT);
        int status = 0;
        ::waitpid(pid, &status, 0);
    }
    std::size_t descriptors() const {
        const auto fds = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd");
        return static_cast<std::size_t>(std::distance(begin(fds), end(fds)));
    }
};

ConnectionOptions reader_options() {
    ConnectionOptions o;
    o.timeout = 10s;
    o.receive_depth = 16;
    return o;
}

asio::awaitable<void> pause(std::chrono::milliseconds span) {
    asio::steady_timer timer(co_await asio::this_coro::executor, span);
    co_await timer.async_wait(asio::use_awaitable);
}

// A reader that took the mirror's lease, or the Error of its connect or lease.
asio::awaitable<Result<async::Connection>> reader() {
    auto c = co_await async::Connection::connect(co_await asio::this_coro::executor, "127.0.0.1", kv_port + 1,
                                                 reader_options());
    if (!c)
        co_return c;
    auto mirror = co_await c->receive_remote_mr();
    if (!mirror)
        co_return std::unexpected(std::move(mirror.error()));
    if (mirror->memory.length != mirror_bytes || mirror->access != Access::remote_read)
        co_return std::unexpected(Error::protocol("kv_test", "a mirror of the wrong size or rights"));
    co_return c;
}

struct Seen {
    bool first_reader = false;
    std::optional<Error> asked_for_memory; // request_remote_mr's answer
    std::size_t descriptors_before = 0, descriptors_after = 0; // around 40 readers that come and go
    std::size_t served_at_once = 0, closed_at_once = 0;        // of 24 readers at once
    bool reader_after = false;
    bool done = false;
};

asio::awaitable<void> misbehave(const KvServer* server, Seen* out) {
    std::optional<Result<async::Connection>> first;
    for (int attempt = 0; attempt < 100 && !(first && *first); ++attempt) { // until the server listens
        first = co_await reader();
        if (!*first)
            co_await pause(200ms);
    }
    REQUIRE_MESSAGE(*first, (*first ? "" : first->error().message()));
    out->first_reader = true;
    // the listener grants nothing: no rights, no quota
    auto asked = co_await (*first)->request_remote_mr(1 << 20, Access::remote_write);
    if (!asked)
        out->asked_for_memory = asked.error();
    else
        MESSAGE("the server granted ", asked->memory.length, " bytes");
    co_await pause(500ms);
    out->descriptors_before = server->descriptors();
    for (int n = 0; n < 40; ++n) {
        auto r = co_await reader();
        REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
        const auto closed = co_await r->close();
        CHECK_MESSAGE(closed, (closed ? "" : closed.error().message()));
    }
    for (int waited = 0; waited < 100 && server->descriptors() > out->descriptors_before; ++waited)
        co_await pause(100ms);
    out->descriptors_after = server->descriptors();
    // the first reader and 23 more at once: 16 served, the others closed
    std::vector<async::Connection> held;
    held.push_back(std::move(**first));
    for (int n = 0; n < 23; ++n) {
        auto r = co_await reader();
        if (r)
            held.push_back(std::move(*r));
        else
            ++out->closed_at_once;
    }
    out->served_at_once = held.size();
    for (async::Connection& c : held) {
        const auto closed = co_await c.close();
        CHECK_MESSAGE(closed, (closed ? "" : closed.error().message()));
    }
    held.clear();
    co_await pause(500ms);
    const auto after = co_await reader();
    out->reader_after = after.has_value();
    out->done = true;
}

} // namespace

TEST_CASE("kv's mirror refuses a reader's request for memory, forgets readers that leave and serves 16 at once") {
    KvServer server;
    asio::io_context io;
    Seen out;
    asio::co_spawn(io, misbehave(&server, &out), [](std::exception_ptr e) {
        if (e)
            std::rethrow_exception(e);
    });
    io.run_for(180s);
    REQUIRE(out.done);
    CHECK(out.first_reader);
    REQUIRE(out.asked_for_memory);
    CHECK_MESSAGE(out.asked_for_memory->is_errno(EACCES), out.asked_for_memory->message());
    MESSAGE("the server's descriptors: ", out.descriptors_before, " before 40 readers came and went, ",
            out.descriptors_after, " after");
    CHECK(out.descriptors_after <= out.descriptors_before);
    CHECK(out.served_at_once == max_readers);
    CHECK(out.closed_at_once == 24 - max_readers);
    CHECK(out.reader_after);
}
