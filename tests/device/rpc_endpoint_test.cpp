// lib/rpc's endpoint on a real device: a server and a client endpoint of one process on
// one io_context, sessions set up over TCP on loopback, calls of every size from empty
// to many packets, every error a call can end with provoked, at-most-once execution
// counted.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/rpc/endpoint.hpp>

#include "../support/device.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

using namespace rdmaxx;
using namespace std::chrono_literals;
using rdmaxx::test::must;

namespace {

constexpr std::uint8_t echo = 1, drop_it = 2, hold_it = 3, unknown = 9;

std::uint16_t next_port() {
    static std::uint16_t port = 31850;
    return port++;
}

// Message n: n % 251 repeated, then its length's low byte: any size, checkable.
std::vector<std::byte> message(std::uint32_t n, std::size_t size) {
    std::vector<std::byte> bytes(size, static_cast<std::byte>(n % 251));
    if (size > 0)
        bytes.back() = static_cast<std::byte>(size);
    return bytes;
}

// Runs `work` on `io` until it finishes, within `limit` (the endpoints keep run() busy).
void run(asio::io_context& io, asio::awaitable<void> work, std::chrono::seconds limit) {
    bool done = false;
    asio::co_spawn(io, std::move(work), [&done](std::exception_ptr e) {
        done = true;
        if (e)
            std::rethrow_exception(e);
    });
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done && std::chrono::steady_clock::now() < deadline)
        io.run_for(10ms);
    REQUIRE(done);
}

// Runs `io` for `span` (what is in flight moves on).
void spin(asio::io_context& io, std::chrono::milliseconds span) {
    const auto deadline = std::chrono::steady_clock::now() + span;
    while (std::chrono::steady_clock::now() < deadline)
        io.run_for(5ms);
}

struct Rig {
    asio::io_context io;
    std::unique_ptr<rpc::Endpoint> server;
    std::unique_ptr<rpc::Endpoint> client;
    std::vector<rpc::Responder> held; // hold_it's requests, unanswered
    std::uint16_t port = next_port();

    explicit Rig(rpc::EndpointOptions server_options = {}, rpc::EndpointOptions client_options = {}) {
        server_options.listen_port = port;
        server_options.listen_address = "127.0.0.1";
        server = must(rpc::Endpoint::create(io, server_options));
        client = must(rpc::Endpoint::create(io, client_options));
        server->set_handler(echo, [](rpc::Request request, rpc::Responder responder) {
            responder.respond(request.bytes());
        });
        server->set_handler(drop_it, [](rpc::Request, rpc::Responder) {});
        server->set_handler(hold_it, [this](rpc::Request, rpc::Responder responder) {
            held.push_back(std::move(responder));
        });
    }
    ~Rig() { held.clear(); }
};

asio::awaitable<void> connect_into(Rig* rig, std::optional<rpc::Session>* out) {
    auto session = co_await rig->client->connect("127.0.0.1", rig->port);
    REQUIRE_MESSAGE(session.has_value(), session.error().message());
    out->emplace(std::move(*session));
}

// `calls` echo calls of sizes from 0 to 4 packets and a bit, checked byte for byte.
asio::awaitable<void> echo_calls(rpc::Session* session, std::uint32_t first, std::uint32_t calls,
                                 std::size_t max_size, int* wrong) {
    std::vector<std::byte> response(max_size);
    for (std::uint32_t n = first; n < first + calls; ++n) {
        const auto request = message(n, (n * 7919u) % (max_size + 1));
        const Result<std::size_t> got = co_await session->call(echo, request, response, {.timeout = 20s});
        if (!got) {
            MESSAGE(got.error().message());
            ++*wrong;
            continue;
        }
        if (*got != request.size() || std::memcmp(response.data(), request.data(), request.size()) != 0)
            ++*wrong;
    }
}

asio::awaitable<void> echo_many(Rig* rig, std::optional<rpc::Session>* session, int* wrong) {
    co_await connect_into(rig, session);
    const std::size_t max_size = 4 * rig->client->mtu() + 17;
    // 12 coroutines on one session with a window of 8: some calls wait for a slot
    std::vector<bool> done(12, false);
    int finished = 0;
    for (std::uint32_t c = 0; c < 12; ++c)
        asio::co_spawn(rig->io, echo_calls(&**session, c * 100, 100, max_size, wrong),
                       [&finished](std::exception_ptr) { ++finished; });
    asio::steady_timer timer(rig->io);
    while (finished < 12) {
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
}

} // namespace

