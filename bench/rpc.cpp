#include "rpc.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <string>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <rdmaxx/async/task.hpp>
#include <rdmaxx/wrap/context.hpp>

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::perf {
namespace {

constexpr std::uint8_t echo = 1;
constexpr std::uint8_t sink = 2; // answers empty (--one-way)
// The server waits this long for its first session (Side's accept_wait).
constexpr std::chrono::seconds first_session_wait{120};
// Receive buffers of an endpoint, at most (each holds a packet of the MTU).
constexpr std::uint32_t most_ring = 8192;

async::DriveOptions drive(AsyncMode mode) {
    switch (mode) {
    case AsyncMode::event: return {.mode = async::CompletionMode::event};
    case AsyncMode::hybrid: return {.mode = async::CompletionMode::hybrid};
    default: return {.mode = async::CompletionMode::busy};
    }
}

// The client asks for its window and twice as many packets in flight (at least 32), the
// server agrees to any client's. The client's ring holds twice its sessions' credits
// (at least 1024 buffers, lib/rpc's default): with exactly as many as the credits it
// reserves, answers arrive before their buffers are posted again and are lost (a 64 KiB
// call took 6 s on rxe instead of 90 ms).
rpc::EndpointOptions endpoint_options(const Options& o, bool server) {
    rpc::EndpointOptions e{.device = o.device, .port = o.ib_port, .gid_index = o.gid_index};
    e.window = server ? rpc_max_window : o.window;
    e.credits = std::clamp(2 * o.window, 32u, most_ring / o.sessions);
    e.ring = server ? most_ring : std::min(most_ring, std::max(1024u, 2 * e.credits * o.sessions));
    e.send_depth = 1024;
    e.max_sessions = server ? rpc_max_sessions : o.sessions;
    e.max_request = e.max_response = rpc_max_size;
    e.drive = drive(o.async);
    e.setup_timeout = o.timeout;
    if (o.rdma_threshold)
        e.rdma_threshold = *o.rdma_threshold;
    e.lend_through_windows = o.windows && !server;
    if (server) {
        e.listen_port = o.port;
        e.credits = most_ring / rpc_max_sessions;
    }
    return e;
}

// Runs `io` until `done()`, which the handler that makes it true follows with io.stop().
// run(), not a loop of run_one(): run_one() sets up the thread's call stack and handler
// memory cache per handler, a cost per call that a program's own run() does not have.
template <class Done>
void run_until(asio::io_context& io, Done done) {
    while (!done()) {
        io.restart();
        io.run();
    }
}

// A caller's request: a pattern of its size, its call number in front (up to 4 bytes).
void number(std::span<std::byte> request, std::uint32_t n) {
    std::memcpy(request.data(), &n, std::min(request.size(), sizeof n));
}

// A caller's registered buffers: calls with them copy no request and no large response.
struct CallerBuffers {
    rpc::MessageBuffer request, response;
};

// One way: a response buffer of 1 byte (a larger one would be offered to the server).
Result<std::vector<CallerBuffers>> allocate(rpc::Endpoint& endpoint, std::uint32_t size, bool one_way,
                                            std::uint32_t callers) {
    std::vector<CallerBuffers> all;
    const std::size_t capacity = std::max(size, 1u);
    for (std::uint32_t c = 0; c < callers; ++c) {
        auto request = endpoint.alloc_buffer(capacity, rpc::BufferUse::request);
        if (!request)
            return std::unexpected(std::move(request.error()));
        auto response = endpoint.alloc_buffer(one_way ? 1 : capacity, rpc::BufferUse::response);
        if (!response)
            return std::unexpected(std::move(response.error()));
        request->resize(size);
        all.push_back({std::move(*request), std::move(*response)});
    }
    return all;
}

struct Run {
    Run(asio::io_context& io, std::uint32_t size, bool one_way, std::chrono::milliseconds timeout,
        std::uint32_t callers, std::span<Clock::time_point> stamps = {})
        : io(&io), size(size), one_way(one_way), timeout(timeout), stamps(stamps), callers_left(callers) {}
    asio::io_context* io; // stopped by the last caller (run_until)
    std::uint32_t size;
    bool one_way;
    std::chrono::milliseconds timeout;
    std::span<Clock::time_point> stamps; // latency: one per call's start, and one after the last
    std::uint32_t callers_left;
    Clock::time_point end;
    std::optional<Error> error;
};

// A caller's request: a pattern of its size and id.
void fill(rpc::MessageBuffer& request, std::uint32_t id, std::uint32_t size) {
    const auto pattern = request.bytes();
    for (std::size_t i = 0; i < pattern.size(); ++i)
        pattern[i] = static_cast<std::byte>((i * 7 + id * 13 + size) & 0xff);
}

// Call `n` is about to start: its number in the request, its start stamped (latency).
void starting(Run& run, std::uint32_t n, rpc::MessageBuffer& request) {
    number(request.bytes(), n); // bytes() anew: a call that timed out may renew the memory
    if (!run.stamps.empty())
        run.stamps[n] = Clock::now();
}

// Call `n` ended with `got`: its response's size and number checked (an Error in the run
// if wrong).
void check(Run& run, std::uint32_t n, const Result<std::size_t>& got, rpc::MessageBuffer& request,
           rpc::MessageBuffer& response) {
    const std::size_t expected = run.one_way ? 0 : run.size;
    if (!got) {
        run.error = got.error();
    } else if (*got != expected || std::memcmp(response.bytes().data(), request.bytes().data(),
                                               std::min<std::size_t>(*got, sizeof n)) != 0) {
        run.error = Error::protocol(
            "peer", fmt::format("call {}: a {}-byte response, not the {} bytes its call expects", n, *got, expected));
    }
}

// A caller made its `calls` calls: the last response's bytes checked (echo), and the
// last caller stops the io_context.
void caller_done(Run& run, std::uint32_t calls, std::uint32_t id, rpc::MessageBuffer& request,
                 rpc::MessageBuffer& response) {
    if (!run.stamps.empty())
        run.stamps[calls] = Clock::now();
    if (calls > 0 && !run.error && !run.one_way && !std::ranges::equal(response.bytes(), request.bytes()))
        run.error = Error::protocol("peer", fmt::format("caller {}: wrong bytes in its last response", id));
    if (--run.callers_left == 0) {
        run.end = Clock::now();
        run.io->stop();
    }
}

// `calls` calls, one after the other, each awaited by this coroutine: an
// asio::awaitable (Token: use_awaitable) or an rdmaxx::async::Task (use_task).
template <class Coroutine, class Token>
Coroutine caller(rpc::Session* session, CallerBuffers* buffers, std::uint32_t calls, std::uint32_t id, Run* run,
                 Token token) {
    fill(buffers->request, id, run->size);
    for (std::uint32_t n = 0; n < calls && !run->error; ++n) {
        starting(*run, n, buffers->request);
        const auto got = co_await session->call(run->one_way ? sink : echo, buffers->request, buffers->response,
                                                {.timeout = run->timeout}, token);
        check(*run, n, got, buffers->request, buffers->response);
    }
    caller_done(*run, calls, id, buffers->request, buffers->response);
}

// The same calls in lib/rpc's callback form (--callbacks): each call's completion checks
// it and makes the next call. Lives until the run ends (it is the completions' target).
class CallbackCaller {
public:
    CallbackCaller(rpc::Session* session, CallerBuffers* buffers, std::uint32_t calls, std::uint32_t id, Run* run)
        : session_(session), buffers_(buffers), calls_(calls), id_(id), run_(run) {
        fill(buffers->request, id, run->size);
    }
    CallbackCaller(const CallbackCaller&) = delete;
    CallbackCaller& operator=(const CallbackCaller&) = delete;

    void next() {
        if (n_ == calls_ || run_->error)
            return caller_done(*run_, calls_, id_, buffers_->request, buffers_->response);
        starting(*run_, n_, buffers_->request);
        session_->call(run_->one_way ? sink : echo, buffers_->request, buffers_->response, {.timeout = run_->timeout},
                       [this](Result<std::size_t> got) {
                           check(*run_, n_, got, buffers_->request, buffers_->response);
                           ++n_;
                           next();
                       });
    }

private:
    rpc::Session* session_;
    CallerBuffers* buffers_;
    std::uint32_t calls_, id_;
    Run* run_;
    std::uint32_t n_ = 0;
};

// Starts caller `id`: a coroutine of `form`, or a CallbackCaller kept in `kept`.
void start_caller(asio::io_context& io, CallForm form, rpc::Session& session, CallerBuffers& buffers,
                  std::uint32_t calls, std::uint32_t id, Run& run, std::deque<CallbackCaller>& kept) {
    switch (form) {
    case CallForm::callback: kept.emplace_back(&session, &buffers, calls, id, &run).next(); return;
    case CallForm::task:
        async::spawn(io.get_executor(),
                     caller<async::Task<void>>(&session, &buffers, calls, id, &run, async::use_task));
        return;
    case CallForm::awaitable:
        asio::co_spawn(io, caller<asio::awaitable<void>>(&session, &buffers, calls, id, &run, asio::use_awaitable),
                       asio::detached);
        return;
    }
}

asio::awaitable<void> connect_all(asio::io_context* io, rpc::Endpoint* endpoint, const Options* o,
                                  std::vector<rpc::Session>* sessions, std::optional<Error>* error, bool* done) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const auto deadline = Clock::now() + o->timeout;
    while (sessions->size() < o->sessions) {
        auto session = co_await endpoint->connect(o->host, o->port);
        if (session) {
            sessions->push_back(std::move(*session));
        } else if (session.error().is_errno(ECONNREFUSED) && Clock::now() < deadline) {
            timer.expires_after(std::chrono::milliseconds(20)); // the server is starting
            co_await timer.async_wait(asio::use_awaitable);
        } else {
            *error = session.error();
            break;
        }
    }
    *done = true;
    io->stop();
}

// Every 20 ms, off the call path: stops `io` once a client has come and every session is
// gone, or when none came within first_session_wait (`no_client`).
asio::awaitable<void> stop_when_served(asio::io_context* io, rpc::Endpoint* endpoint, bool* no_client,
                                       bool* ended) {
    asio::steady_timer timer(*io);
    const auto first_deadline = Clock::now() + first_session_wait;
    bool served = false;
    while (!served || endpoint->sessions() > 0) {
        timer.expires_after(std::chrono::milliseconds(20));
        co_await timer.async_wait(asio::use_awaitable);
        served = served || endpoint->sessions() > 0;
        if (!served && Clock::now() > first_deadline) {
            *no_client = true;
            break;
        }
    }
    *ended = true;
    io->stop();
}

} // namespace

