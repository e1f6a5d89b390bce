// rdmaxx-rpc-perf: lib/rpc's round-trip latency and call rate, to set beside perftest's
// ib_send_lat / ib_send_bw (-c UD) in the same VM run. Two processes, like perftest:
//
//   rdmaxx-rpc-perf --serve [--once] [-p PORT] [-d DEVICE]
//   rdmaxx-rpc-perf HOST [-p PORT] [-d DEVICE] [-s SIZE] [-n CALLS] [-w WINDOW] [--event]
//
// The client makes CALLS echo calls of SIZE bytes each way on one session: with -w 1
// one at a time (latency: min, median, p99 of the round trips, in microseconds), with
// -w W from W coroutines at once (the rate: calls per second and goodput). The server
// answers from its handler at once. --once: the server exits when its session ends.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <rdmaxx/rpc/endpoint.hpp>

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

using namespace rdmaxx;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint8_t echo = 1;

struct Args {
    bool serve = false, once = false, event = false;
    std::string host, device;
    std::uint16_t port = 31860;
    std::uint32_t size = 32, calls = 10000, window = 1;
};

int usage() {
    std::fputs("usage: rdmaxx-rpc-perf --serve [--once] [-p PORT] [-d DEVICE]\n"
               "       rdmaxx-rpc-perf HOST [-p PORT] [-d DEVICE] [-s SIZE] [-n CALLS] [-w WINDOW] [--event]\n",
               stderr);
    return 2;
}

bool parse(int argc, char** argv, Args& a) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
        const auto number = [&](auto& out) {
            const char* v = value();
            if (v == nullptr || std::atoll(v) <= 0)
                return false;
            out = static_cast<std::remove_reference_t<decltype(out)>>(std::atoll(v));
            return true;
        };
        if (arg == "--serve")
            a.serve = true;
        else if (arg == "--once")
            a.once = true;
        else if (arg == "--event")
            a.event = true;
        else if (arg == "-p") {
            if (!number(a.port))
                return false;
        } else if (arg == "-s") {
            if (!number(a.size))
                return false;
        } else if (arg == "-n") {
            if (!number(a.calls))
                return false;
        } else if (arg == "-w") {
            if (!number(a.window))
                return false;
        } else if (arg == "-d") {
            const char* v = value();
            if (v == nullptr)
                return false;
            a.device = v;
        } else if (!arg.empty() && arg[0] != '-' && a.host.empty())
            a.host = arg;
        else
            return false;
    }
    return a.serve != !a.host.empty();
}

rpc::EndpointOptions endpoint_options(const Args& a) {
    rpc::EndpointOptions o;
    o.device = a.device;
    o.window = std::max<std::uint32_t>(8, a.window);
    o.credits = std::max<std::uint32_t>(32, 2 * a.window);
    o.ring = 4096;
    o.send_depth = 512;
    o.max_request = o.max_response = std::max<std::uint32_t>(a.size, 4096);
    if (a.event)
        o.drive.mode = async::CompletionMode::event;
    else
        o.drive.mode = async::CompletionMode::busy;
    return o;
}

struct Run {
    std::vector<double> round_trips_us; // latency runs
    std::uint32_t failed = 0, finished = 0;
    Clock::time_point start, end;
};

asio::awaitable<void> caller(rpc::Session* session, std::uint32_t calls, std::uint32_t size, Run* run,
                             bool timed) {
    std::vector<std::byte> request(size, std::byte{0x42}), response(size);
    for (std::uint32_t i = 0; i < calls; ++i) {
        const auto t0 = Clock::now();
        const auto got = co_await session->call(echo, request, response, {.timeout = std::chrono::seconds(10)});
        if (!got || *got != size)
            ++run->failed;
        else if (timed)
            run->round_trips_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    ++run->finished;
}

asio::awaitable<void> client(rpc::Endpoint* endpoint, Args a, Run* run, bool* done) {
    auto session = co_await endpoint->connect(a.host, a.port);
    if (!session) {
        fmt::print(stderr, "rdmaxx-rpc-perf: {}\n", session.error());
        run->failed = 1;
        *done = true;
        co_return;
    }
    const auto executor = co_await asio::this_coro::executor;
    // warm up: the RTO estimate, Asio's handler memory, the session's buffers
    Run warm;
    co_await caller(&*session, 200, a.size, &warm, false);
    run->start = Clock::now();
    const bool timed = a.window == 1;
    for (std::uint32_t c = 0; c < a.window; ++c)
        asio::co_spawn(executor, caller(&*session, a.calls / a.window, a.size, run, timed), asio::detached);
    asio::steady_timer timer(executor);
    while (run->finished < a.window) {
        timer.expires_after(std::chrono::microseconds(200));
        co_await timer.async_wait(asio::use_awaitable);
    }
    run->end = Clock::now();
    *done = true;
}

double percentile(std::vector<double>& v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

} // namespace

int main(int argc, char** argv) {
    Args a;
    if (!parse(argc, argv, a))
        return usage();
    asio::io_context io;
    rpc::EndpointOptions options = endpoint_options(a);
    if (a.serve) {
        options.listen_port = a.port;
        auto server = rpc::Endpoint::create(io, options);
        if (!server) {
            fmt::print(stderr, "rdmaxx-rpc-perf: {}\n", server.error());
            return 1;
        }
        (*server)->set_handler(echo, [](rpc::Request request, rpc::Responder responder) {
            responder.respond(request.bytes());
        });
        bool served = false;
        for (;;) {
            io.run_for(std::chrono::milliseconds(100));
            served = served || (*server)->sessions() > 0;
            if (a.once && served && (*server)->sessions() == 0)
                return 0;
        }
    }
    auto endpoint = rpc::Endpoint::create(io, options);
    if (!endpoint) {
        fmt::print(stderr, "rdmaxx-rpc-perf: {}\n", endpoint.error());
        return 1;
    }
    Run run;
    bool done = false;
    asio::co_spawn(io, client(endpoint->get(), a, &run, &done), asio::detached);
    while (!done)
        io.run_for(std::chrono::milliseconds(10));
    if (run.failed != 0) {
        fmt::print(stderr, "rdmaxx-rpc-perf: {} calls failed\n", run.failed);
        return 1;
    }
    const double seconds = std::chrono::duration<double>(run.end - run.start).count();
    const std::uint64_t calls = std::uint64_t{a.calls / a.window} * a.window;
    const auto& c = (*endpoint)->counters();
    if (a.window == 1)
        fmt::print("rpc_lat size {} calls {} min_us {:.2f} median_us {:.2f} p99_us {:.2f} retransmissions {}\n",
                   a.size, calls, percentile(run.round_trips_us, 0.0), percentile(run.round_trips_us, 0.5),
                   percentile(run.round_trips_us, 0.99), c.retransmissions);
    else
        fmt::print("rpc_bw size {} calls {} window {} mcalls_per_s {:.4f} goodput_MBps {:.2f} retransmissions {}\n",
                   a.size, calls, a.window, static_cast<double>(calls) / seconds / 1e6,
                   static_cast<double>(calls) * a.size / seconds / 1e6, c.retransmissions);
    return 0;
}