TEST_CASE("rpc endpoint: 1,200 echo calls of 0 to 4 MTUs, 12 coroutines on one session, each handled once") {
    Rig rig;
    std::optional<rpc::Session> session;
    int wrong = 0;
    run(rig.io, echo_many(&rig, &session, &wrong), 120s);
    CHECK(wrong == 0);
    const auto& c = rig.client->counters();
    const auto& s = rig.server->counters();
    CHECK(c.calls == 1200);
    CHECK(c.completed == 1200);
    CHECK(c.failed == 0);
    CHECK(s.handled == 1200); // at most once, whatever was retransmitted
    CHECK(session->info().window == 8);
    MESSAGE("client: retransmissions ", c.retransmissions, ", drops ", c.dropped(), ", send stalls ",
            c.send_stalls, "; server drops ", s.dropped());
    CHECK(rig.server->sessions() == 1);
    session.reset();
    spin(rig.io, 200ms);
    CHECK(rig.server->sessions() == 0); // the client's end reached the server through TCP
}

namespace {

struct Outcomes {
    std::optional<Error> no_handler, truncated, too_large, dropped, timed_out, cancelled, reset;
    std::size_t after_errors = 0;
};

asio::awaitable<void> provoke(Rig* rig, std::optional<rpc::Session>* session, Outcomes* out) {
    co_await connect_into(rig, session);
    rpc::Session& s = **session;
    const auto request = message(1, 100);
    std::vector<std::byte> response(4096), small(50);
    auto got = co_await s.call(unknown, request, response);
    if (!got)
        out->no_handler = got.error();
    got = co_await s.call(echo, request, small);
    if (!got)
        out->truncated = got.error();
    const auto big = message(2, s.info().max_request + 1);
    got = co_await s.call(echo, big, response);
    if (!got)
        out->too_large = got.error();
    got = co_await s.call(drop_it, request, response);
    if (!got)
        out->dropped = got.error();
    got = co_await s.call(hold_it, request, response, {.timeout = 300ms});
    if (!got)
        out->timed_out = got.error();
    // the late answer: dropped by the client (its call is gone), never copied
    std::ranges::fill(response, std::byte{0x5a});
    rig->held.back().respond(request);
    asio::steady_timer timer(rig->io);
    timer.expires_after(100ms);
    co_await timer.async_wait(asio::use_awaitable);
    CHECK(std::ranges::all_of(response, [](std::byte b) { return b == std::byte{0x5a}; }));

    asio::cancellation_signal cancel;
    std::optional<Result<std::size_t>> cancelled;
    s.call(hold_it, request, response, {.timeout = 10s},
           asio::bind_cancellation_slot(cancel.slot(), [&cancelled](Result<std::size_t> r) { cancelled = std::move(r); }));
    timer.expires_after(50ms);
    co_await timer.async_wait(asio::use_awaitable);
    cancel.emit(asio::cancellation_type::terminal);
    while (!cancelled) {
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
    if (!*cancelled)
        out->cancelled = cancelled->error();

    got = co_await s.call(echo, request, response);
    out->after_errors = got ? *got : 0;

    std::optional<Result<std::size_t>> reset;
    s.call(hold_it, request, response, {.timeout = 10s},
           [&reset](Result<std::size_t> r) { reset = std::move(r); });
    timer.expires_after(50ms);
    co_await timer.async_wait(asio::use_awaitable);
    session->reset(); // ends its calls
    while (!reset) {
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
    if (!*reset)
        out->reset = reset->error();
}

} // namespace

TEST_CASE("rpc endpoint: every way a call can fail, and the session works on after each") {
    Rig rig({}, {.max_request = 4096});
    std::optional<rpc::Session> session;
    Outcomes out;
    run(rig.io, provoke(&rig, &session, &out), 60s);
    REQUIRE(out.no_handler);
    CHECK(out.no_handler->is_errno(ENOENT));
    REQUIRE(out.truncated);
    CHECK(out.truncated->is_errno(ENOBUFS));
    REQUIRE(out.too_large);
    CHECK(out.too_large->is_errno(EMSGSIZE));
    REQUIRE(out.dropped);
    CHECK(out.dropped->is_errno(EPIPE));
    REQUIRE(out.timed_out);
    CHECK(out.timed_out->is_timeout());
    REQUIRE(out.cancelled);
    CHECK(out.cancelled->is_cancelled());
    CHECK(out.after_errors == 100);
    REQUIRE(out.reset);
    CHECK(out.reset->is_errno(ECONNRESET));
    const auto& c = rig.client->counters();
    std::size_t stale = 0;
    while (rpc::drop_reason_name(stale) != "stale request")
        ++stale;
    MESSAGE("client drops: ", c.dropped(), " (stale request ", c.drops[stale], ")");
    CHECK(c.drops[stale] >= 1); // the late answer to the timed-out call
}

TEST_CASE("rpc endpoint: a call from another thread aborts naming the caller") {
    rdmaxx::test::check_death(
        [] {
            asio::io_context io;
            auto endpoint = must(rpc::Endpoint::create(io, {}));
            std::thread other([&] { endpoint->set_handler(echo, {}); });
            other.join();
        },
        "another thread", "rpc_endpoint_test.cpp");
}
