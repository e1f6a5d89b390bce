// rdmaxx::async::Task and use_task on an io_context, with Asio's own operations (no
// device: lib/rpc's calls through use_task are the device suite's).
#include <rdmaxx/async/task.hpp>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <doctest/doctest.h>

namespace async = rdmaxx::async;
using namespace std::chrono_literals;

namespace {

// Counts its destruction: tells which frames were destroyed, and when.
struct Witness {
    std::vector<std::string>* log;
    std::string name;
    ~Witness() { log->push_back("~" + name); }
};

async::Task<int> twice(asio::io_context& io, int value, std::vector<std::string>* log) {
    Witness w{log, "twice"};
    co_await asio::post(io.get_executor(), async::use_task); // suspends: resumed by io's handler
    log->push_back("twice resumed");
    co_return 2 * value;
}

async::Task<void> sum(asio::io_context& io, int* out, std::vector<std::string>* log) {
    Witness w{log, "sum"};
    const int a = co_await twice(io, 1, log);
    const int b = co_await twice(io, 20, log);
    *out = a + b;
    log->push_back("sum done");
}

async::Task<int> ready(int value) { co_return value; }

async::Task<void> many(int n, long* total) {
    for (int i = 0; i < n; ++i)
        *total += co_await ready(i); // each returns at once: symmetric transfer, no stack growth
}

async::Task<void> wait_forever(asio::steady_timer& timer, std::vector<std::string>* log) {
    Witness w{log, "child"};
    timer.expires_after(1h);
    co_await timer.async_wait(async::use_task);
    log->push_back("child resumed");
}

async::Task<void> parent(asio::steady_timer& timer, std::vector<std::string>* log) {
    Witness w{log, "parent"};
    co_await wait_forever(timer, log);
    log->push_back("parent resumed");
}

} // namespace

TEST_CASE("task: spawned, it runs on its executor, awaits tasks and operations, and its frame goes when it ends") {
    asio::io_context io;
    std::vector<std::string> log;
    int out = 0;
    async::spawn(io.get_executor(), sum(io, &out, &log));
    CHECK(log.empty()); // posted, not run inside spawn()
    io.run();
    CHECK(out == 42);
    CHECK(log == std::vector<std::string>{"twice resumed", "~twice", "twice resumed", "~twice", "sum done", "~sum"});
}

TEST_CASE("task: an operation's arguments are the co_await's value: one as it is, several as a tuple, none void") {
    asio::io_context io;
    asio::steady_timer timer(io);
    std::error_code waited = std::make_error_code(std::errc::io_error);
    std::tuple<int, std::string> both;
    bool posted = false;
    auto run = [&]() -> async::Task<void> {
        timer.expires_after(1ms);
        waited = co_await timer.async_wait(async::use_task);
        both = co_await asio::async_initiate<const async::use_task_t, void(int, std::string)>(
            [&io](auto handler) {
                asio::post(io, [h = std::move(handler)]() mutable { std::move(h)(7, std::string("seven")); });
            },
            async::use_task);
        co_await asio::post(io.get_executor(), async::use_task);
        posted = true;
    };
    async::spawn(io.get_executor(), run());
    io.run();
    CHECK_FALSE(waited);
    CHECK(both == std::tuple<int, std::string>{7, "seven"});
    CHECK(posted);
}

TEST_CASE("task: 100,000 awaits of tasks that return at once take no stack") {
    asio::io_context io;
    long total = 0;
    async::spawn(io.get_executor(), many(100'000, &total)); // ~10 MB of stack if each nested
    io.run();
    CHECK(total == 4'999'950'000L);
}

TEST_CASE("task: destroyed with its io_context while an operation is pending, the chain's frames go, innermost first") {
    std::vector<std::string> log;
    {
        asio::io_context io;
        asio::steady_timer timer(io);
        async::spawn(io.get_executor(), parent(timer, &log));
        io.run_for(10ms); // the timer is pending: nothing to resume
        CHECK(log.empty());
        // the timer's handler (destroyed with the timer's pending wait) destroys the chain
    }
    CHECK(log == std::vector<std::string>{"~child", "~parent"});
}

TEST_CASE("task: spawned but never started (its io_context destroyed first), its frame goes") {
    std::vector<std::string> log;
    int out = 0;
    {
        asio::io_context io;
        async::spawn(io.get_executor(), sum(io, &out, &log));
    }
    CHECK(log.empty()); // its body never ran: no Witness was made, and the frame is freed (ASan: no leak)
    CHECK(out == 0);
}