RpcSide::RpcSide(Options options, std::unique_ptr<asio::io_context> io, std::unique_ptr<rpc::Endpoint> endpoint)
    : options_(std::move(options)), io_(std::move(io)), endpoint_(std::move(endpoint)) {
    setup_ = {.test = options_.test, .device = options_.device, .mtu_bytes = endpoint_->mtu(),
              .async = options_.async, .window = options_.window, .sessions = options_.sessions,
              .one_way = options_.one_way, .form = options_.form};
    if (auto context = Context::open(options_.device))
        setup_.device = std::string(context->name());
}

Result<RpcSide> RpcSide::connect(const Options& options) {
    auto io = std::make_unique<asio::io_context>(1);
    auto endpoint = rpc::Endpoint::create(*io, endpoint_options(options, false));
    if (!endpoint)
        return std::unexpected(std::move(endpoint.error()));
    RpcSide side(options, std::move(io), std::move(*endpoint));
    std::optional<Error> error;
    bool done = false;
    asio::co_spawn(*side.io_,
                   connect_all(side.io_.get(), side.endpoint_.get(), &side.options_, &side.sessions_, &error, &done),
                   asio::detached);
    run_until(*side.io_, [&done] { return done; });
    if (error)
        return std::unexpected(std::move(*error));
    return side;
}

Result<RpcSide> RpcSide::accept(const Options& options) {
    auto io = std::make_unique<asio::io_context>(1);
    auto endpoint = rpc::Endpoint::create(*io, endpoint_options(options, true));
    if (!endpoint)
        return std::unexpected(std::move(endpoint.error()));
    (*endpoint)->set_handler(echo, [](rpc::Request request, rpc::Responder responder) {
        responder.respond(request.bytes());
    });
    (*endpoint)->set_handler(sink, [](rpc::Request, rpc::Responder responder) { responder.respond({}); });
    return RpcSide(options, std::move(io), std::move(*endpoint));
}

Result<Figures> run_client(RpcSide& side, std::uint32_t size, std::uint32_t iters) {
    const Options& o = side.options_;
    const bool latency = o.test.measure == Measure::latency;
    auto buffers = allocate(*side.endpoint_, size, o.one_way, o.sessions * o.window);
    if (!buffers)
        return std::unexpected(std::move(buffers.error()));
    // warm up: the RTO estimate, Asio's handler memory, the sessions' buffers
    std::deque<CallbackCaller> kept; // callbacks: the callers of both runs, till the end
    Run warm(*side.io_, size, o.one_way, o.timeout, o.sessions);
    for (std::uint32_t s = 0; s < o.sessions; ++s)
        start_caller(*side.io_, o.form, side.sessions_[s], (*buffers)[s * o.window],
                     std::clamp(iters / 10, 5u, 200u), s, warm, kept);
    run_until(*side.io_, [&warm] { return warm.callers_left == 0; });
    if (warm.error)
        return std::unexpected(std::move(*warm.error));

    std::vector<Clock::time_point> stamps(latency ? iters + 1 : 0);
    Run run(*side.io_, size, o.one_way, o.timeout, o.sessions * o.window, stamps);
    const std::uint64_t retransmitted = side.endpoint_->counters().retransmissions;
    const auto cpu = cpu_time();
    const auto start = Clock::now();
    for (std::uint32_t s = 0; s < o.sessions; ++s)
        for (std::uint32_t w = 0; w < o.window; ++w) {
            const std::uint32_t share = iters / o.window + (w < iters % o.window ? 1 : 0);
            start_caller(*side.io_, o.form, side.sessions_[s], (*buffers)[s * o.window + w], share,
                         s * o.window + w, run, kept);
        }
    run_until(*side.io_, [&run] { return run.callers_left == 0; });
    const auto used = cpu_time() - cpu;
    if (run.error)
        return std::unexpected(std::move(*run.error));
    const std::uint64_t calls = std::uint64_t{iters} * o.sessions;
    const double cpu_us = std::chrono::duration<double, std::micro>(used).count() / static_cast<double>(calls);
    const std::uint64_t again = side.endpoint_->counters().retransmissions - retransmitted;
    if (latency) {
        Latency figures = summarize_latency(stamps, 1);
        figures.cpu_us_per_op = cpu_us;
        figures.retransmissions = again;
        return figures;
    }
    Bandwidth figures = bandwidth(size, calls, run.end - start);
    figures.cpu_us_per_op = cpu_us;
    figures.retransmissions = again;
    return figures;
}

Result<void> finish_client(RpcSide& side) {
    side.sessions_.clear();
    // the sessions' TCP connections close: run the io_context a moment to let them go
    side.io_->run_for(std::chrono::milliseconds(10));
    return {};
}

Result<std::uint32_t> serve(RpcSide& side) {
    bool no_client = false, ended = false;
    asio::co_spawn(*side.io_, stop_when_served(side.io_.get(), side.endpoint_.get(), &no_client, &ended),
                   asio::detached);
    run_until(*side.io_, [&ended] { return ended; });
    if (no_client)
        return std::unexpected(
            Error::timeout("peer", fmt::format("no client within {} s", first_session_wait.count())));
    return static_cast<std::uint32_t>(side.endpoint_->counters().handled);
}

} // namespace rdmaxx::perf
