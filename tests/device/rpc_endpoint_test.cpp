// lib/rpc's endpoint on a real device: a server and a client endpoint of one process on
// one io_context, sessions set up over TCP on loopback, calls of every size from empty
// to many packets, every error a call can end with provoked, at-most-once execution
// counted.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <future>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/async/blocking.hpp>
#include <rdmaxx/async/connection.hpp>
#include <rdmaxx/async/task.hpp>
#include <rdmaxx/rpc/endpoint.hpp>
#include <rdmaxx/wrap/qp.hpp>

#include "../support/allocations.hpp"
#include "../support/device.hpp"
#include "../support/no_rdma_objects.hpp"
#include "../support/rpc_attacker.hpp"
#include "../support/rpc_rig.hpp"
#include "../support/starved.hpp"
#include "../support/thread.hpp"
#include "packet.hpp"
#include "rc_codec.hpp"
#include "session_codec.hpp"
#include "test_access.hpp"
#include "ud_transport.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

using namespace rdmaxx;
using namespace std::chrono_literals;
using namespace rdmaxx::rpc_test;
using rdmaxx::test::must;

namespace {

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
        if (*got != request.size() || !echoed(response, request))
            ++*wrong;
    }
}

asio::awaitable<void> echo_many(Rig* rig, std::optional<rpc::Session>* session, int* wrong) {
    co_await connect_into(rig, session);
    const std::size_t max_size = 4 * rig->client->mtu() + 17;
    // 12 coroutines on one session with a window of 8: some calls wait for a slot
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

// AIMD from a window of 2, and what it went through.
struct WatchedAimd final : rpc::CongestionControl {
    rpc::Aimd aimd{{.initial = 2}};
    std::uint64_t* answers;
    std::uint32_t* largest;
    WatchedAimd(std::uint64_t* a, std::uint32_t* l) : answers(a), largest(l) {}
    std::uint32_t window() const noexcept override { return aimd.window(); }
    void answered(std::optional<std::chrono::nanoseconds> round_trip) noexcept override {
        aimd.answered(round_trip);
        ++*answers;
        *largest = std::max(*largest, aimd.window());
    }
    void timed_out() noexcept override { aimd.timed_out(); }
};

} // namespace

TEST_CASE("rpc endpoint: a congestion controller per session bounds its packets and hears its answers") {
    std::uint64_t answers = 0;
    std::uint32_t largest = 0, made = 0;
    rpc::EndpointOptions client_options;
    client_options.congestion = [&answers, &largest, &made]() -> std::unique_ptr<rpc::CongestionControl> {
        ++made;
        return std::make_unique<WatchedAimd>(&answers, &largest);
    };
    Rig rig({}, client_options);
    std::optional<rpc::Session> session;
    int wrong = 0;
    run(rig.io, echo_many(&rig, &session, &wrong), 120s);
    CHECK(wrong == 0);
    const auto& c = rig.client->counters();
    CHECK(c.completed == 1200);
    CHECK(rig.server->counters().handled == 1200);
    CHECK(made == 1);
    // at least one answered packet per call, or a packet of it written off at an RTO:
    // a call whose only packet was written off, answered (by RDMA WRITE_WITH_IMM) before
    // its resend, completes without an answer to count (its packet was counted lost);
    // seen once in CI, 1,199 answers and 1 retransmission
    CHECK(answers + c.retransmissions >= 1200);
    CHECK(largest > 2);     // the window grew from its answers
    CHECK(c.credit_stalls > 0); // 12 callers, a window from 2: packets waited
    MESSAGE("answers ", answers, ", largest window ", largest, ", credit stalls ", c.credit_stalls,
            ", retransmissions ", c.retransmissions);
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

    const auto cancelled = co_await cancelled_call(&s, hold_it, request, response, 50ms);
    if (!cancelled)
        out->cancelled = cancelled.error();

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

namespace {

constexpr std::uint8_t throw_it = 6;

// `rounds` times: a call whose handler throws (it must fail as a dropped Responder's),
// then an echo (it must work).
asio::awaitable<void> throwing_calls(Rig* rig, std::optional<rpc::Session>* session, int rounds, int* wrong) {
    co_await connect_into(rig, session);
    const auto request = message(4, 32);
    std::vector<std::byte> response(64);
    for (int i = 0; i < rounds; ++i) {
        const Result<std::size_t> thrown = co_await (*session)->call(throw_it, request, response, {.timeout = 2s});
        *wrong += !thrown && thrown.error().is_errno(EPIPE) ? 0 : 1;
        const Result<std::size_t> got = co_await (*session)->call(echo, request, response, {.timeout = 2s});
        *wrong += got && *got == request.size() && echoed(response, request) ? 0 : 1;
    }
}

} // namespace

TEST_CASE("rpc endpoint: a handler's exception leaves run(), its call fails as unanswered, and the server serves on") {
    // 200 exceptions on a ring of 64 buffers: each took its packet's buffer with it (and
    // the rest of its batch) when it left through the packet path, and the ring ran dry.
    rpc::EndpointOptions server_options;
    server_options.ring = 64;
    Rig rig(server_options);
    rig.server->set_handler(throw_it, [](rpc::Request, rpc::Responder) {
        throw std::runtime_error("the application's");
    });
    std::optional<rpc::Session> session;
    constexpr int rounds = 200;
    int wrong = 0, thrown = 0;
    run(rig.io, throwing_calls(&rig, &session, rounds, &wrong), 120s, &thrown);
    CHECK(wrong == 0);
    CHECK(thrown == rounds);
}

namespace {

constexpr std::uint8_t keep_then_throw = 12, wait_then_read = 13;

// A handler kept its Request and Responder, then threw: its request was copied out of
// the receive ring as it returned (as for any handler that returns unanswered). 200
// echoes on another session go through the ring of 64 buffers meanwhile; then the kept request is answered with the
// bytes its Request shows.
struct KeptThrown {
    std::vector<rpc::Request> requests;
    std::vector<rpc::Responder> responders;
    int wrong = 0;
    bool echoed_kept = false;
};

asio::awaitable<void> keep_and_throw(Rig* rig, KeptThrown* out) {
    std::optional<rpc::Session> session, echoes; // the kept call holds its session's slot
    co_await connect_into(rig, &session);
    co_await connect_into(rig, &echoes);
    const auto kept = message(6, 200);
    std::vector<std::byte> kept_response(256);
    std::optional<Result<std::size_t>> kept_got;
    session->call(keep_then_throw, kept, kept_response, {.timeout = 30s},
                  [&](Result<std::size_t> got) { kept_got = std::move(got); });
    co_await until([&] { return !out->responders.empty(); });
    for (std::uint32_t i = 0; i < 200; ++i) { // past the ring's 64 buffers, and again
        const auto request = message(100 + i, 200);
        std::vector<std::byte> response(256);
        const Result<std::size_t> got = co_await echoes->call(echo, request, response, {.timeout = 5s});
        out->wrong += got && *got == request.size() && echoed(response, request) ? 0 : 1;
    }
    out->responders.front().respond(out->requests.front().bytes());
    co_await until([&] { return kept_got.has_value(); });
    out->echoed_kept = *kept_got && **kept_got == kept.size() && echoed(kept_response, kept);
}

// A coroutine handler reads its Request after a wait in which its client's Session was
// destroyed (the session ended): it finds nothing. Before, the Request pointed into the
// ended session's freed state.
struct ReadLate {
    std::optional<std::size_t> bytes_after_end; // what bytes() showed after the session ended
    std::size_t bytes_before = 0;
};

} // namespace

TEST_CASE("rpc endpoint: a handler that keeps its Responder and throws has its request kept, not left in the ring") {
    rpc::EndpointOptions server_options;
    server_options.ring = 64;
    Rig rig(server_options);
    KeptThrown out;
    rig.server->set_handler(keep_then_throw, [&out](rpc::Request request, rpc::Responder responder) {
        out.requests.push_back(request);
        out.responders.push_back(std::move(responder));
        throw std::runtime_error("the application's, its Responder kept");
    });
    int thrown = 0;
    run(rig.io, keep_and_throw(&rig, &out), 60s, &thrown);
    CHECK(thrown == 1);
    CHECK(out.wrong == 0);
    CHECK(out.echoed_kept);
    CHECK(rig.server->counters().request_copies == 1);
}

TEST_CASE("rpc endpoint: a Request read after its session ended, or after its answer, shows no bytes") {
    Rig rig;
    ReadLate out;
    rig.server->set_coroutine_handler(
        wait_then_read, [&out, &rig](rpc::Request request, rpc::Responder responder) -> asio::awaitable<void> {
            out.bytes_before = request.bytes().size();
            asio::steady_timer timer(co_await asio::this_coro::executor);
            while (rig.server->sessions() != 0) { // until the client has left
                timer.expires_after(1ms);
                co_await timer.async_wait(asio::use_awaitable);
            }
            out.bytes_after_end = request.bytes().size();
            responder.respond(request.bytes()); // to no one: the session ended
        });
    std::size_t answered_bytes = 1;
    rig.server->set_handler(later, [&answered_bytes](rpc::Request request, rpc::Responder responder) {
        responder.respond(request.bytes());
        answered_bytes = request.bytes().size();
    });
    run(rig.io,
        [](Rig* rig, ReadLate* out) -> asio::awaitable<void> {
            std::optional<rpc::Session> session;
            co_await connect_into(rig, &session);
            const auto request = message(7, 100);
            std::vector<std::byte> response(128);
            const Result<std::size_t> got = co_await session->call(later, request, response, {.timeout = 5s});
            REQUIRE((got && *got == request.size()));
            session->call(wait_then_read, request, response, {.timeout = 5s}, [](Result<std::size_t>) {});
            co_await until([&] { return rig->server->counters().handled == 2; });
            session.reset(); // the session ends at both ends
            co_await until([&] { return out->bytes_after_end.has_value(); });
        }(&rig, &out),
        30s);
    CHECK(answered_bytes == 0);
    CHECK(out.bytes_before == 100);
    REQUIRE(out.bytes_after_end);
    CHECK(*out.bytes_after_end == 0);
}

namespace {

// Two sessions set up; an echo through the second.
asio::awaitable<void> two_setups(Rig* rig, std::optional<rpc::Session>* first, std::optional<rpc::Session>* second,
                                 int* wrong) {
    co_await connect_into(rig, first);
    co_await connect_into(rig, second);
    const auto request = message(5, 32);
    std::vector<std::byte> response(64);
    const Result<std::size_t> got = co_await (*second)->call(echo, request, response, {.timeout = 5s});
    *wrong += got && *got == request.size() && echoed(response, request) ? 0 : 1;
}

} // namespace

TEST_CASE("rpc endpoint: an accept handler's exception leaves run(), and the next client is served") {
    // The setup coroutine that runs it was spawned detached: the exception vanished.
    Rig rig;
    int accepted = 0;
    std::vector<rpc::Session> kept;
    rig.server->set_accept_handler([&accepted, &kept](rpc::Session session) {
        if (++accepted == 1)
            throw std::runtime_error("the application's");
        kept.push_back(std::move(session));
    });
    std::optional<rpc::Session> first, second;
    int wrong = 0, thrown = 0;
    run(rig.io, two_setups(&rig, &first, &second, &wrong), 60s, &thrown);
    CHECK(thrown == 1);
    CHECK(accepted == 2);
    CHECK(wrong == 0);
    kept.clear();
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

namespace {

asio::awaitable<void> call_held(Rig* rig, std::optional<rpc::Session>* session) {
    co_await connect_into(rig, session);
    const auto request = message(1, 8);
    std::array<std::byte, 8> response{};
    (void)co_await (*session)->call(hold_it, request, response, {.timeout = 5s});
}

} // namespace

TEST_CASE("rpc endpoint: an unanswered Responder or a live Session destroyed on another thread aborts; so does "
          "an Endpoint destroyed before its Sessions, naming the line that created it") {
    // a destructor cannot name its caller: the message names the handle (from endpoint.cpp)
    rdmaxx::test::check_death(
        [] {
            Rig rig;
            std::optional<rpc::Session> session;
            asio::co_spawn(rig.io, call_held(&rig, &session), asio::detached);
            for (int i = 0; i < 500 && rig.held.empty(); ++i)
                spin(rig.io, 10ms);
            std::thread other([&] { rig.held.clear(); });
            other.join();
        },
        "an rpc::Responder that did not answer destroyed on another thread", "endpoint.cpp");
    rdmaxx::test::check_death(
        [] {
            Rig rig;
            std::optional<rpc::Session> session;
            run(rig.io, connect_into(&rig, &session), 10s);
            std::thread other([&] { session.reset(); });
            other.join();
        },
        "an rpc::Session destroyed on another thread", "endpoint.cpp");
    rdmaxx::test::check_death(
        [] {
            Rig rig;
            rig.client = must(rpc::Endpoint::create(rig.io, {})); // created on this file's line
            std::optional<rpc::Session> session;
            run(rig.io, connect_into(&rig, &session), 10s);
            rig.client.reset();
        },
        "destroyed while 1 of its Sessions live", "rpc_endpoint_test.cpp");
}

// ---------------------------------------------------------------------------------
// A hostile client: a session set up by hand (the setup messages' codec), then
// garbage and forged packets from its own UD QP, while an honest client calls on.

namespace {

// Garbage of every kind at the server, `rounds` times: random bytes, forged headers
// (wrong generation, wrong session, bad fields), requests far ahead of the window.
void attack(Attacker& a, std::mt19937& random, int rounds) {
    namespace d = rpc::detail;
    const d::UdAddress& server = a.reply.server;
    const std::uint32_t payload_max = a.ud->mtu() - static_cast<std::uint32_t>(d::header_bytes);
    for (int r = 0; r < rounds; ++r) {
        std::array<std::byte, d::header_bytes> header{};
        std::vector<std::byte> payload(random() % (payload_max + 1));
        for (auto& b : payload)
            b = static_cast<std::byte>(random());
        d::PacketHeader h{.kind = d::Kind::request,
                          .rpc_type = echo,
                          .status = d::Status::ok,
                          .session = a.reply.session.number,
                          .generation = a.reply.session.generation,
                          .message_size = static_cast<std::uint32_t>(payload.size()),
                          .request = 0,
                          .index = 0};
        switch (r % 6) {
        case 0: // random bytes
            for (auto& b : header)
                b = static_cast<std::byte>(random());
            break;
        case 1: h.generation += 1 + random() % 5; break;          // stale generation
        case 2: h.session = static_cast<std::uint16_t>(random()); break; // another session
        case 3: h.kind = static_cast<d::Kind>(6 + random() % 250); break; // no such kind
        case 4: h.index = static_cast<std::uint16_t>(1 + random() % 100); break; // index past the message
        case 5: h.request = 1000 + random() % 100000; break;     // far ahead of the window
        }
        if (r % 6 != 0)
            d::encode(h, header);
        (void)must(a.ud->send(*a.to_server, server, header, payload));
    }
}

asio::awaitable<void> honest_calls(Rig* rig, std::optional<rpc::Session>* session, Attacker* attacker, int* wrong) {
    co_await connect_into(rig, session);
    std::mt19937 random(7);
    std::vector<std::byte> response(4096);
    asio::steady_timer timer(rig->io);
    for (std::uint32_t n = 0; n < 300; ++n) {
        if (n % 10 == 0) {
            attack(*attacker, random, 24);
            timer.expires_after(1ms); // let the transport's send buffers come back
            co_await timer.async_wait(asio::use_awaitable);
        }
        const auto request = message(n, n % 2000);
        const auto got = co_await (**session).call(echo, request, response, {.timeout = 20s});
        if (!got || *got != request.size() || !echoed(response, request))
            ++*wrong;
    }
}

} // namespace

TEST_CASE("rpc endpoint: a client sending garbage and forged packets disturbs no other session") {
    Rig rig;
    Attacker attacker;
    attacker.ud = must(rpc::detail::UdTransport::create(rig.io, {.ring = 64, .send_depth = 64},
                                                          &Attacker::deliver, &attacker));
    asio::ip::tcp::socket socket(rig.io);
    run(rig.io, hostile_setup(&rig, &attacker, &socket), 30s);
    REQUIRE(!attacker.reply.refusal);
    attacker.to_server.emplace(must(attacker.ud->handles().to(attacker.reply.server)));
    std::optional<rpc::Session> session;
    int wrong = 0;
    run(rig.io, honest_calls(&rig, &session, &attacker, &wrong), 120s);
    CHECK(wrong == 0);
    const auto& s = rig.server->counters();
    MESSAGE("server drops: ", s.dropped(), ", handled ", s.handled, ", answers to the attacker ",
            attacker.answers);
    for (std::size_t i = 0; !rpc::drop_reason_name(i).empty(); ++i)
        if (s.drops[i] != 0)
            MESSAGE("  ", rpc::drop_reason_name(i), ": ", s.drops[i]);
    // 720 packets sent; some may find no receive posted (UD drops them), most arrive
    CHECK(s.dropped() >= 360);
    CHECK(s.handled >= 300);
    CHECK(rig.server->sessions() == 2);
    CHECK(rig.client->counters().failed == 0);
}

// ---------------------------------------------------------------------------------
// A hostile client on the RC path: an RC QP of its own offered over its session's TCP
// connection, then descriptors the server must not READ (beyond the session's limit),
// one naming memory that is not there (the READ fails), garbage in place of an RC
// message on another session, and on a third a SEND larger than the server's receive
// buffers (its QP breaks). Each ends at most the hostile session; an honest client's
// large calls go on.

namespace {

const rpc::EndpointOptions large_messages{.max_request = 1 << 20, .max_response = 1 << 20};

// A client's options: `options`, lending through memory windows.
rpc::EndpointOptions lending_through_windows(rpc::EndpointOptions options = large_messages) {
    options.lend_through_windows = true;
    return options;
}

struct RcAttack {
    bool answered_too_far = false; // the descriptor beyond the limit: answered, not READ
    bool ended_by_bad_read = false;
    bool ended_by_garbage = false;
    bool ended_by_oversized_send = false;
    bool ended_by_garbage_send = false;
    int honest_wrong = 0;
    std::uint32_t server_sessions = 0; // at the end, the honest one still open
};

// Sends the attacker's descriptor request `request` (its memory: `memory`).
void send_descriptor(Attacker& a, std::uint64_t request, const RemoteMemory& memory) {
    namespace d = rpc::detail;
    const auto head = d::encode_request_head(memory, {});
    std::array<std::byte, d::header_bytes> header{};
    d::encode({.kind = d::Kind::request,
               .rpc_type = echo,
               .status = d::Status::ok,
               .session = a.reply.session.number,
               .generation = a.reply.session.generation,
               .message_size = static_cast<std::uint32_t>(head.size()),
               .request = request,
               .index = 0,
               .rdma = true},
              header);
    (void)must(a.ud->send(*a.to_server, a.reply.server, header, head));
}

// Whether the server closes `socket` within `limit` (a read ends in an error).
asio::awaitable<bool> closed_within(asio::ip::tcp::socket* socket, std::chrono::milliseconds limit) {
    // the read's state outlives this coroutine if the read is cancelled at the deadline
    struct Read {
        std::array<std::byte, 1> one{};
        std::optional<std::error_code> ended;
    };
    auto read = std::make_shared<Read>();
    socket->async_read_some(asio::buffer(read->one), [read](std::error_code ec, std::size_t) { read->ended = ec; });
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!read->ended && std::chrono::steady_clock::now() < deadline)
        co_await pause(5ms);
    if (!read->ended)
        socket->cancel();
    co_return read->ended && *read->ended;
}

asio::awaitable<void> honest_large(std::optional<rpc::Session>* session, std::uint32_t first, int* wrong) {
    std::vector<std::byte> response(300'000);
    for (std::uint32_t n = first; n < first + 4; ++n) {
        const auto request = message(n, 100'000 + n);
        const auto got = co_await (**session).call(echo, request, response, {.timeout = 30s});
        if (!got || *got != request.size() || !echoed(response, request))
            ++*wrong;
    }
}

// The attacker's RC QP for its session on `socket` (and its CQ), offered to the server
// and connected to the server's QP.
struct HostileRc {
    std::optional<CompletionQueue> cq;
    std::optional<QueuePair> qp;
};

void make_hostile_qp(Attacker& attacker, HostileRc& rc) {
    rc.cq.emplace(must(CompletionQueue::create(attacker.ud->context(), {.depth = 16})));
    rc.qp.emplace(must(QueuePair::create(attacker.ud->pd(), {.type = QpType::rc,
                                                             .send_cq = &*rc.cq,
                                                             .recv_cq = &*rc.cq,
                                                             .caps = {.max_send_wr = 4, .max_recv_wr = 4},
                                                             .port = attacker.ud->port(),
                                                             .gid_index = attacker.ud->gid_index()})));
}

asio::awaitable<void> offer_rc(Attacker* attacker, asio::ip::tcp::socket* socket, HostileRc* rc) {
    namespace d = rpc::detail;
    make_hostile_qp(*attacker, *rc);
    const auto offer =
        d::encode(d::RcMessage{.kind = d::RcMessage::Kind::offer, .available = true, .qp = rc->qp->endpoint()});
    co_await asio::async_write(*socket, asio::buffer(offer), asio::use_awaitable);
    std::array<std::byte, d::rc_message_bytes> in{};
    co_await asio::async_read(*socket, asio::buffer(in), asio::use_awaitable);
    const auto answer = must(d::decode_rc(in));
    REQUIRE(answer.available);
    must(rc->qp->connect(answer.qp));
}

asio::awaitable<void> attack_rc(Rig* rig, Attacker* attacker, asio::ip::tcp::socket* socket,
                                asio::ip::tcp::socket* second, asio::ip::tcp::socket* third,
                                asio::ip::tcp::socket* fourth, RcAttack* out) {
    namespace d = rpc::detail;
    std::optional<rpc::Session> honest;
    co_await connect_into(rig, &honest);
    co_await honest_large(&honest, 0, &out->honest_wrong);

    co_await hostile_setup(rig, attacker, socket);
    REQUIRE(!attacker->reply.refusal);
    attacker->to_server.emplace(must(attacker->ud->handles().to(attacker->reply.server)));
    HostileRc rc;
    co_await offer_rc(attacker, socket, &rc);

    // beyond the session's max_request (4096): answered transfer_failed, nothing READ
    const std::uint64_t reads = rig->server->counters().rdma_reads;
    send_descriptor(*attacker, 0, {.addr = 0x10000, .length = 100'000, .rkey = 0xbad});
    co_await until([attacker] { return attacker->answers >= 1; });
    out->answered_too_far = rig->server->counters().rdma_reads == reads;
    // within it, but no such memory: the READ fails, the server ends this session only
    send_descriptor(*attacker, 1, {.addr = 0x10000, .length = 4000, .rkey = 0xbad});
    out->ended_by_bad_read = co_await closed_within(socket, 10s);
    co_await honest_large(&honest, 10, &out->honest_wrong);

    // garbage where an RC message belongs, on a second hostile session
    co_await hostile_setup(rig, attacker, second, 8);
    REQUIRE(!attacker->reply.refusal);
    std::array<std::byte, d::rc_message_bytes> garbage{};
    for (std::size_t i = 0; i < garbage.size(); ++i)
        garbage[i] = static_cast<std::byte>(i * 37 + 11);
    co_await asio::async_write(*second, asio::buffer(garbage), asio::use_awaitable);
    out->ended_by_garbage = co_await closed_within(second, 10s);
    co_await honest_large(&honest, 20, &out->honest_wrong);

    // a SEND larger than the server's buffers for whole requests, on a third: the
    // server's receive fails and its QP breaks; the server ends the session at once
    // (the attacker keeps its control connection open and posts nothing more)
    co_await hostile_setup(rig, attacker, third, 9);
    REQUIRE(!attacker->reply.refusal);
    HostileRc broken;
    co_await offer_rc(attacker, third, &broken);
    auto oversized = must(MemoryRegion::allocate(attacker->ud->pd(), 64 * 1024, Access::local_write));
    must(post_send(*broken.qp, oversized.slice(0, 64 * 1024), {.wr_id = 1}));
    out->ended_by_oversized_send = co_await closed_within(third, 10s);
    co_await honest_large(&honest, 30, &out->honest_wrong);

    // a SEND the server's buffers hold, but no whole request: garbage, on a fourth; the
    // server's receive succeeds and the session ends all the same (no honest client
    // SENDs it)
    co_await hostile_setup(rig, attacker, fourth, 10);
    REQUIRE(!attacker->reply.refusal);
    HostileRc garbage_sender;
    co_await offer_rc(attacker, fourth, &garbage_sender);
    auto junk = must(MemoryRegion::allocate(attacker->ud->pd(), 64, Access::local_write));
    for (std::size_t i = 0; i < 64; ++i)
        junk.data()[i] = static_cast<std::byte>(i * 29 + 3);
    must(post_send(*garbage_sender.qp, junk.slice(0, 64), {.wr_id = 1}));
    out->ended_by_garbage_send = co_await closed_within(fourth, 10s);
    co_await honest_large(&honest, 40, &out->honest_wrong);
    co_await pause(50ms);
    out->server_sessions = rig->server->sessions();
}

} // namespace

TEST_CASE("rpc endpoint: a hostile client's RC offer, descriptors, oversized and garbage SENDs end its own session "
          "only") {
    Rig rig(large_messages, large_messages);
    Attacker attacker;
    attacker.ud = must(rpc::detail::UdTransport::create(rig.io, {.ring = 64, .send_depth = 64},
                                                          &Attacker::deliver, &attacker));
    asio::ip::tcp::socket socket(rig.io), second(rig.io), third(rig.io), fourth(rig.io);
    RcAttack out;
    run(rig.io, attack_rc(&rig, &attacker, &socket, &second, &third, &fourth, &out), 120s);
    CHECK(out.answered_too_far);
    CHECK(out.ended_by_bad_read);
    CHECK(out.ended_by_garbage);
    CHECK(out.ended_by_oversized_send);
    CHECK(out.ended_by_garbage_send);
    CHECK(out.honest_wrong == 0);
    CHECK(out.server_sessions == 1); // the honest one
    CHECK(rig.server->counters().rc_misuses == 1); // the garbage SEND (the others end otherwise)
    CHECK(rig.server->counters().rdma_reads >= 16);
    CHECK(rig.server->counters().message_copies == 0); // echo: WRITTEN from the bytes READ
    CHECK(rig.client->counters().failed == 0);
}

// ---------------------------------------------------------------------------------
// A hostile server: it sets a session up with the client by hand (the setup messages'
// codec), answers the client's RC offer with a QP of its own, then, while the client's
// large call waits, sends into the receives every session of the client endpoint
// shares what no honest server sends: zero-byte WRITEs whose immediates name a slot
// with no call in progress, or another session, or a call that offered no memory for
// its response, or a SEND. Each ends the hostile
// session at once, its call with "session reset"; an honest session's large calls, one
// of them in flight meanwhile, go on.

namespace {

enum class Misuse { idle_slot, other_session, send, unoffered };
constexpr int misuses = 4;

struct HostileServer {
    Attacker attacker; // its UD QP: the address its reply names (the client's packets go there, unanswered)
    HostileRc rc;
    rpc::detail::SessionRequest request; // the client's
    bool ready = false;                  // the RC QPs are connected
};

asio::awaitable<void> serve_hostile(asio::ip::tcp::acceptor* acceptor, asio::ip::tcp::socket* socket,
                                    HostileServer* h) {
    namespace d = rpc::detail;
    co_await acceptor->async_accept(*socket, asio::use_awaitable);
    std::array<std::byte, d::session_request_bytes> request{};
    co_await asio::async_read(*socket, asio::buffer(request), asio::use_awaitable);
    h->request = must(d::decode_request(request));
    const auto reply = d::encode(d::SessionReply{.refusal = std::nullopt,
                                                 .server = h->attacker.ud->address(),
                                                 .session = {.number = 3, .generation = 1},
                                                 .limits = h->request.limits,
                                                 .both_ways = false});
    co_await asio::async_write(*socket, asio::buffer(reply), asio::use_awaitable);
    // the client's offer comes with its first large call
    std::array<std::byte, d::rc_message_bytes> offer{};
    co_await asio::async_read(*socket, asio::buffer(offer), asio::use_awaitable);
    const auto offered = must(d::decode_rc(offer));
    REQUIRE(offered.kind == d::RcMessage::Kind::offer);
    make_hostile_qp(h->attacker, h->rc);
    must(h->rc.qp->connect(offered.qp));
    const auto answer = d::encode(d::RcMessage{.kind = d::RcMessage::Kind::answer, .qp = h->rc.qp->endpoint()});
    co_await asio::async_write(*socket, asio::buffer(answer), asio::use_awaitable);
    h->ready = true;
}

// The misuse, 4 times (all the hostile QP's send queue holds): the first ends the session.
void misuse(HostileServer& h, Misuse how) {
    namespace d = rpc::detail;
    const std::uint16_t own = h.request.session.number;
    // the client's large call is in slot 0 (its session's first call): slot 1 is idle
    const auto session = how == Misuse::other_session ? static_cast<std::uint16_t>(own + 1) : own;
    const std::uint32_t imm =
        d::encode_written({.session = session, .slot = how == Misuse::unoffered ? 0u : 1u, .round = 0});
    for (std::uint64_t k = 0; k < 4; ++k) {
        if (how == Misuse::send)
            must(post_send(*h.rc.qp, std::span<const LocalSlice>{}, {.wr_id = k}));
        else
            must(post_write_with_imm(*h.rc.qp, std::span<const LocalSlice>{}, RemoteMemory{}, imm, {.wr_id = k}));
    }
}

struct ServerAttack {
    int honest_wrong = 0;
    std::array<std::optional<Error>, misuses> hostile_calls; // how each hostile session's call ended
    std::array<bool, misuses> closed{};                        // the client closed the control connection
    std::uint32_t client_sessions = 0;                   // at the end: the honest one
};

asio::awaitable<void> attack_client(Rig* rig, ServerAttack* out) {
    std::optional<rpc::Session> honest;
    co_await connect_into(rig, &honest);
    co_await honest_large(&honest, 0, &out->honest_wrong);
    const auto executor = co_await asio::this_coro::executor;
    for (int i = 0; i < misuses; ++i) {
        HostileServer h;
        h.attacker.ud = must(rpc::detail::UdTransport::create(rig->io, {.ring = 64, .send_depth = 64},
                                                               &Attacker::deliver, &h.attacker));
        const std::uint16_t port = next_port();
        asio::ip::tcp::acceptor acceptor(executor, {asio::ip::make_address("127.0.0.1"), port});
        asio::ip::tcp::socket socket(executor);
        asio::co_spawn(executor, serve_hostile(&acceptor, &socket, &h), asio::detached);
        auto hostile = co_await rig->client->connect("127.0.0.1", port);
        REQUIRE_MESSAGE(hostile.has_value(), (hostile ? "" : hostile.error().message()));
        // a large call: its offer sets the RC path up, then it waits for an answer (into
        // memory it offers, but for the call of `unoffered`, whose response is small)
        const auto big = message(100 + i, 100'000);
        std::vector<std::byte> response(static_cast<Misuse>(i) == Misuse::unoffered ? 100 : 300'000);
        std::optional<Result<std::size_t>> ended;
        hostile->call(echo, big, response, {.timeout = 30s}, [&ended](Result<std::size_t> r) { ended = r; });
        co_await until([&h] { return h.ready; });
        co_await pause(20ms); // the call's descriptor is on its way
        // an honest large call in flight while the misuse comes
        const auto request = message(200 + i, 150'000);
        std::vector<std::byte> echoed_back(300'000);
        std::optional<Result<std::size_t>> honest_got;
        honest->call(echo, request, echoed_back, {.timeout = 30s},
                     [&honest_got](Result<std::size_t> r) { honest_got = r; });
        misuse(h, static_cast<Misuse>(i));
        co_await until([&ended] { return ended.has_value(); });
        if (!*ended)
            out->hostile_calls[i] = ended->error();
        out->closed[i] = co_await closed_within(&socket, 10s);
        co_await until([&honest_got] { return honest_got.has_value(); });
        if (!*honest_got || **honest_got != request.size() || !echoed(echoed_back, request))
            ++out->honest_wrong;
        co_await honest_large(&honest, 10 * (i + 1), &out->honest_wrong);
    }
    out->client_sessions = rig->client->sessions();
}

} // namespace

TEST_CASE("rpc endpoint: a hostile server's immediates and SENDs end its own session only, at the first") {
    Rig rig(large_messages, large_messages);
    ServerAttack out;
    run(rig.io, attack_client(&rig, &out), 120s);
    for (int i = 0; i < misuses; ++i) {
        CAPTURE(i);
        REQUIRE(out.hostile_calls[i]);
        CHECK(out.hostile_calls[i]->is_errno(ECONNRESET));
        CHECK(out.closed[i]);
    }
    CHECK(out.honest_wrong == 0);
    CHECK(out.client_sessions == 1);
    const auto& c = rig.client->counters();
    CHECK(c.rc_misuses == misuses);
    CHECK(c.failed == misuses);
    MESSAGE("client drops: ", c.dropped());
}

// A server that keeps the keys a large call lent it: during the call it READs the
// request and WRITEs an honest response; once the call has ended it tries the keys
// again. With EndpointOptions::lend_through_windows, each key is a window bound to the
// call's bytes through the session's QP and revoked before the call ends: the late READ
// or WRITE fails at the NIC, and the caller's memory stays as the call left it. Without
// (the keys are the registrations'), the late WRITE lands in the caller's response
// buffer.

namespace {

struct KeyThief {
    HostileServer h;
    std::vector<std::byte> packet; // the last the client sent it: the call's descriptor
    static void capture(void* self, rpc::detail::UdSource, std::span<const std::byte> packet) {
        static_cast<KeyThief*>(self)->packet.assign(packet.begin(), packet.end());
    }
};

// The status of the next completion (the only WR in flight); spins, as the NIC serves
// the other end without its thread.
ibv_wc_status next_status(CompletionQueue& cq) {
    ibv_wc wc{};
    int polled = 0;
    for (long spins = 0; polled == 0 && spins < 200'000'000; ++spins)
        polled = ibv_poll_cq(cq.get(), 1, &wc);
    REQUIRE(polled == 1);
    return wc.status;
}

struct Theft {
    std::optional<Result<std::size_t>> call;
    ibv_wc_status read = IBV_WC_GENERAL_ERR, written = IBV_WC_GENERAL_ERR; // during the call
    bool request_read = false;                                            // its bytes, READ
    ibv_wc_status late = IBV_WC_SUCCESS;                                  // after it
    bool response_kept = false; // the caller's response is the honest one
    bool nothing_read = false;  // the late READ brought nothing
};

constexpr std::size_t stolen_request = 100'000, stolen_response = 1000;

asio::awaitable<void> steal(Rig* rig, bool buffers, bool late_write, Theft* out) {
    namespace d = rpc::detail;
    const auto executor = co_await asio::this_coro::executor;
    KeyThief thief;
    thief.h.attacker.ud =
        must(d::UdTransport::create(rig->io, {.ring = 64, .send_depth = 64}, &KeyThief::capture, &thief));
    const std::uint16_t port = next_port();
    asio::ip::tcp::acceptor acceptor(executor, {asio::ip::make_address("127.0.0.1"), port});
    asio::ip::tcp::socket socket(executor);
    asio::co_spawn(executor, serve_hostile(&acceptor, &socket, &thief.h), asio::detached);
    auto session = co_await rig->client->connect("127.0.0.1", port);
    REQUIRE_MESSAGE(session.has_value(), (session ? "" : session.error().message()));
    const auto bytes = message(5, stolen_request);
    rpc::MessageBuffer request = must(rig->client->alloc_buffer(stolen_request, rpc::BufferUse::request));
    rpc::MessageBuffer response = must(rig->client->alloc_buffer(300'000, rpc::BufferUse::response));
    std::vector<std::byte> response_span(300'000);
    const auto ended = [out](Result<std::size_t> r) { out->call = std::move(r); };
    if (buffers) {
        request.resize(stolen_request);
        std::memcpy(request.bytes().data(), bytes.data(), bytes.size());
        session->call(echo, request, response, {.timeout = 30s}, ended);
    } else {
        session->call(echo, bytes, response_span, {.timeout = 30s}, ended);
    }
    co_await until([&thief] { return thief.h.ready && !thief.packet.empty(); });
    const auto descriptor = must(d::decode_request_descriptor(std::span(thief.packet).subspan(d::header_bytes),
                                                              1 << 20, 1 << 20));
    REQUIRE(descriptor.request.length == stolen_request);
    MemoryRegion mine = must(MemoryRegion::allocate(thief.h.attacker.ud->pd(), stolen_request, Access::local_write));
    QueuePair& qp = *thief.h.rc.qp;
    must(post_read(qp, mine.slice(0, stolen_request), descriptor.request, {.wr_id = 1}));
    out->read = next_status(*thief.h.rc.cq);
    out->request_read = std::equal(bytes.begin(), bytes.end(), mine.data());
    std::memset(mine.data(), 0xab, stolen_response);
    const std::uint32_t imm = d::encode_written({.session = thief.h.request.session.number, .slot = 0, .round = 0});
    must(post_write_with_imm(qp, mine.slice(0, stolen_response), descriptor.response.slice(0, stolen_response), imm,
                             {.wr_id = 2}));
    out->written = next_status(*thief.h.rc.cq);
    co_await until([out] { return out->call.has_value(); });
    std::memset(mine.data(), 0xcd, stolen_request);
    if (late_write)
        must(post_write(qp, mine.slice(0, stolen_response), descriptor.response.slice(0, stolen_response), {.wr_id = 3}));
    else
        must(post_read(qp, mine.slice(0, stolen_request), descriptor.request, {.wr_id = 3}));
    out->late = next_status(*thief.h.rc.cq);
    const std::span<const std::byte> answer =
        buffers ? response.bytes() : std::span<const std::byte>(response_span).first(stolen_response);
    out->response_kept = answer.size() == stolen_response &&
                         std::ranges::all_of(answer, [](std::byte b) { return b == std::byte{0xab}; });
    out->nothing_read = std::all_of(mine.data(), mine.data() + stolen_request, [](std::byte b) { return b == std::byte{0xcd}; });
}

} // namespace

TEST_CASE("rpc endpoint: lending through windows, a server's keys to a large call's memory work during the call only" *
          doctest::skip(!test::device_has_windows())) {
    for (bool buffers : {true, false})
        for (bool late_write : {true, false}) {
            CAPTURE(buffers);
            CAPTURE(late_write);
            Rig rig(large_messages, lending_through_windows());
            Theft out;
            run(rig.io, steal(&rig, buffers, late_write, &out), 60s);
            REQUIRE(out.call);
            REQUIRE_MESSAGE(out.call->has_value(), (*out.call ? "" : out.call->error().message()));
            CHECK(**out.call == stolen_response);
            CHECK(out.read == IBV_WC_SUCCESS);
            CHECK(out.request_read);
            CHECK(out.written == IBV_WC_SUCCESS);
            CHECK(out.late == IBV_WC_REM_ACCESS_ERR);
            CHECK(out.response_kept);
            CHECK(out.nothing_read);
        }
}

namespace {

// Lending through windows, bursts of cancellations: a window of large calls begins
// (each binds two windows through the session's QP), the same synchronous step cancels
// them all, their binds not yet complete (nothing of them sent: their numbers go to the
// next calls, slots.hpp), and each cancellation begins a queued call in its slot. The
// abandoned calls' binds still take room in the QP's send queue: a queued call lends
// through windows only where its own four work requests fit beside them, else it goes
// by UD. Rounds of it, then a window of calls: all lend again (the room comes back as
// the binds complete). The calls lend MessageBuffers: a cancelled call's, which no key
// left the host for, keep their memory.
struct Bursts {
    int wrong = 0;                    // a call answered wrong, or ended other than cancelled
    std::uint32_t window = 0;
    std::uint64_t lent_in_bursts = 0; // calls of the bursts the server READ
    std::uint64_t lent_after = 0;     // of the last window
    std::uint64_t posts_after = 0;    // the last window's window posts (Counters::window_posts)
    std::uint32_t sessions = 0;       // the client's, at the end
};

asio::awaitable<void> cancel_bursts(Rig* rig, int rounds, Bursts* out) {
    std::optional<rpc::Session> session;
    co_await connect_into(rig, &session);
    const std::uint32_t w = out->window = session->info().window;
    constexpr std::size_t size = 20'000;
    std::vector<std::vector<std::byte>> sent;
    std::vector<rpc::MessageBuffer> requests, responses;
    for (std::uint32_t i = 0; i < 2 * w; ++i) {
        sent.push_back(message(i, size - i));
        requests.push_back(must(rig->client->alloc_buffer(size, rpc::BufferUse::request)));
        requests.back().resize(sent.back().size());
        std::memcpy(requests.back().bytes().data(), sent.back().data(), sent.back().size());
        responses.push_back(must(rig->client->alloc_buffer(size, rpc::BufferUse::response)));
    }
    const auto right = [&](std::uint32_t i, const Result<std::size_t>& got) {
        return got && *got == sent[i].size() && echoed(responses[i].bytes(), sent[i]);
    };
    // the session's RC path, set up by a first large call
    if (!right(0, co_await session->call(echo, requests[0], responses[0], {.timeout = 30s})))
        ++out->wrong;
    std::uint32_t ended = 0;
    for (int round = 0; round < rounds; ++round) {
        const std::uint64_t read = rig->server->counters().rdma_reads;
        std::vector<asio::cancellation_signal> cancels(w);
        ended = 0;
        for (std::uint32_t i = 0; i < 2 * w; ++i) {
            auto done = [&, i](Result<std::size_t> got) {
                ++ended;
                if (i < w ? !(!got && got.error().is_cancelled()) : !right(i, got))
                    ++out->wrong;
            };
            if (i < w)
                session->call(echo, requests[i], responses[i], {.timeout = 30s},
                              asio::bind_cancellation_slot(cancels[i].slot(), std::move(done)));
            else
                session->call(echo, requests[i], responses[i], {.timeout = 30s}, std::move(done));
        }
        for (asio::cancellation_signal& cancel : cancels)
            cancel.emit(asio::cancellation_type::terminal);
        co_await until([&] { return ended == 2 * w; });
        out->lent_in_bursts += rig->server->counters().rdma_reads - read;
    }
    const std::uint64_t read = rig->server->counters().rdma_reads;
    const std::uint64_t posts = rig->client->counters().window_posts;
    ended = 0;
    for (std::uint32_t i = 0; i < w; ++i)
        session->call(echo, requests[i], responses[i], {.timeout = 30s}, [&, i](Result<std::size_t> got) {
            ++ended;
            if (!right(i, got))
                ++out->wrong;
        });
    co_await until([&] { return ended == w; });
    out->lent_after = rig->server->counters().rdma_reads - read;
    out->posts_after = rig->client->counters().window_posts - posts;
    out->sessions = rig->client->sessions();
}

} // namespace

namespace {

// Lending through windows, a call's binds hold the packets of its own slot only: a small
// call begun in the same synchronous step, the large call's binds in flight, sends its
// packet at once (Counters::copies counts a UD packet's payload as it is posted). One
// begun in the slot of a large call cancelled with its binds in flight (its number given
// back) waits for those binds: its answer would free their windows.
struct Beside {
    int wrong = 0;
    std::uint64_t large_sent = 0;        // packets posted by the large call's start
    std::uint64_t small_sent = 0;        // by the small call's, the large call's binds in flight
    std::uint64_t after_cancel_sent = 0; // by the small call's in the cancelled call's slot
    std::uint64_t lent = 0;              // large calls the server READ
};

asio::awaitable<void> call_beside_binds(Rig* rig, int rounds, Beside* out) {
    std::optional<rpc::Session> session;
    co_await connect_into(rig, &session);
    constexpr std::size_t size = 20'000;
    const std::vector<std::byte> sent = message(1, size);
    rpc::MessageBuffer request = must(rig->client->alloc_buffer(size, rpc::BufferUse::request));
    rpc::MessageBuffer response = must(rig->client->alloc_buffer(size, rpc::BufferUse::response));
    request.resize(size);
    std::memcpy(request.bytes().data(), sent.data(), size);
    const auto right = [&](const Result<std::size_t>& got) {
        return got && *got == size && echoed(response.bytes(), sent);
    };
    // the session's RC path, set up by a first large call
    if (!right(co_await session->call(echo, request, response, {.timeout = 30s})))
        ++out->wrong;
    const std::vector<std::byte> small = message(2, 32);
    std::vector<std::byte> small_response(64);
    int ended = 0;
    const auto small_done = [&](Result<std::size_t> got) {
        ++ended;
        if (!got || *got != small.size() || !echoed(small_response, small))
            ++out->wrong;
    };
    const std::uint64_t read = rig->server->counters().rdma_reads;
    for (int round = 0; round < rounds; ++round) {
        ended = 0;
        const std::uint64_t before = rig->client->counters().copies;
        session->call(echo, request, response, {.timeout = 30s}, [&](Result<std::size_t> got) {
            ++ended;
            if (!right(got))
                ++out->wrong;
        });
        const std::uint64_t after_large = rig->client->counters().copies;
        out->large_sent += after_large - before;
        session->call(echo, small, small_response, {.timeout = 30s}, small_done);
        out->small_sent += rig->client->counters().copies - after_large;
        co_await until([&] { return ended == 2; });
    }
    out->lent = rig->server->counters().rdma_reads - read;
    for (int round = 0; round < rounds; ++round) {
        ended = 0;
        asio::cancellation_signal cancel;
        session->call(echo, request, response, {.timeout = 30s},
                      asio::bind_cancellation_slot(cancel.slot(), [&](Result<std::size_t> got) {
                          ++ended;
                          if (got || !got.error().is_cancelled())
                              ++out->wrong;
                      }));
        cancel.emit(asio::cancellation_type::terminal);
        const std::uint64_t before = rig->client->counters().copies;
        session->call(echo, small, small_response, {.timeout = 30s}, small_done);
        out->after_cancel_sent += rig->client->counters().copies - before;
        co_await until([&] { return ended == 2; });
    }
}

} // namespace

TEST_CASE("rpc endpoint: lending through windows, binds in flight hold the packets of their slot, not of the session" *
          doctest::skip(!test::device_has_windows())) {
    Rig rig(large_messages, lending_through_windows());
    constexpr int rounds = 20;
    Beside out;
    run(rig.io, call_beside_binds(&rig, rounds, &out), 60s);
    CHECK(out.wrong == 0);
    CHECK(out.large_sent == 0);      // its descriptor waits for its binds
    CHECK(out.small_sent == rounds); // the small call's packet does not
    CHECK(out.after_cancel_sent == 0);
    CHECK(out.lent == rounds);
    // a bind post and a revocation post per large call answered, a bind post per one cancelled
    CHECK(rig.client->counters().window_posts == 2 * (rounds + 1) + rounds);
}

namespace {

// Lending through windows, the device failing its window work. Soft-RoCE once stalled a
// QP's binds for 40 s and more; the endpoint takes a QP whose binds and revocations go
// 5 s without one completing for stalled, and ends the session. Provoked for real: the
// client's QP moved to SQD (its send queue drained: the device runs no work request
// posted after), so the binds, or the revocations, posted on it never run; then moved
// to ERR, they complete flushed: failed. Binds meet it set before the call; revocations,
// set by the server's handler (the call's binds complete, its request READ), and to ERR
// once the revocation post is counted (Counters::window_posts).
constexpr std::uint8_t stall_client = 11;

enum class WindowFault { binds_stalled, binds_failed, revocations_stalled, revocations_failed };

struct WindowFailure {
    std::optional<Result<std::size_t>> call;
    bool echoed = false;
    std::chrono::steady_clock::duration took{}; // from the fault to the call's end
    std::uint32_t sessions_after = 0;           // the client's, once the call ended
    std::optional<Result<std::size_t>> next;    // a call on a new session
};

void set_state(rpc::Session& session, ibv_qp_state state) {
    QueuePair* qp = rpc::detail::rc_qp_of(session);
    REQUIRE(qp != nullptr);
    ibv_qp_attr attr{};
    attr.qp_state = state;
    REQUIRE(ibv_modify_qp(qp->get(), &attr, IBV_QP_STATE) == 0);
}

asio::awaitable<void> fail_windows(Rig* rig, WindowFault fault, WindowFailure* out) {
    std::optional<rpc::Session> session;
    co_await connect_into(rig, &session);
    using Clock = std::chrono::steady_clock;
    Clock::time_point faulted{};
    rig->server->set_handler(stall_client, [&](rpc::Request request, rpc::Responder responder) {
        set_state(*session, IBV_QPS_SQD);
        faulted = Clock::now();
        responder.respond(request.bytes());
    });
    constexpr std::size_t size = 20'000;
    const std::vector<std::byte> sent = message(1, size);
    std::vector<std::byte> response(size);
    // the session's RC path, set up by a first large call
    const Result<std::size_t> first = co_await session->call(echo, sent, response, {.timeout = 30s});
    REQUIRE((first && *first == size));
    std::ranges::fill(response, std::byte{0});
    const bool at_binds = fault == WindowFault::binds_stalled || fault == WindowFault::binds_failed;
    if (at_binds) {
        set_state(*session, IBV_QPS_SQD);
        faulted = Clock::now();
    }
    const std::uint64_t posts = rig->client->counters().window_posts;
    session->call(at_binds ? echo : stall_client, sent, response, {.timeout = 30s},
                  [&](Result<std::size_t> got) { out->call = std::move(got); });
    if (fault == WindowFault::binds_failed) {
        set_state(*session, IBV_QPS_ERR); // the binds posted, stalled
        faulted = Clock::now();
    } else if (fault == WindowFault::revocations_failed) {
        co_await until([&] { return out->call || rig->client->counters().window_posts == posts + 2; });
        set_state(*session, IBV_QPS_ERR);
        faulted = Clock::now();
    }
    co_await until([&] { return out->call.has_value(); });
    out->took = Clock::now() - faulted;
    out->echoed = echoed(response, sent);
    out->sessions_after = rig->client->sessions();
    session.reset();
    co_await connect_into(rig, &session);
    out->next = co_await session->call(echo, sent, response, {.timeout = 30s});
}

} // namespace

TEST_CASE("rpc endpoint: lending through windows, binds or revocations the device stalls end the session in 5 s, "
          "failed ones at once; a call whose answer was in gets it" *
          doctest::skip(!test::device_has_windows())) {
    for (const WindowFault fault : {WindowFault::binds_stalled, WindowFault::binds_failed,
                                    WindowFault::revocations_stalled, WindowFault::revocations_failed}) {
        CAPTURE(static_cast<int>(fault));
        Rig rig(large_messages, lending_through_windows());
        WindowFailure out;
        run(rig.io, fail_windows(&rig, fault, &out), 60s);
        REQUIRE(out.call);
        if (fault == WindowFault::binds_stalled || fault == WindowFault::binds_failed) {
            REQUIRE_FALSE(out.call->has_value());
            CHECK_MESSAGE(out.call->error().is_errno(ECONNRESET), out.call->error().message());
        } else { // the answer was in before the revocations stalled
            REQUIRE_MESSAGE(out.call->has_value(), (*out.call ? "" : out.call->error().message()));
            CHECK(**out.call == 20'000);
            CHECK(out.echoed);
        }
        if (fault == WindowFault::binds_stalled || fault == WindowFault::revocations_stalled) {
            CHECK(out.took >= 5s); // the stall bound
            CHECK(out.took < 8s);  // and the ticker's turn
        } else {
            CHECK(out.took < 2s);
        }
        CHECK(out.sessions_after == 0);
        REQUIRE(out.next);
        CHECK_MESSAGE(out.next->has_value(), (*out.next ? "" : out.next->error().message()));
    }
}

TEST_CASE("rpc endpoint: lending through windows, bursts of cancelled calls: a call lends only where its binds and "
          "revocations fit beside the abandoned calls' binds, else it goes by UD" *
          doctest::skip(!test::device_has_windows())) {
    Rig rig(large_messages, lending_through_windows());
    constexpr int rounds = 20;
    Bursts out;
    run(rig.io, cancel_bursts(&rig, rounds, &out), 120s);
    CHECK(out.wrong == 0);
    // each burst: the window's calls bind (their 4 W work requests fill the QP's share)
    // and are cancelled; a cancellation frees two of the four (the revocations; the
    // binds are in flight), so every second call begun by a cancellation fits and
    // lends, the others go by UD
    CHECK(out.lent_in_bursts == rounds * (out.window / 2));
    CHECK(out.lent_after == out.window);
    // each lending call: its two binds with one doorbell, its two revocations with another
    CHECK(out.posts_after == 2 * out.window);
    const auto& c = rig.client->counters();
    CHECK(c.failed == rounds * out.window); // the cancelled, and no session ended
    // a cancelled call's MessageBuffers get new memory: windows were being bound to
    // them, with keys the server can guess (each window's last, advanced)
    CHECK(c.buffers_renewed == 2 * rounds * out.window);
    CHECK(c.rc_misuses == 0);
    CHECK(out.sessions == 1);
}

namespace {

asio::awaitable<void> many_sessions(Rig* rig, std::vector<rpc::Session>* sessions, std::uint32_t count,
                                    int* wrong) {
    for (std::uint32_t i = 0; i < count; ++i) {
        auto session = co_await rig->client->connect(rig->address, rig->port);
        if (!session) {
            MESSAGE("session ", i, ": ", session.error().message());
            ++*wrong;
            co_return;
        }
        sessions->push_back(std::move(*session));
    }
    // one call on every session at once, each with its own message
    std::vector<std::vector<std::byte>> responses(count, std::vector<std::byte>(64));
    std::uint32_t answered = 0;
    for (std::uint32_t i = 0; i < count; ++i) {
        const auto request = message(i, 1 + i % 64);
        (*sessions)[i].call(echo, request, responses[i], {.timeout = 30s},
                            [&answered, wrong, request, &responses, i](Result<std::size_t> got) {
                                ++answered;
                                if (!got || *got != request.size() ||
                                    !echoed(responses[i], request))
                                    ++*wrong;
                            });
    }
    asio::steady_timer timer(rig->io);
    while (answered < count) {
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
}

// 1,000 sessions (a quarter as many under the sanitizers) on one server endpoint, set up
// over `transport`, a call on each at once; then every server session ends with its
// client's Session.
void thousand_sessions(Transport transport) {
    // both ends of every session's control connection live in this process
    rlimit files{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &files) == 0);
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, 8192);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &files) == 0);
    REQUIRE(files.rlim_cur >= 2200);
#if defined(__SANITIZE_ADDRESS__)
    // CI's sanitizer build: a quarter as many, the same paths (1,000 took 31 s of its
    // 40-minute budget there); the -Werror build runs all 1,000
    constexpr std::uint32_t count = 250;
#else
    constexpr std::uint32_t count = 1000;
#endif
    rpc::EndpointOptions options{.ring = 4096, .max_sessions = 1024, .credits = 2};
    options.session_transport = transport;
    Rig rig(options, options, transport == Transport::rdma_cm ? test::cm_address() : "127.0.0.1");
    std::vector<rpc::Session> sessions;
    int wrong = 0;
    run(rig.io, many_sessions(&rig, &sessions, count, &wrong), 300s);
    CHECK(wrong == 0);
    CHECK(sessions.size() == count);
    CHECK(rig.server->sessions() == count);
    CHECK(rig.server->counters().handled == count);
    sessions.clear(); // every server session ends with its control connection
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (rig.server->sessions() != 0 && std::chrono::steady_clock::now() < deadline)
        rig.io.run_for(10ms);
    CHECK(rig.server->sessions() == 0);
}

} // namespace

TEST_CASE("rpc endpoint: 1,000 sessions on one server endpoint, a call on each at once") {
    thousand_sessions(Transport::tcp);
}

TEST_CASE("rpc endpoint: 1,000 sessions set up over RDMA CM on one server endpoint, a call on each at once") {
    // the server's 1,000 control connections share its listener's one CQ (8 entries each)
    thousand_sessions(Transport::rdma_cm);
}

// ---------------------------------------------------------------------------------
// A server process killed with calls in flight, then restarted on the same port.

namespace {

// Where the server processes listen: TCP on loopback, or RDMA CM on the device's address.
struct Where {
    Transport transport = Transport::tcp;
    std::string address = "127.0.0.1";
    std::uint16_t port = 0;
};

// The server process: echo and hold_it at `at`, until killed. Started when `go` (a
// pipe) gives a byte. Never returns.
[[noreturn]] void server_process(const Where& at, int go) {
    char byte = 0;
    if (::read(go, &byte, 1) != 1)
        ::_exit(3);
    asio::io_context io;
    rpc::EndpointOptions options;
    options.listen_port = at.port;
    options.listen_address = at.address;
    options.session_transport = at.transport;
    auto server = rpc::Endpoint::create(io, options);
    if (!server)
        ::_exit(2);
    std::vector<rpc::Responder> held;
    (*server)->set_handler(echo, [](rpc::Request request, rpc::Responder responder) {
        responder.respond(request.bytes());
    });
    (*server)->set_handler(hold_it, [&held](rpc::Request, rpc::Responder responder) {
        held.push_back(std::move(responder));
    });
    for (;;)
        io.run_for(100ms);
}

struct Killed {
    int echoes = 0;                                // echo calls answered, both servers
    std::vector<Error> ended;                      // the held calls' Errors
    std::chrono::milliseconds took{};              // kill to the last held call's end
};

// Connects, retrying while the server process is not listening yet.
asio::awaitable<std::optional<rpc::Session>> connect_retrying(rpc::Endpoint* client, const Where* at) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (int attempt = 0; attempt < 300; ++attempt) {
        auto session = co_await client->connect(at->address, at->port);
        if (session)
            co_return std::optional<rpc::Session>(std::move(*session));
        timer.expires_after(100ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
    co_return std::nullopt;
}

asio::awaitable<void> outlive_the_server(rpc::Endpoint* client, const Where* at, pid_t first, int go_second,
                                         Killed* k) {
    std::vector<std::byte> request = message(5, 200), response(4096);
    auto session = co_await connect_retrying(client, at);
    REQUIRE(session);
    if (auto got = co_await session->call(echo, request, response); got && *got == request.size())
        ++k->echoes;
    // three calls the server holds, then the server dies
    int pending = 3;
    for (int i = 0; i < 3; ++i)
        session->call(hold_it, request, response, {.timeout = 60s}, [k, &pending](Result<std::size_t> got) {
            if (!got)
                k->ended.push_back(got.error());
            --pending;
        });
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(300ms); // the calls reach the server
    co_await timer.async_wait(asio::use_awaitable);
    const auto killed = std::chrono::steady_clock::now();
    ::kill(first, SIGKILL);
    while (pending > 0) {
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
    k->took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed);
    // the restarted server, on the same port
    session.reset();
    REQUIRE(::write(go_second, "g", 1) == 1);
    auto again = co_await connect_retrying(client, at);
    REQUIRE(again);
    if (auto got = co_await again->call(echo, request, response); got && *got == request.size())
        ++k->echoes;
}

// Two server processes on one port (the second started once the first is killed).
Killed kill_the_server(const Where& at) {
    int first_go[2], second_go[2];
    REQUIRE(::pipe(first_go) == 0);
    REQUIRE(::pipe(second_go) == 0);
    const pid_t first = ::fork();
    REQUIRE(first >= 0);
    if (first == 0)
        server_process(at, first_go[0]);
    const pid_t second = ::fork();
    REQUIRE(second >= 0);
    if (second == 0)
        server_process(at, second_go[0]);
    REQUIRE(::write(first_go[1], "g", 1) == 1);
    Killed k;
    {
        asio::io_context io;
        rpc::EndpointOptions options;
        options.session_transport = at.transport;
        auto client = must(rpc::Endpoint::create(io, options));
        run(io, outlive_the_server(client.get(), &at, first, second_go[1], &k), 120s);
    }
    ::kill(second, SIGKILL);
    ::waitpid(first, nullptr, 0);
    ::waitpid(second, nullptr, 0);
    for (const int fd : {first_go[0], first_go[1], second_go[0], second_go[1]})
        ::close(fd);
    return k;
}

void check_killed(const Killed& k) {
    CHECK(k.echoes == 2);
    REQUIRE(k.ended.size() == 3);
    for (const Error& e : k.ended)
        CHECK_MESSAGE(e.is_errno(ECONNRESET), e.message());
    MESSAGE("the held calls ended ", k.took.count(), " ms after the kill");
    CHECK(k.took < 5s);
}

} // namespace

TEST_CASE("rpc endpoint: a server process killed ends its sessions' calls at once; a restarted one serves") {
    check_killed(kill_the_server({.transport = Transport::tcp, .address = "127.0.0.1", .port = next_port()}));
}

TEST_CASE("rpc endpoint: over RDMA CM too, a server process killed ends its sessions' calls at once") {
    check_killed(kill_the_server({.transport = Transport::rdma_cm, .address = test::cm_address(), .port = next_port()}));
}

namespace {

struct KeptRequests {
    int wrong = 0;
    std::uint64_t copies_after_inline = 0;
};

// 500 one-packet echo calls answered inside the handler, then 8 (a window) whose
// handler keeps the Request and Responder and answers after it returned, from the
// request's bytes, once 200 calls on another session have gone through the server's
// small receive ring (the buffers the 8 came in are reused).
asio::awaitable<void> lend_and_keep(Rig* rig, std::optional<rpc::Session>* session,
                                    std::vector<std::pair<rpc::Request, rpc::Responder>>* kept, KeptRequests* out) {
    co_await connect_into(rig, session);
    std::optional<rpc::Session> traffic;
    co_await connect_into(rig, &traffic);
    const std::size_t one_packet = (*session)->info().payload_per_packet;
    std::vector<std::byte> response(one_packet);
    for (std::uint32_t n = 0; n < 500; ++n) {
        const auto request = message(n, n % (one_packet + 1));
        const auto got = co_await (*session)->call(echo, request, response, {.timeout = 20s});
        if (!got || *got != request.size() || !echoed(response, request))
            ++out->wrong;
    }
    out->copies_after_inline = rig->server->counters().request_copies;
    std::vector<std::vector<std::byte>> requests, responses(8, std::vector<std::byte>(one_packet));
    std::uint32_t answered = 0;
    for (std::uint32_t n = 0; n < 8; ++n) {
        requests.push_back(message(1000 + n, 100 + n));
        (*session)->call(later, requests[n], responses[n], {.timeout = 20s},
                         [&answered, out, n, &requests, &responses](Result<std::size_t> got) {
                             ++answered;
                             if (!got || *got != requests[n].size() || !echoed(responses[n], requests[n]))
                                 ++out->wrong;
                         });
    }
    co_await until([kept] { return kept->size() == 8; });
    for (std::uint32_t n = 0; n < 200; ++n) {
        const auto request = message(2000 + n, one_packet);
        const auto got = co_await traffic->call(echo, request, response, {.timeout = 20s});
        if (!got || *got != request.size() || !echoed(response, request))
            ++out->wrong;
    }
    for (auto& [request, responder] : *kept)
        responder.respond(request.bytes());
    co_await until([&answered] { return answered == 8; });
}

} // namespace

TEST_CASE("rpc endpoint: one-packet requests reach their handler uncopied; one kept past its handler is copied once") {
    Rig rig({.ring = 32, .credits = 16}); // two sessions' credits: the ring turns over every 32 packets
    std::vector<std::pair<rpc::Request, rpc::Responder>> kept;
    rig.server->set_handler(later, [&kept](rpc::Request request, rpc::Responder responder) {
        kept.emplace_back(request, std::move(responder));
    });
    std::optional<rpc::Session> session;
    KeptRequests out;
    run(rig.io, lend_and_keep(&rig, &session, &kept, &out), 60s);
    CHECK(out.wrong == 0);
    CHECK(out.copies_after_inline == 0);
    CHECK(rig.server->counters().request_copies == 8);
    CHECK(rig.server->counters().handled == 708);
}

namespace {

struct Waiting {
    std::optional<Result<std::size_t>> cancelled, timed_out;
    std::chrono::milliseconds timed_out_after{};
    std::uint64_t handled_while_waiting = 0;
    int answered_right = 0;
};

// A full window of held calls; behind them a patient call, then one with a short
// timeout and one cancelled: both end where they wait, never sent; then the held
// calls are answered and the patient one goes.
asio::awaitable<void> wait_in_queue(Rig* rig, std::optional<rpc::Session>* session, Waiting* out) {
    co_await connect_into(rig, session);
    rpc::Session& s = **session;
    const std::uint32_t window = s.info().window;
    const auto request = message(3, 40);
    std::vector<std::vector<std::byte>> responses(window, std::vector<std::byte>(64));
    for (std::uint32_t n = 0; n < window; ++n)
        s.call(hold_it, request, responses[n], {.timeout = 20s}, [out](Result<std::size_t> got) {
            out->answered_right += got && *got == 40;
        });
    co_await until([rig, window] { return rig->held.size() == window; });
    std::vector<std::byte> response(64), patient_response(64);
    std::optional<Result<std::size_t>> patient; // first in the queue: the others wait behind it
    s.call(echo, request, patient_response, {.timeout = 20s}, [&patient](Result<std::size_t> got) { patient = got; });
    const auto start = std::chrono::steady_clock::now();
    std::optional<Result<std::size_t>> timed_out;
    s.call(echo, request, response, {.timeout = 200ms},
           [&timed_out](Result<std::size_t> got) { timed_out = std::move(got); });
    // total (no side effect allowed): as good as any while it is unsent
    out->cancelled = co_await cancelled_call(&s, echo, request, response, 50ms, asio::cancellation_type::total);
    co_await until([&timed_out] { return timed_out.has_value(); });
    out->timed_out_after = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    out->timed_out = std::move(timed_out);
    out->handled_while_waiting = rig->server->counters().handled;
    for (rpc::Responder& responder : rig->held)
        responder.respond(request);
    rig->held.clear();
    co_await until([out, window, &patient] { return out->answered_right == static_cast<int>(window) && patient; });
    out->answered_right += *patient && **patient == 40;
}

} // namespace

TEST_CASE("rpc endpoint: a call waiting for a window slot is cancelled, or times out, where it waits, unsent") {
    Rig rig;
    std::optional<rpc::Session> session;
    Waiting out;
    run(rig.io, wait_in_queue(&rig, &session, &out), 60s);
    REQUIRE(out.cancelled);
    REQUIRE_FALSE(out.cancelled->has_value());
    CHECK(out.cancelled->error().is_cancelled());
    REQUIRE(out.timed_out);
    REQUIRE_FALSE(out.timed_out->has_value());
    CHECK(out.timed_out->error().is_timeout());
    CHECK(out.timed_out_after < 2s); // not held until the window had room
    CHECK(out.handled_while_waiting == session->info().window);
    CHECK(out.answered_right == static_cast<int>(session->info().window) + 1);
    CHECK(rig.server->counters().handled == session->info().window + 1); // the patient call
}

namespace {

struct SentCancelled {
    std::optional<Result<std::size_t>> total, partial;
    bool total_before_answer = false;
};

// A call the server holds, cancelled totally: the server may have run it (it holds
// it), so it goes on and ends with its answer; then one cancelled partially ends at once.
asio::awaitable<void> cancel_sent(Rig* rig, std::optional<rpc::Session>* session, SentCancelled* out) {
    co_await connect_into(rig, session);
    const auto request = message(3, 40);
    std::vector<std::byte> response(64);
    asio::cancellation_signal cancel;
    (*session)->call(hold_it, request, response, {.timeout = 20s},
                     asio::bind_cancellation_slot(cancel.slot(), [out](Result<std::size_t> r) { out->total = r; }));
    co_await until([rig] { return rig->held.size() == 1; });
    cancel.emit(asio::cancellation_type::total);
    co_await pause(50ms);
    out->total_before_answer = out->total.has_value();
    rig->held.back().respond(request);
    co_await until([out] { return out->total.has_value(); });
    out->partial = co_await cancelled_call(&**session, hold_it, request, response, 50ms,
                                           asio::cancellation_type::partial);
    rig->held.clear();
}

} // namespace

TEST_CASE("rpc endpoint: a call sent ignores a total cancellation (it may have run) and ends at a partial one") {
    Rig rig;
    std::optional<rpc::Session> session;
    SentCancelled out;
    run(rig.io, cancel_sent(&rig, &session, &out), 60s);
    CHECK_FALSE(out.total_before_answer);
    REQUIRE(out.total);
    CHECK((out.total->has_value() && **out.total == 40));
    REQUIRE(out.partial);
    REQUIRE_FALSE(out.partial->has_value());
    CHECK(out.partial->error().is_cancelled());
}

namespace {

struct BothWays {
    int wrong = 0;
    std::optional<Error> after_server_left;
};

// A session of the client's, once the server has its handle too.
asio::awaitable<void> connect_both_ways(Rig* rig, std::optional<rpc::Session>* session,
                                        const std::vector<rpc::Session>* accepted) {
    const std::size_t before = accepted->size();
    co_await connect_into(rig, session);
    co_await until([accepted, before] { return accepted->size() == before + 1; });
}

asio::awaitable<void> echo_session(rpc::Session* session, std::uint32_t first, std::uint32_t calls, std::size_t max_size,
                                   int* wrong, std::uint32_t* finished) {
    std::vector<std::byte> response(max_size);
    for (std::uint32_t n = first; n < first + calls; ++n) {
        const auto request = message(n, (n * 7919u) % (max_size + 1));
        const auto got = co_await session->call(echo, request, response, {.timeout = 20s});
        if (!got)
            MESSAGE("call ", n, ": ", got.error().message());
        if (!got || *got != request.size() || !echoed(response, request))
            ++*wrong;
    }
    ++*finished;
}

// Calls both ways at once on one session, 40 KB the largest (both ends' large calls
// take the RC path, whose offers may cross); then the server drops its handle.
asio::awaitable<void> call_both_ways(Rig* rig, std::optional<rpc::Session>* session,
                                     std::vector<rpc::Session>* accepted, BothWays* out) {
    co_await connect_both_ways(rig, session, accepted);
    std::uint32_t finished = 0;
    const auto executor = co_await asio::this_coro::executor;
    for (std::uint32_t c = 0; c < 3; ++c) {
        asio::co_spawn(executor, echo_session(&**session, c * 100, 100, 40'000, &out->wrong, &finished),
                       asio::detached);
        asio::co_spawn(executor, echo_session(&accepted->front(), 1000 + c * 100, 100, 40'000, &out->wrong, &finished),
                       asio::detached);
    }
    co_await until([&finished] { return finished == 6; });
    accepted->clear(); // the server ends the session
    co_await until([rig] { return rig->client->sessions() == 0; });
    std::vector<std::byte> response(64);
    const auto got = co_await (*session)->call(echo, message(1, 10), response);
    if (!got)
        out->after_server_left = got.error();
}

// The server's sessions go into `accepted` (declared after the Rig: the sessions end
// before the endpoints), and the client answers echo too.
void serve_both_ways(Rig& rig, std::vector<rpc::Session>& accepted) {
    rig.server->set_accept_handler([&accepted](rpc::Session session) { accepted.push_back(std::move(session)); });
    rig.client->set_handler(echo, [](rpc::Request request, rpc::Responder responder) {
        responder.respond(request.bytes());
    });
}

// Both ends' large calls on one both-ways session, four each, after the RC path's
// setup: how many ended with an answer other than their request's echo.
asio::awaitable<int> large_calls_both_ways(rpc::Session& server_side, rpc::Session& client_side) {
    int wrong = 0;
    std::vector<std::byte> response(300'000);
    for (std::uint32_t n = 0; n < 8; ++n) {
        rpc::Session& caller = n < 4 ? server_side : client_side;
        const auto request = message(n, 200'000 + n);
        const auto got = co_await caller.call(echo, request, response, {.timeout = 30s});
        if (!got)
            MESSAGE("call ", n, ": ", got.error().message());
        if (!got || *got != request.size() || !echoed(response, request))
            ++wrong;
    }
    co_return wrong;
}

// A rig of endpoints that take messages up to 1 MiB, served both ways: the client's
// session and the server's (accepted) end before the endpoints.
struct LargeBothWays {
    Rig rig;
    std::vector<rpc::Session> accepted;
    std::optional<rpc::Session> session;

    explicit LargeBothWays(std::chrono::milliseconds setup_timeout = rpc::EndpointOptions{}.setup_timeout)
        : rig(options(setup_timeout), options(setup_timeout)) {
        serve_both_ways(rig, accepted);
    }

private:
    static rpc::EndpointOptions options(std::chrono::milliseconds setup_timeout) {
        return {.max_request = 1 << 20, .max_response = 1 << 20, .setup_timeout = setup_timeout};
    }
};

// call_both_ways on a rig served both ways.
BothWays both_ways(Rig& rig, std::vector<rpc::Session>& accepted) {
    serve_both_ways(rig, accepted);
    std::optional<rpc::Session> session;
    BothWays out;
    run(rig.io, call_both_ways(&rig, &session, &accepted, &out), 120s);
    return out;
}

} // namespace

TEST_CASE("rpc endpoint: a server with an accept handler calls its clients back on their sessions") {
    Rig rig;
    std::vector<rpc::Session> accepted;
    const BothWays out = both_ways(rig, accepted);
    CHECK(out.wrong == 0);
    CHECK(rig.client->counters().handled == 300);
    CHECK(rig.server->counters().handled == 300);
    CHECK(rig.client->counters().rdma_reads > 0); // the server's large calls: the RC path
    CHECK(rig.server->counters().rdma_reads > 0); // the client's
    CHECK(rig.client->counters().failed == 1);     // only the call after the server left
    CHECK(rig.server->counters().failed == 0);
    REQUIRE(out.after_server_left);
    CHECK(out.after_server_left->is_errno(ECONNRESET));
    CHECK(rig.server->sessions() == 0);
}

namespace {

// Sets the server's accept handler as soon as a client's session is attached there:
// before its setup's reply has been written, as the handler re-posts itself and so
// runs between any two other handlers on the (one-threaded) io_context.
void set_accept_handler_once_attached(Rig* rig, std::vector<rpc::Session>* accepted) {
    asio::post(rig->io, [rig, accepted] {
        if (rig->server->sessions() == 0)
            return set_accept_handler_once_attached(rig, accepted);
        rig->server->set_accept_handler([accepted](rpc::Session session) { accepted->push_back(std::move(session)); });
    });
}

asio::awaitable<void> two_sessions(Rig* rig, std::optional<rpc::Session>* first, std::optional<rpc::Session>* second,
                                   std::size_t* accepted_after_first, const std::vector<rpc::Session>* accepted) {
    co_await connect_into(rig, first);
    co_await pause(50ms);
    *accepted_after_first = accepted->size();
    co_await connect_into(rig, second);
    co_await until([accepted] { return !accepted->empty(); }); // the second session's handle
}

} // namespace

// A session admitted one way (no accept handler then) has no client window at the
// server: a handle to it would call into nothing.
TEST_CASE("rpc endpoint: an accept handler set while a one-way session's setup reply goes gets no handle to "
          "that session, and one to the next") {
    Rig rig;
    std::vector<rpc::Session> accepted;
    set_accept_handler_once_attached(&rig, &accepted);
    std::optional<rpc::Session> first, second;
    std::size_t accepted_after_first = 0;
    run(rig.io, two_sessions(&rig, &first, &second, &accepted_after_first, &accepted), 30s);
    CHECK(accepted_after_first == 0);
    CHECK(accepted.size() == 1); // the second session's
    CHECK(rig.server->sessions() == 2);
    accepted.clear();
}

TEST_CASE("rpc endpoint: lending through windows, a both-ways session's own large calls go by UD (its QP carries "
          "the peer's READs and WRITEs)" *
          doctest::skip(!test::device_has_windows())) {
    Rig rig({}, lending_through_windows({}));
    std::vector<rpc::Session> accepted;
    CHECK(both_ways(rig, accepted).wrong == 0);
    CHECK(rig.client->counters().rdma_reads > 0);  // the server's large calls: the RC path
    CHECK(rig.server->counters().rdma_reads == 0); // the client's: UD
    CHECK(rig.server->counters().rdma_writes == 0);
    CHECK(rig.client->counters().failed == 1); // only the call after the server left
    CHECK(rig.server->counters().failed == 0);
}

namespace {

// The server's large calls set the RC path up (its end offers); the client's then use it.
asio::awaitable<void> server_calls_first(Rig* rig, std::optional<rpc::Session>* session,
                                         std::vector<rpc::Session>* accepted, int* wrong) {
    co_await connect_both_ways(rig, session, accepted);
    *wrong = co_await large_calls_both_ways(accepted->front(), **session);
}

} // namespace

TEST_CASE("rpc endpoint: on a both-ways session the server's first large call sets the RC path up for both") {
    LargeBothWays t;
    int wrong = 0;
    run(t.rig.io, server_calls_first(&t.rig, &t.session, &t.accepted, &wrong), 120s);
    CHECK(wrong == 0);
    CHECK(t.rig.client->counters().rdma_reads == 4);  // the server's requests, READ by the client
    CHECK(t.rig.client->counters().rdma_writes == 4); // and their responses
    CHECK(t.rig.server->counters().rdma_reads == 4);  // the client's, on the same QPs
    CHECK(t.rig.server->counters().rdma_writes == 4);
}

namespace {

// The io_context's run_blocking helpers (four: blocking.hpp) each held for `span`: the
// server's watch() resolves the peer's MAC on one before it takes an RC offer, so its
// answer waits that long.
asio::awaitable<void> hold_a_helper(std::chrono::milliseconds span) {
    auto sleep = [span] {
        std::this_thread::sleep_for(span);
        return Result<void>{};
    };
    (void)co_await async::run_blocking(sleep, "test: a helper held");
}

struct LateAnswer {
    bool first_by_ud = false; // the client's first large call, once its offer timed out
    int wrong = 0;            // large calls at either end after the answer came
};

asio::awaitable<void> answer_after_the_offer_expired(Rig* rig, std::optional<rpc::Session>* session,
                                                     std::vector<rpc::Session>* accepted, LateAnswer* out) {
    co_await connect_both_ways(rig, session, accepted);
    const auto executor = co_await asio::this_coro::executor;
    for (int k = 0; k < 4; ++k)
        asio::co_spawn(executor, hold_a_helper(4500ms), asio::detached);
    std::vector<std::byte> response(300'000);
    // its offer waits 4.5 s at the server, its setup_timeout is 1.5 s
    const auto first = message(99, 200'000);
    const auto got = co_await (*session)->call(echo, first, response, {.timeout = 30s});
    out->first_by_ud = got && *got == first.size() && echoed(response, first) &&
                       rig->server->counters().rdma_reads == 0;
    // the server takes the offer once a helper is free, answers, and calls at once (its
    // first request may come before the client has the answer: it waits for it there)
    co_await until([accepted] { return rpc::detail::rc_qp_of(accepted->front()) != nullptr; });
    out->wrong = co_await large_calls_both_ways(accepted->front(), **session);
}

} // namespace

// The offering end's large calls go by UD once its setup_timeout passes, but it keeps
// its QP and takes the late answer: the end that answered calls over the path at once.
TEST_CASE("rpc endpoint: on a both-ways session an RC answer that comes after the offer's setup_timeout still sets "
          "the path up: the answering end's large calls succeed") {
    LargeBothWays t(1500ms);
    LateAnswer out;
    run(t.rig.io, answer_after_the_offer_expired(&t.rig, &t.session, &t.accepted, &out), 120s);
    CHECK(out.first_by_ud);
    CHECK(out.wrong == 0);
    CHECK(t.rig.client->counters().rdma_reads == 4); // the server's requests, READ by the client
    CHECK(t.rig.server->counters().rdma_reads == 4); // the client's after the answer
}

namespace {

struct NoQpToOffer {
    std::optional<Result<std::size_t>> first; // the client's large call, its QP not made
    bool first_echoed = false;
    int wrong = 0;                            // large calls at either end afterwards
    std::uint32_t sessions = 0;               // the client's, after them
};

// The client's first large call would offer an RC QP, but none may be made: the kernel
// refuses the process any verbs object while the call begins (its RC CQ is the first).
asio::awaitable<void> offer_without_a_qp(Rig* rig, std::optional<rpc::Session>* session,
                                         std::vector<rpc::Session>* accepted, NoQpToOffer* out) {
    co_await connect_both_ways(rig, session, accepted);
    const auto request = message(99, 200'000);
    std::vector<std::byte> response(300'000);
    {
        const std::string device = must(Context::open()).name();
        test::NoRdmaObjects refused(device);
        (*session)->call(echo, request, response, {.timeout = 30s},
                         [out](Result<std::size_t> got) { out->first = std::move(got); });
    }
    co_await until([out] { return out->first.has_value(); });
    out->first_echoed = *out->first && **out->first == request.size() && echoed(response, request);
    // the server's own first large call offers its QP; then both ends' calls
    out->wrong = co_await large_calls_both_ways(accepted->front(), **session);
    out->sessions = rig->client->sessions();
}

} // namespace

// The client never told the server it wanted the RC path, so the server's own offer
// is its first: answered "unavailable", not taken for a second offer (which ended the
// session, every call on it failing).
TEST_CASE("rpc endpoint: on a both-ways session whose client could not make its RC QP, the server's offer is "
          "answered: both ends' large calls go by UD on the same session" *
          doctest::skip(!test::may_limit_rdma_objects())) {
    LargeBothWays t;
    NoQpToOffer out;
    run(t.rig.io, offer_without_a_qp(&t.rig, &t.session, &t.accepted, &out), 120s);
    REQUIRE(out.first.has_value());
    CHECK_MESSAGE(out.first->has_value(), (*out.first ? "" : out.first->error().message()));
    CHECK(out.first_echoed);
    CHECK(out.wrong == 0);
    CHECK(out.sessions == 1);
    CHECK(t.rig.client->counters().rdma_reads == 0); // every large call by UD
    CHECK(t.rig.server->counters().rdma_reads == 0);
    CHECK(t.rig.client->counters().handled == 4);
    CHECK(t.rig.server->counters().handled == 5);
}

namespace {

struct QpRefusesToConnect {
    std::optional<Result<std::size_t>> call; // the client's large call that offered
    std::uint32_t client_sessions = 0;       // once the server's session ended too
    int wrong = 0; // large calls at either end on a new session
};

// `session`'s RC QP, in RESET, moved to ERR behind its back (through INIT: the device
// allows no RESET -> ERR): the first step of its connect (to INIT) is then refused.
void break_for_connect(rpc::Session& session) {
    QueuePair* qp = rpc::detail::rc_qp_of(session);
    REQUIRE(qp != nullptr);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    REQUIRE(ibv_modify_qp(qp->get(), &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
            0);
    set_state(session, IBV_QPS_ERR);
}

// The client's QP, made for its offer, is moved to ERR before the server's answer
// comes (the server connects its own QP first): its connect then fails for real.
asio::awaitable<void> connect_refused(Rig* rig, std::optional<rpc::Session>* session,
                                      std::vector<rpc::Session>* accepted, QpRefusesToConnect* out) {
    co_await connect_both_ways(rig, session, accepted);
    const auto request = message(99, 200'000);
    std::vector<std::byte> response(300'000);
    (*session)->call(echo, request, response, {.timeout = 30s},
                     [out](Result<std::size_t> got) { out->call = std::move(got); });
    break_for_connect(**session);
    co_await until([out] { return out->call.has_value(); });
    if (*out->call)
        co_return; // by UD: the session lives on, and the server's large calls would fail
    co_await until([rig] { return rig->server->sessions() == 0; });
    out->client_sessions = rig->client->sessions();
    // a new session sets the path up again, and both ends use it
    std::optional<rpc::Session> next;
    co_await connect_both_ways(rig, &next, accepted);
    out->wrong = co_await large_calls_both_ways(accepted->back(), *next);
}

} // namespace

// The server answered with its QP connected: its large calls would take the path and
// each fail at the client (transfer failed), for the session's life. The session ends
// instead, and a new one works.
TEST_CASE("rpc endpoint: on a both-ways session whose client cannot connect its RC QP to the server's answer, the "
          "session ends and a new one carries large calls both ways") {
    LargeBothWays t;
    QpRefusesToConnect out;
    run(t.rig.io, connect_refused(&t.rig, &t.session, &t.accepted, &out), 120s);
    REQUIRE(out.call.has_value());
    REQUIRE_FALSE(out.call->has_value());
    CHECK_MESSAGE(out.call->error().is_errno(ECONNRESET), out.call->error().message());
    CHECK(out.client_sessions == 0);
    CHECK(out.wrong == 0);
    CHECK(t.rig.client->counters().rdma_reads == 4); // the server's requests, on the new session
    CHECK(t.rig.server->counters().rdma_reads == 4); // the client's
}

namespace {

// A coroutine handler: it waits, then answers with the request reversed.
asio::awaitable<void> reverse_later(rpc::Request request, rpc::Responder responder) {
    co_await pause(2ms);
    std::vector<std::byte> reversed(request.bytes().rbegin(), request.bytes().rend());
    responder.respond(reversed);
}

asio::awaitable<void> call_coroutine_handler(Rig* rig, std::optional<rpc::Session>* session, int* wrong) {
    co_await connect_into(rig, session);
    std::uint32_t finished = 0;
    std::vector<std::vector<std::byte>> requests, responses(8, std::vector<std::byte>(3000));
    for (std::uint32_t n = 0; n < 8; ++n) {
        requests.push_back(message(n, 100 + n * 350)); // one packet to several
        std::ranges::reverse(requests.back());
        (*session)->call(later, requests[n], responses[n], {.timeout = 20s},
                         [&finished, wrong, n, &requests, &responses](Result<std::size_t> got) {
                             ++finished;
                             const std::vector<std::byte> want(requests[n].rbegin(), requests[n].rend());
                             if (!got || *got != want.size() || !echoed(responses[n], want))
                                 ++*wrong;
                         });
    }
    co_await until([&finished] { return finished == 8; });
}

} // namespace

TEST_CASE("rpc endpoint: a coroutine handler co_awaits before it answers, 8 at once") {
    Rig rig;
    rig.server->set_coroutine_handler(later, reverse_later);
    std::optional<rpc::Session> session;
    int wrong = 0;
    run(rig.io, call_coroutine_handler(&rig, &session, &wrong), 60s);
    CHECK(wrong == 0);
    CHECK(rig.server->counters().handled == 8);
}

namespace {

// What the handlers below hold, seen from outside them (a handler destroyed early
// cannot be asked about its own captures).
constexpr std::uint8_t waiting = 7; // a coroutine handler that waits 50 ms

std::weak_ptr<const std::vector<std::byte>> plain_answer, coroutine_answer;
bool plain_answer_alive = false;

struct Replaced {
    int right = 0, wrong = 0;
    bool kept_while_waiting = false, freed_after = false;
};

// A plain handler that removes itself, then answers from its captures; then three calls
// to a coroutine handler removed while each coroutine waits.
asio::awaitable<void> call_replaced_handlers(Rig* rig, std::optional<rpc::Session>* session, Replaced* out) {
    co_await connect_into(rig, session);
    std::vector<std::byte> response(64);
    const auto want = *plain_answer.lock();
    auto got = co_await (*session)->call(later, message(1, 8), response);
    (got && *got == want.size() && echoed(response, want) ? out->right : out->wrong)++;
    // the small echo handler's answer, then its successor's
    for (const auto& small_want : {message(8, 24), message(9, 24)}) {
        got = co_await (*session)->call(echo, message(1, 8), response);
        (got && *got == small_want.size() && echoed(response, small_want) ? out->right : out->wrong)++;
    }
    int finished = 0;
    std::vector<std::vector<std::byte>> responses(3, std::vector<std::byte>(64));
    for (auto& r : responses)
        (*session)->call(waiting, message(2, 8), r, {.timeout = 20s}, [&finished, &r, out](Result<std::size_t> got) {
            const auto want = message(6, 40);
            (got && *got == want.size() && echoed(r, want) ? out->right : out->wrong)++;
            ++finished;
        });
    co_await until([rig] { return rig->server->counters().handled == 6; });
    rig->server->set_coroutine_handler(waiting, nullptr);
    out->kept_while_waiting = !coroutine_answer.expired();
    co_await until([&finished] { return finished == 3; });
    co_await pause(5ms);
    out->freed_after = coroutine_answer.expired();
}

} // namespace

TEST_CASE("rpc endpoint: a handler replaced as it runs, or while its coroutines wait, lives until they end") {
    // Destroyed at once, a plain handler that replaced itself went on in freed
    // captures, and so did a coroutine handler's coroutines after it was replaced.
    Rig rig;
    auto plain = std::make_shared<const std::vector<std::byte>>(message(5, 40));
    plain_answer = plain;
    rig.server->set_handler(later, [plain, server = rig.server.get()](rpc::Request, rpc::Responder responder) {
        server->set_handler(later, nullptr);
        plain_answer_alive = !plain_answer.expired();
        responder.respond(*plain);
    });
    plain.reset();
    // A lambda small enough to live inside its std::function, replaced by one of the same
    // shape: moved out of the handler table, it read the new one's captures.
    static const auto right = message(8, 24), wrong = message(9, 24); // static: captured by neither
    rpc::Endpoint* const server = rig.server.get();
    rig.server->set_handler(echo, [server, answer = &right](rpc::Request, rpc::Responder responder) {
        server->set_handler(echo, [server, answer = &wrong](rpc::Request, rpc::Responder r) { r.respond(*answer); });
        responder.respond(*answer);
    });
    auto answer = std::make_shared<const std::vector<std::byte>>(message(6, 40));
    coroutine_answer = answer;
    rig.server->set_coroutine_handler(
        waiting, [answer](rpc::Request, rpc::Responder responder) -> asio::awaitable<void> {
            co_await pause(50ms);
            responder.respond(*answer);
        });
    answer.reset();
    std::optional<rpc::Session> session;
    Replaced out;
    run(rig.io, call_replaced_handlers(&rig, &session, &out), 60s);
    CHECK(plain_answer_alive);
    CHECK(plain_answer.expired()); // once the handler returned
    CHECK(out.right == 6);
    CHECK(out.wrong == 0);
    CHECK(out.kept_while_waiting);
    CHECK(out.freed_after);
}

TEST_CASE("rpc endpoint: a call completes on the executor its handler names: a future's, a strand, another "
          "io_context's") {
    // A future's executor and a strand did not compile; a handler bound to another
    // io_context got the endpoint's handler memory, which that io_context's thread then
    // freed into, unsynchronized (or after the endpoint's io_context was gone).
    asio::io_context other;
    std::optional<Result<std::size_t>> on_other;
    {
        Rig rig;
        std::optional<rpc::Session> session;
        run(rig.io, connect_into(&rig, &session), 30s);
        const auto request = message(3, 100);
        std::vector<std::byte> first(200), second(200), third(200);
        std::future<Result<std::size_t>> future = session->call(echo, request, first, {}, asio::use_future);
        const auto strand = asio::make_strand(rig.io);
        std::optional<Result<std::size_t>> by_strand;
        bool in_strand = false;
        session->call(echo, request, second, {},
                      asio::bind_executor(strand, [&by_strand, &in_strand, &strand](Result<std::size_t> got) {
                          in_strand = strand.running_in_this_thread();
                          by_strand = std::move(got);
                      }));
        session->call(echo, request, third, {},
                      asio::bind_executor(other, [&on_other](Result<std::size_t> got) { on_other = std::move(got); }));
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while ((future.wait_for(0s) != std::future_status::ready || !by_strand ||
                rig.client->counters().completed < 3) &&
               std::chrono::steady_clock::now() < deadline)
            rig.io.run_for(5ms);
        REQUIRE(future.wait_for(0s) == std::future_status::ready);
        const Result<std::size_t> got = future.get();
        CHECK((got && *got == request.size() && echoed(first, request)));
        REQUIRE(by_strand);
        CHECK((*by_strand && **by_strand == request.size() && echoed(second, request)));
        CHECK(in_strand);
        CHECK(rig.client->counters().completed == 3);
        CHECK(!on_other); // posted to `other`, which nobody runs yet
        session.reset();
    } // the endpoints and their io_context are gone: what `other` holds owes them nothing
    other.run();
    REQUIRE(on_other);
    CHECK(on_other->has_value());
}

// ---------------------------------------------------------------------------------
// Session::close(): graceful, bounded

namespace {

constexpr std::uint8_t slow = 6; // answered 20 ms later (a coroutine handler)

asio::awaitable<void> answer_slowly(rpc::Request request, rpc::Responder responder) {
    co_await pause(20ms);
    responder.respond(request.bytes());
}

struct Closing {
    int answered = 0, wrong = 0;
    std::optional<Result<std::size_t>> during, after;
    std::optional<Result<void>> closed, joined, closed_again;
};

// Five slow calls on a window of 2 (three queued), then close(): each finishes with its
// response; a call made while the session closes, and one after, are refused.
asio::awaitable<void> close_with_calls(Rig* rig, std::optional<rpc::Session>* session, Closing* out) {
    co_await connect_into(rig, session);
    std::vector<std::vector<std::byte>> requests, responses(5, std::vector<std::byte>(2000));
    for (std::uint32_t n = 0; n < 5; ++n) {
        requests.push_back(message(n, 100 + n * 300));
        (*session)->call(slow, requests[n], responses[n], {.timeout = 10s},
                         [out, n, &requests, &responses](Result<std::size_t> got) {
                             if (got && *got == requests[n].size() && echoed(responses[n], requests[n]))
                                 ++out->answered;
                             else
                                 ++out->wrong;
                         });
    }
    std::vector<std::byte> response(64);
    const auto executor = co_await asio::this_coro::executor;
    asio::co_spawn(executor, (*session)->close(10s), [out](std::exception_ptr, Result<void> r) { out->closed = r; });
    asio::co_spawn(executor, (*session)->close(10s), [out](std::exception_ptr, Result<void> r) { out->joined = r; });
    co_await pause(1ms); // close() begins (co_spawn posts its start)
    out->during = co_await (*session)->call(echo, message(9, 10), response);
    co_await until([out] { return out->closed.has_value() && out->joined.has_value(); });
    out->after = co_await (*session)->call(echo, message(9, 10), response);
    out->closed_again = co_await (*session)->close(10s);
}

} // namespace

TEST_CASE("rpc endpoint: close() lets the calls begun and queued finish, then ends the session at both ends; a "
          "second close() joins it") {
    Rig rig({}, {.window = 2});
    rig.server->set_coroutine_handler(slow, answer_slowly);
    std::optional<rpc::Session> session;
    Closing out;
    run(rig.io, close_with_calls(&rig, &session, &out), 60s);
    CHECK(out.answered == 5);
    CHECK(out.wrong == 0);
    REQUIRE(out.closed);
    CHECK_MESSAGE(out.closed->has_value(), (*out.closed ? "" : out.closed->error().message()));
    REQUIRE(out.joined); // a second close() meanwhile waits for the same end
    CHECK_MESSAGE(out.joined->has_value(), (*out.joined ? "" : out.joined->error().message()));
    REQUIRE(out.during);
    REQUIRE(!*out.during);
    CHECK(out.during->error().is_errno(ECONNRESET));
    CHECK(out.during->error().message().find("closing") != std::string::npos);
    REQUIRE(out.after);
    REQUIRE(!*out.after);
    CHECK(out.after->error().is_errno(ECONNRESET));
    REQUIRE(out.closed_again);
    CHECK(out.closed_again->has_value()); // ended already: nothing to do
    CHECK(rig.client->sessions() == 0);
    CHECK(rig.server->sessions() == 0); // it ended the session before the client's close() returned
    CHECK(rig.server->counters().handled == 5);
}

namespace {

struct HeldClose {
    std::optional<Result<std::size_t>> held;
    std::optional<Result<void>> closed, right_away, cancelled;
    std::chrono::steady_clock::duration right_away_took{};
};

// A call the server holds keeps close() from finishing: its timeout ends the session.
// Then: close() right after connect (before the session's watcher has begun), and a
// close() cancelled while a held call keeps it waiting.
asio::awaitable<void> close_held(Rig* rig, HeldClose* out) {
    std::optional<rpc::Session> session;
    co_await connect_into(rig, &session);
    std::vector<std::byte> response(64);
    const auto request = message(1, 10);
    session->call(hold_it, request, response, {.timeout = 10s},
                  [out](Result<std::size_t> got) { out->held = std::move(got); });
    co_await until([rig] { return rig->held.size() == 1; });
    out->closed = co_await session->close(300ms);
    co_await until([out] { return out->held.has_value(); });
    co_await until([rig] { return rig->server->sessions() == 0; });

    std::optional<rpc::Session> fresh;
    co_await connect_into(rig, &fresh);
    const auto began = std::chrono::steady_clock::now();
    out->right_away = co_await fresh->close(10s);
    out->right_away_took = std::chrono::steady_clock::now() - began;

    std::optional<rpc::Session> third;
    co_await connect_into(rig, &third);
    third->call(hold_it, request, response, {.timeout = 10s}, [](Result<std::size_t>) {});
    co_await until([rig] { return rig->held.size() == 2; });
    asio::cancellation_signal cancel;
    asio::co_spawn(co_await asio::this_coro::executor, third->close(10s),
                   asio::bind_cancellation_slot(cancel.slot(),
                                                [out](std::exception_ptr, Result<void> r) { out->cancelled = r; }));
    co_await pause(50ms);
    cancel.emit(asio::cancellation_type::terminal);
    co_await until([out] { return out->cancelled.has_value(); });
}

} // namespace

TEST_CASE("rpc endpoint: close() times out on a call the server holds, is cancellable, and works right after connect") {
    Rig rig;
    HeldClose out;
    run(rig.io, close_held(&rig, &out), 60s);
    REQUIRE(out.closed);
    REQUIRE(!*out.closed);
    CHECK(out.closed->error().is_timeout());
    REQUIRE(out.held);
    REQUIRE(!*out.held);
    CHECK(out.held->error().is_errno(ECONNRESET)); // as a destroyed Session's calls
    REQUIRE(out.right_away);
    CHECK_MESSAGE(out.right_away->has_value(), (*out.right_away ? "" : out.right_away->error().message()));
    CHECK(out.right_away_took < 5s); // not the timeout: the goodbye went out once the watcher began
    REQUIRE(out.cancelled);
    REQUIRE(!*out.cancelled);
    CHECK(out.cancelled->error().is_cancelled());
    CHECK(rig.client->sessions() == 0);
}

namespace {

struct PeerFinishes {
    int answered = 0, wrong = 0, echoed_before = 0;
    std::vector<std::pair<rpc::Request, rpc::Responder>> held; // at the client
    std::optional<Result<void>> closed;
    std::optional<Error> refused;
};

// On a both-ways session the server calls the client, which holds the calls; the client
// closes meanwhile. The server calls on until one is refused (the goodbye has come: a
// call waiting for a window slot, the held calls' slots, ends then, not begun), then
// the client answers the held calls: they finish, and only then the session ends.
asio::awaitable<void> close_while_called(Rig* rig, std::optional<rpc::Session>* session,
                                         std::vector<rpc::Session>* accepted, PeerFinishes* out) {
    co_await connect_both_ways(rig, session, accepted);
    std::vector<std::vector<std::byte>> requests, responses(4, std::vector<std::byte>(2000));
    for (std::uint32_t n = 0; n < 4; ++n) {
        requests.push_back(message(n, 50 + n * 400));
        accepted->front().call(hold_it, requests[n], responses[n], {.timeout = 20s},
                               [out, n, &requests, &responses](Result<std::size_t> got) {
                                   if (got && *got == requests[n].size() && echoed(responses[n], requests[n]))
                                       ++out->answered;
                                   else
                                       ++out->wrong;
                               });
    }
    co_await until([out] { return out->held.size() == 4; });
    const auto executor = co_await asio::this_coro::executor;
    asio::co_spawn(executor, (*session)->close(20s), [out](std::exception_ptr, Result<void> r) { out->closed = r; });
    std::vector<std::byte> response(64);
    const auto request = message(7, 10);
    while (!out->refused) { // answered until the goodbye comes (the client serves on while it closes)
        const auto got = co_await accepted->front().call(echo, request, response, {.timeout = 10s});
        if (got)
            ++out->echoed_before;
        else
            out->refused = got.error();
    }
    CHECK(!out->closed); // the held calls keep the session
    for (auto& [held_request, responder] : out->held)
        responder.respond(held_request.bytes());
    out->held.clear();
    co_await until([out] { return out->closed.has_value(); });
}

} // namespace

TEST_CASE("rpc endpoint: close() at one end of a both-ways session lets the other end's calls finish") {
    Rig rig;
    std::vector<rpc::Session> accepted;
    PeerFinishes out;
    rig.server->set_accept_handler([&accepted](rpc::Session session) { accepted.push_back(std::move(session)); });
    rig.client->set_handler(hold_it, [&out](rpc::Request request, rpc::Responder responder) {
        out.held.emplace_back(std::move(request), std::move(responder));
    });
    rig.client->set_handler(echo, [](rpc::Request request, rpc::Responder responder) {
        responder.respond(request.bytes());
    });
    std::optional<rpc::Session> session;
    run(rig.io, close_while_called(&rig, &session, &accepted, &out), 60s);
    CHECK(out.answered == 4);
    CHECK(out.wrong == 0);
    REQUIRE(out.closed);
    CHECK_MESSAGE(out.closed->has_value(), (*out.closed ? "" : out.closed->error().message()));
    REQUIRE(out.refused);
    CHECK(out.refused->is_errno(ECONNRESET));
    CHECK(out.refused->message().find("the peer is closing") != std::string::npos);
    MESSAGE("echo calls answered before the goodbye came: ", out.echoed_before);
    CHECK(rig.server->sessions() == 0);
    CHECK(rig.client->sessions() == 0);
    accepted.clear();
}

namespace {

struct ShutDown {
    int answered = 0, wrong = 0, echoed_before = 0;
    std::optional<Result<void>> shut;
    std::optional<Error> refused_call, refused_setup, after;
};

// Three sessions with two calls the server holds on each; the server shuts down. A
// client calls on until one call is refused (the goodbye has come); a new setup is
// refused; then the held calls are answered: they finish, and the shutdown with them.
asio::awaitable<void> shut_down_server(Rig* rig, ShutDown* out) {
    std::vector<rpc::Session> sessions;
    for (int i = 0; i < 3; ++i) {
        auto session = co_await rig->client->connect("127.0.0.1", rig->port);
        REQUIRE_MESSAGE(session.has_value(), (session ? "" : session.error().message()));
        sessions.push_back(std::move(*session));
    }
    std::vector<std::vector<std::byte>> responses(6, std::vector<std::byte>(64));
    const auto request = message(3, 100);
    for (std::size_t n = 0; n < 6; ++n)
        sessions[n % 3].call(hold_it, request, responses[n], {.timeout = 20s}, [out](Result<std::size_t> got) {
            if (got && *got == 0)
                ++out->answered;
            else
                ++out->wrong;
        });
    co_await until([rig] { return rig->held.size() == 6; });
    const auto executor = co_await asio::this_coro::executor;
    asio::co_spawn(executor, rig->server->shutdown(20s), [out](std::exception_ptr, Result<void> r) { out->shut = r; });
    std::vector<std::byte> response(request.size());
    while (!out->refused_call) {
        const auto got = co_await sessions[0].call(echo, request, response, {.timeout = 10s});
        if (got)
            ++out->echoed_before;
        else
            out->refused_call = got.error();
    }
    if (auto extra = co_await rig->client->connect("127.0.0.1", rig->port); !extra)
        out->refused_setup = extra.error();
    CHECK(!out->shut); // the held calls keep their sessions
    for (rpc::Responder& responder : rig->held)
        responder.respond({});
    rig->held.clear();
    co_await until([out] { return out->shut.has_value(); });
    if (auto later = co_await rig->client->connect("127.0.0.1", rig->port); !later)
        out->after = later.error();
}

} // namespace

TEST_CASE("rpc endpoint: a server's shutdown() lets its clients finish their calls, refuses setups, then stops "
          "listening") {
    Rig rig;
    ShutDown out;
    run(rig.io, shut_down_server(&rig, &out), 60s);
    CHECK(out.answered == 6);
    CHECK(out.wrong == 0);
    REQUIRE(out.shut);
    CHECK_MESSAGE(out.shut->has_value(), (*out.shut ? "" : out.shut->error().message()));
    REQUIRE(out.refused_call);
    CHECK_MESSAGE(out.refused_call->is_errno(ECONNRESET), out.refused_call->message());
    CHECK(out.refused_call->message().find("the peer is closing") != std::string::npos);
    REQUIRE(out.refused_setup);
    CHECK(out.refused_setup->is_errno(ECONNREFUSED));
    CHECK(out.refused_setup->message().find("shutting down") != std::string::npos);
    MESSAGE("echo calls answered before the goodbye came: ", out.echoed_before);
    REQUIRE(out.after); // nothing listens
    CHECK(out.after->is_errno(ECONNREFUSED));
    CHECK(rig.server->listen_port() == 0);
    CHECK(rig.server->sessions() == 0);
    CHECK(rig.client->sessions() == 0);
    CHECK(rig.server->counters().sessions_refused == 1);
}

namespace {

struct SilentServer {
    std::optional<Error> error;
    std::chrono::steady_clock::duration took{};
};

// A TCP listener that takes the client's connection and never answers: connect() ends
// at its own timeout, not the endpoint's setup_timeout.
asio::awaitable<void> connect_to_silence(rpc::Endpoint* client, SilentServer* out) {
    const auto executor = co_await asio::this_coro::executor;
    asio::ip::tcp::acceptor silent(executor, {asio::ip::make_address("127.0.0.1"), 0});
    asio::ip::tcp::socket taken(executor);
    silent.async_accept(taken, [](std::error_code) {});
    const rpc::ConnectOptions options{.timeout = 300ms}; // (g++ 12: no braced temporary in a co_await)
    const auto began = std::chrono::steady_clock::now();
    auto session = co_await client->connect("127.0.0.1", silent.local_endpoint().port(), options);
    out->took = std::chrono::steady_clock::now() - began;
    if (!session)
        out->error = session.error();
}

} // namespace

TEST_CASE("rpc endpoint: connect() to a server that never answers ends at the connect's own timeout") {
    asio::io_context io;
    auto client = must(rpc::Endpoint::create(io, {.setup_timeout = 20s}));
    SilentServer out;
    run(io, connect_to_silence(client.get(), &out), 60s);
    REQUIRE(out.error);
    CHECK_MESSAGE(out.error->is_timeout(), out.error->message());
    CHECK(out.took >= 300ms);
    CHECK(out.took < 10s); // not the endpoint's 20 s
    CHECK(client->sessions() == 0);
}

namespace {

struct SilentClients {
    bool oldest_closed_at_once = false; // when one more came
    std::uint64_t evicted = 0, refused = 0;
    bool served = false; // a real client, while silent ones held every place
    std::chrono::steady_clock::duration took{};
    bool next_oldest_closed = false; // the real client's room
    bool newest_kept = false;
};

// `silent` clients connect and say nothing; one more connects and says nothing; then a
// real client.
asio::awaitable<void> silent_setups(Rig* rig, std::vector<asio::ip::tcp::socket>* silent,
                                    asio::ip::tcp::socket* one_more, SilentClients* out) {
    const asio::ip::tcp::endpoint server(asio::ip::make_address("127.0.0.1"), rig->port);
    for (auto& socket : *silent)
        co_await socket.async_connect(server, asio::use_awaitable);
    co_await one_more->async_connect(server, asio::use_awaitable);
    // not at the 20 s setup_timeout (the listener accepts in order: the first is oldest)
    out->oldest_closed_at_once = co_await closed_within(&silent->front(), 5s);
    out->evicted = rig->server->counters().setups_evicted;
    out->refused = rig->server->counters().sessions_refused;
    std::optional<rpc::Session> session;
    const auto began = std::chrono::steady_clock::now();
    co_await connect_into(rig, &session); // it was closed at once, till the silent ones' setup_timeout passed
    out->took = std::chrono::steady_clock::now() - began;
    out->served = session.has_value();
    out->next_oldest_closed = co_await closed_within(&(*silent)[1], 5s);
    out->newest_kept = !co_await closed_within(one_more, 200ms);
}

} // namespace

TEST_CASE("rpc endpoint: a listener has at most max_sessions setups under way; one more takes the place of the "
          "oldest silent client") {
    Rig rig({.max_sessions = 4, .setup_timeout = 20s});
    std::vector<asio::ip::tcp::socket> silent;
    for (int i = 0; i < 4; ++i)
        silent.emplace_back(rig.io);
    asio::ip::tcp::socket one_more(rig.io);
    SilentClients out;
    run(rig.io, silent_setups(&rig, &silent, &one_more, &out), 60s);
    CHECK(out.oldest_closed_at_once);
    CHECK(out.evicted == 1);
    CHECK(out.refused == 0);
    CHECK(out.served);
    CHECK(out.took < 10s);
    CHECK(out.next_oldest_closed);
    CHECK(out.newest_kept);
    CHECK(rig.server->counters().setups_evicted == 2);
}

namespace {

// Setups under way as their endpoints are destroyed: a silent client's at a listener,
// and a connect to a listener that never answers. Each ends at once, not at its
// setup_timeout of 30 s.
struct DestroyedMidSetup {
    bool silent_client_closed = false;
    std::optional<Error> connect_ended; // how the connect ended
    std::chrono::milliseconds connect_took{};
};

asio::awaitable<void> destroy_mid_setup(Rig* rig, asio::ip::tcp::socket* silent, asio::ip::tcp::acceptor* mute,
                                        DestroyedMidSetup* out) {
    co_await silent->async_connect({asio::ip::make_address("127.0.0.1"), rig->port}, asio::use_awaitable);
    co_await pause(200ms); // the listener serves its setup
    rig->server.reset();
    out->silent_client_closed = co_await closed_within(silent, 2s);
    asio::ip::tcp::socket taken(co_await asio::this_coro::executor); // accepted, never answered
    bool connect_done = false;
    const auto start = std::chrono::steady_clock::now();
    asio::co_spawn(
        co_await asio::this_coro::executor,
        [&]() -> asio::awaitable<void> {
            auto session = co_await rig->client->connect("127.0.0.1", mute->local_endpoint().port());
            if (!session)
                out->connect_ended = session.error();
            connect_done = true;
        },
        asio::detached);
    co_await mute->async_accept(taken, asio::use_awaitable);
    co_await pause(200ms); // the request is out, the connect reads for the reply
    rig->client.reset();
    while (!connect_done && std::chrono::steady_clock::now() - start < 10s)
        co_await pause(5ms);
    out->connect_took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
}

} // namespace

TEST_CASE("rpc endpoint: setups under way end with their endpoint, not at their setup_timeout") {
    Rig rig({.setup_timeout = 30s}, {.setup_timeout = 30s});
    asio::ip::tcp::socket silent(rig.io);
    asio::ip::tcp::acceptor mute(rig.io, {asio::ip::make_address("127.0.0.1"), 0});
    DestroyedMidSetup out;
    run(rig.io, destroy_mid_setup(&rig, &silent, &mute, &out), 60s);
    CHECK(out.silent_client_closed);
    REQUIRE(out.connect_ended);
    CHECK_MESSAGE(out.connect_ended->is_cancelled(), out.connect_ended->message());
    MESSAGE("the connect ended ", out.connect_took.count(), " ms after it began");
    CHECK(out.connect_took < 5s);
}

TEST_CASE("rpc endpoint: a listener out of file descriptors pauses its accepts rather than spin, and serves "
          "once it has them again") {
    Rig rig;
    const test::CapturedLog log; // the listener's warnings
    asio::io_context raw;
    std::vector<asio::ip::tcp::socket> queued; // clients the kernel took, waiting for the accept
    for (int i = 0; i < 3; ++i)
        queued.emplace_back(raw).connect({asio::ip::make_address("127.0.0.1"), rig.port});
    {
        const test::NoMoreFiles starved; // each accept fails (EMFILE), the connection stays queued
        spin(rig.io, 1500ms);
    }
    // pauses of 10, 20, 40 ... ms: 8 accepts in 1.5 s (thousands, spinning)
    const std::size_t failed_accepts = log.count("accepting a session");
    CHECK(failed_accepts >= 1);
    CHECK(failed_accepts <= 12);
    CHECK(log.count("Too many open files") >= 1);
    // with descriptors again, a client is served (behind the queued ones, silent)
    int wrong = 0;
    auto work = [&]() -> asio::awaitable<void> {
        std::optional<rpc::Session> session;
        co_await connect_into(&rig, &session);
        std::vector<std::byte> response(64);
        const auto request = message(1, 32);
        const auto got = co_await session->call(echo, request, response, {.timeout = 20s});
        wrong += !got || *got != request.size() || !echoed(response, request);
    };
    run(rig.io, work(), 30s);
    CHECK(wrong == 0);
}

// ---------------------------------------------------------------------------------
// Sessions over RDMA CM (EndpointOptions::session_transport)

namespace {

// Endpoint options whose sessions are set up over RDMA CM.
rpc::EndpointOptions over_cm(std::chrono::milliseconds setup_timeout = 5s) {
    rpc::EndpointOptions options;
    options.session_transport = Transport::rdma_cm;
    options.setup_timeout = setup_timeout;
    return options;
}

struct CmSessions {
    int wrong = 0;
    std::ptrdiff_t first_fds = 0, more_fds = 0; // descriptors the first session opened, and 4 more
    std::optional<Error> first, closed, refused;
    std::uint32_t server_sessions_before_close = 0, server_sessions_after_close = 0;
    std::uint32_t server_sessions_after_destroy = 0;
};

// Waits up to `limit` for `endpoint` to have `count` sessions (the other end's news
// travels over the control connection); returns how many it has.
asio::awaitable<std::uint32_t> sessions_become(rpc::Endpoint* endpoint, std::uint32_t count,
                                               std::chrono::milliseconds limit) {
    for (auto waited = 0ms; endpoint->sessions() != count && waited < limit; waited += 10ms)
        co_await pause(10ms);
    co_return endpoint->sessions();
}

std::ptrdiff_t open_fds() {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{});
}

asio::awaitable<void> cm_sessions(rpc::Endpoint* server, rpc::Endpoint* client, std::string address,
                                  std::uint16_t port, CmSessions* out) {
    const auto before = open_fds();
    auto session = co_await client->connect(address, port);
    if (!session) {
        out->first = session.error();
        co_return;
    }
    out->first_fds = open_fds() - before;
    {
        // while it lives, 4 more share its device context (no context, CQ or channel each)
        const auto before_more = open_fds();
        std::vector<rpc::Session> more;
        for (int i = 0; i < 4; ++i) {
            auto another = co_await client->connect(address, port);
            if (!another) {
                out->first = another.error();
                co_return;
            }
            more.push_back(std::move(*another));
        }
        out->more_fds = open_fds() - before_more;
        std::vector<std::byte> echoed_back(100);
        const auto request = message(9, 100);
        for (rpc::Session& s : more) {
            const Result<std::size_t> got = co_await s.call(echo, request, echoed_back, {.timeout = 20s});
            out->wrong += got && *got == request.size() && echoed(echoed_back, request) ? 0 : 1;
        }
    }
    out->server_sessions_before_close = co_await sessions_become(server, 1, 5s);
    // one packet, many packets, and above rdma_threshold (the RC path, offered and
    // answered over the CM control connection), each checked
    std::vector<std::byte> response(40'000);
    for (const std::size_t size : {std::size_t{32}, std::size_t{3000}, std::size_t{20'000}, std::size_t{40'000}}) {
        const auto request = message(static_cast<std::uint32_t>(size), size);
        const Result<std::size_t> got = co_await session->call(echo, request, response, {.timeout = 20s});
        out->wrong += got && *got == size && echoed(response, request) ? 0 : 1;
    }
    if (auto closed = co_await session->close(5s); !closed)
        out->closed = closed.error();
    out->server_sessions_after_close = co_await sessions_become(server, 0, 5s);

    // a Session destroyed: the server's session ends with the control connection
    auto second = co_await client->connect(address, port);
    if (!second) {
        out->first = second.error();
        co_return;
    }
    const auto request = message(7, 100);
    const Result<std::size_t> got = co_await second->call(echo, request, response, {.timeout = 20s});
    out->wrong += got && *got == request.size() ? 0 : 1;
    {
        rpc::Session gone = std::move(*second);
    }
    out->server_sessions_after_destroy = co_await sessions_become(server, 0, 5s);

    // the server shuts down: its RDMA CM port listens no more
    if (auto down = co_await server->shutdown(5s); !down)
        out->closed = down.error();
    const rpc::ConnectOptions quick{.timeout = 3s};
    auto refused = co_await client->connect(address, port, quick);
    if (!refused)
        out->refused = refused.error();
}

} // namespace

TEST_CASE("rpc endpoint: sessions set up over RDMA CM carry calls of every size, close gracefully, end with their "
          "control connection") {
    Rig rig(over_cm(), over_cm(), test::cm_address());
    CmSessions out;
    run(rig.io, cm_sessions(rig.server.get(), rig.client.get(), rig.address, rig.port, &out), 120s);
    REQUIRE_MESSAGE(!out.first, (out.first ? out.first->message() : ""));
    CHECK(out.wrong == 0);
    CHECK(rig.server->counters().rdma_reads >= 2); // the 20,000- and 40,000-byte requests took the RC path
    CHECK(out.server_sessions_before_close == 1); // the 4 more ended with their Sessions
    MESSAGE("descriptors opened: by the first session ", out.first_fds, ", by 4 more ", out.more_fds);
    // a session on a context of its own would open the context's device file and its
    // completion channel again: at least 2 descriptors more each than a shared one
    CHECK(out.more_fds + 4 * 2 <= 4 * out.first_fds);
    CHECK_MESSAGE(!out.closed, (out.closed ? out.closed->message() : ""));
    CHECK(out.server_sessions_after_close == 0);
    CHECK(out.server_sessions_after_destroy == 0);
    CHECK(rig.server->listen_port() == 0);
    REQUIRE(out.refused); // nothing listens on the port any more
    CHECK(rig.client->sessions() == 0);
}

namespace {

struct CmHostile {
    std::optional<Error> setup; // of the test's own connections and session
    bool garbage_ended = false, silent_ended = false;
    std::chrono::milliseconds silent_lasted{};
    int wrong = 0;
    std::uint32_t server_sessions = 0; // with the real session live
};

// Two RDMA CM clients of lib/async's Connection at an rpc listener: one sends 64 bytes
// of garbage for a session request, one says nothing; a real client meanwhile.
asio::awaitable<void> cm_hostile(rpc::Endpoint* server, rpc::Endpoint* client, std::string address,
                                 std::uint16_t port, CmHostile* out) {
    const auto executor = co_await asio::this_coro::executor;
    ConnectionOptions options;
    options.transport = Transport::rdma_cm;
    auto silent = co_await async::Connection::connect(executor, address, port, options);
    auto garbage = co_await async::Connection::connect(executor, address, port, options);
    if (!silent || !garbage) {
        out->setup = !silent ? silent.error() : garbage.error();
        co_return;
    }
    const auto silent_since = std::chrono::steady_clock::now();
    auto junk = must(garbage->alloc_local_mr(64));
    std::memset(junk.bytes().data(), 0xab, 64);
    if (auto sent = co_await garbage->send(junk.slice(0, 64)); !sent) {
        out->setup = sent.error();
        co_return;
    }
    std::array<std::byte, 256> into{};
    auto answer = co_await garbage->receive(into, 10s);
    out->garbage_ended = !answer && !answer.error().is_timeout(); // closed, unanswered

    auto session = co_await client->connect(address, port);
    if (!session) {
        out->setup = session.error();
        co_return;
    }
    const auto request = message(3, 500);
    std::vector<std::byte> response(500);
    const Result<std::size_t> got = co_await session->call(echo, request, response, {.timeout = 20s});
    out->wrong += got && *got == request.size() && echoed(response, request) ? 0 : 1;
    out->server_sessions = server->sessions(); // the hostile clients were never admitted

    auto heard = co_await silent->receive(into, 20s);
    out->silent_ended = !heard && !heard.error().is_timeout();
    out->silent_lasted = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                              silent_since);
}

} // namespace

TEST_CASE("rpc endpoint: RDMA CM clients that send garbage or nothing are closed; a real client is served "
          "meanwhile") {
    Rig rig(over_cm(1500ms), over_cm(), test::cm_address());
    CmHostile out;
    run(rig.io, cm_hostile(rig.server.get(), rig.client.get(), rig.address, rig.port, &out), 120s);
    REQUIRE_MESSAGE(!out.setup, (out.setup ? out.setup->message() : ""));
    CHECK(out.garbage_ended);
    CHECK(out.wrong == 0);
    CHECK(out.silent_ended);      // at the server's setup_timeout, not the test's 20 s
    CHECK(out.silent_lasted >= 1s);
    CHECK(out.silent_lasted < 15s);
    CHECK(out.server_sessions == 1);
}

// ---------------------------------------------------------------------------------
// Allocations per call: none once warm (operator new and aligned_alloc counted:
// support/allocations.cpp)

namespace {

// Echo calls of one and of three packets, with spans and with MessageBuffers, one at a
// time, both endpoints on this thread, each co_awaited through `token` by a coroutine
// of type Coroutine (asio::awaitable, async::Task); the allocations of calls 200.. are
// counted.
template <class Coroutine, class Token>
Coroutine counted_calls(rpc::Session* session, rpc::MessageBuffer* request, rpc::MessageBuffer* response, Token token,
                        long* counted, int* wrong) {
    const auto bytes = message(3, 3000);
    std::vector<std::byte> span_response(4096);
    for (int i = 0; i < 2200; ++i) {
        if (i == 200) {
            test::allocations = 0;
            test::counting = true;
        }
        const std::size_t size = i % 2 == 0 ? 32 : 3000;
        Result<std::size_t> got = 0;
        std::span<const std::byte> echoed_bytes = span_response;
        if (i % 4 < 2) {
            got = co_await session->call(echo, std::span(bytes).first(size), span_response, {}, token);
        } else {
            request->resize(size);
            std::memcpy(request->bytes().data(), bytes.data(), size);
            got = co_await session->call(echo, *request, *response, {}, token);
            echoed_bytes = response->bytes();
        }
        *wrong += got && *got == size && echoed(echoed_bytes, std::span(bytes).first(size)) ? 0 : 1;
    }
    test::counting = false;
    *counted = test::allocations;
}

std::optional<rpc::Session> connected(Rig& rig) {
    std::optional<rpc::Session> session;
    run(rig.io, connect_into(&rig, &session), 60s);
    return session;
}

// What each allocation test calls through: a session to the Rig's server and two
// 4 KiB MessageBuffers of its client.
struct CallRig {
    Rig rig;
    std::optional<rpc::Session> session = connected(rig);
    rpc::MessageBuffer request = must(rig.client->alloc_buffer(4096, rpc::BufferUse::request));
    rpc::MessageBuffer response = must(rig.client->alloc_buffer(4096, rpc::BufferUse::response));
};

} // namespace

TEST_CASE("rpc endpoint: calls allocate nothing once warm, with spans and with MessageBuffers") {
    CallRig r;
    long counted = -1;
    int wrong = 0;
    run(r.rig.io,
        counted_calls<asio::awaitable<void>>(&*r.session, &r.request, &r.response, asio::use_awaitable, &counted,
                                             &wrong),
        120s);
    CHECK(wrong == 0);
    CHECK(counted == 0);
    MESSAGE("allocations in 2,000 calls: ", counted);
}

namespace {

// The same calls in the callback form (as rdmaxx-perf --callbacks): each completion
// makes the next call, and a failed one ends the chain (as the session's end does to a
// call in flight); the allocations of calls 200.. are counted.
struct CountedCallbackCalls {
    rpc::Session* session;
    rpc::MessageBuffer* request;
    rpc::MessageBuffer* response;
    std::vector<std::byte> bytes = message(4, 3000);
    std::vector<std::byte> span_response = std::vector<std::byte>(4096);
    int calls = 0, wrong = 0;
    long counted = -1;

    void next() {
        if (calls == 200) {
            test::allocations = 0;
            test::counting = true;
        }
        if (calls == 2200) {
            test::counting = false;
            counted = test::allocations;
            return;
        }
        const std::size_t size = calls % 2 == 0 ? 32 : 3000;
        const bool spans = calls++ % 4 < 2;
        auto check_then_next = [this, size, spans](Result<std::size_t> got) {
            if (!got) {
                ++wrong;
                return;
            }
            const std::span<const std::byte> echoed_bytes =
                spans ? std::span<const std::byte>(span_response) : response->bytes();
            wrong += *got == size && echoed(echoed_bytes, std::span(bytes).first(size)) ? 0 : 1;
            next();
        };
        if (spans) {
            session->call(echo, std::span(bytes).first(size), span_response, {}, check_then_next);
        } else {
            request->resize(size);
            std::memcpy(request->bytes().data(), bytes.data(), size);
            session->call(echo, *request, *response, {}, check_then_next);
        }
    }
};

} // namespace

TEST_CASE("rpc endpoint: calls in the callback form allocate nothing once warm") {
    CountedCallbackCalls chain{}; // outlives the session: a call it ends completes into the chain
    CallRig r;
    chain.session = &*r.session;
    chain.request = &r.request;
    chain.response = &r.response;
    chain.next();
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (chain.counted < 0 && chain.wrong == 0 && std::chrono::steady_clock::now() < deadline)
        r.rig.io.run_for(10ms);
    CHECK(chain.calls == 2200);
    CHECK(chain.wrong == 0);
    CHECK(chain.counted == 0);
    MESSAGE("allocations in 2,000 calls: ", chain.counted);
}

namespace {

// What task_calls saw.
struct TaskOutcome {
    int wrong = 0;
    long counted = -1;
    std::optional<Result<std::size_t>> no_handler, timed_out, reset;
    bool done = false;
};

// Calls co_awaited by an rdmaxx::async::Task through use_task: counted_calls' 2,200,
// then a call of a type the server has no handler for, one the server holds past its
// timeout, and one the server holds until the test ends the session.
async::Task<void> task_calls(rpc::Session* session, rpc::MessageBuffer* request, rpc::MessageBuffer* response,
                             TaskOutcome* out) {
    co_await counted_calls<async::Task<void>>(session, request, response, async::use_task, &out->counted, &out->wrong);
    const auto bytes = message(5, 8);
    std::vector<std::byte> small(8);
    out->no_handler = co_await session->call(unknown, bytes, small, {}, async::use_task);
    out->timed_out = co_await session->call(hold_it, bytes, small, {.timeout = 200ms}, async::use_task);
    out->reset = co_await session->call(hold_it, bytes, small, {.timeout = 60s}, async::use_task);
    out->done = true;
}

} // namespace

TEST_CASE("rpc endpoint: a Task co_awaits calls through use_task: responses, each error, no allocation once warm") {
    CallRig r;
    TaskOutcome out;
    async::spawn(r.rig.io.get_executor(), task_calls(&*r.session, &r.request, &r.response, &out));
    const auto run_while = [&r](auto&& busy) {
        const auto deadline = std::chrono::steady_clock::now() + 120s;
        while (busy() && std::chrono::steady_clock::now() < deadline)
            r.rig.io.run_for(10ms);
    };
    run_while([&] { return !out.timed_out.has_value() || r.rig.held.size() < 2; });
    REQUIRE(r.rig.held.size() == 2); // the last call is with the server
    CHECK_FALSE(out.done);
    r.session.reset(); // its calls end: session reset
    run_while([&] { return !out.done; });
    REQUIRE(out.done);
    CHECK(out.wrong == 0);
    CHECK(out.counted == 0);
    MESSAGE("allocations in 2,000 calls: ", out.counted);
    REQUIRE_FALSE(out.no_handler->has_value());
    CHECK(out.no_handler->error().is_errno(ENOENT));
    REQUIRE_FALSE(out.timed_out->has_value());
    CHECK(out.timed_out->error().is_timeout());
    REQUIRE_FALSE(out.reset->has_value());
    CHECK(out.reset->error().is_errno(ECONNRESET));
}

namespace {

asio::awaitable<void> timed_calls(rpc::Endpoint* client, std::uint16_t port, int calls, int* wrong,
                                  std::chrono::steady_clock::duration* took) {
    auto session = co_await client->connect("127.0.0.1", port);
    REQUIRE_MESSAGE(session.has_value(), (session ? "" : session.error().message()));
    const auto request = message(7, 32);
    std::vector<std::byte> response(64);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
        const Result<std::size_t> got = co_await session->call(echo, request, response, {.timeout = 20s});
        *wrong += got && *got == request.size() && echoed(response, request) ? 0 : 1;
    }
    *took = std::chrono::steady_clock::now() - start;
}

} // namespace

namespace {

// An echo server endpoint on a thread of its own (busy: it answers at once), until destroyed.
class EchoServerThread {
public:
    EchoServerThread() {
        thread_ = test::Thread([this] { serve(); });
        while (!serving_)
            std::this_thread::sleep_for(1ms);
    }
    EchoServerThread(const EchoServerThread&) = delete;
    EchoServerThread& operator=(const EchoServerThread&) = delete;
    ~EchoServerThread() { stop_ = true; }
    std::uint16_t port() const noexcept { return port_; }

private:
    void serve() {
        asio::io_context io;
        rpc::EndpointOptions options;
        options.listen_port = port_;
        options.listen_address = "127.0.0.1";
        options.drive = {.mode = async::CompletionMode::busy};
        auto server = must(rpc::Endpoint::create(io, options));
        server->set_handler(echo, [](rpc::Request request, rpc::Responder responder) {
            responder.respond(request.bytes());
        });
        serving_ = true;
        while (!stop_)
            io.run_for(10ms);
    }

    const std::uint16_t port_ = next_port();
    std::atomic<bool> serving_{false}, stop_{false};
    test::Thread thread_; // last: joined first
};

} // namespace

TEST_CASE("rpc endpoint: a busy client's call resumes when its response is taken, and the turn goes on polling") {
    // The client's turn is 1,000,000 polls long (a third of a second under emulation):
    // a call that waited for its end took half that (50 calls: 7.5 s); it takes a round
    // trip (50 calls: 17 ms). And a turn that ended at each call's completion handed the
    // io_context to its reactor: an epoll_wait per call (a tenth of an RPC's round trip
    // on rxe), a handler of the io_context per call; the turn carries many calls.
    EchoServerThread server;
    asio::io_context io;
    rpc::EndpointOptions options;
    options.drive = {.mode = async::CompletionMode::busy, .busy_polls = 1'000'000};
    auto client = must(rpc::Endpoint::create(io, options));
    constexpr int calls = 400;
    int wrong = 0;
    std::chrono::steady_clock::duration took{};
    const std::size_t handlers = run(io, timed_calls(client.get(), server.port(), calls, &wrong, &took), 120s);
    CHECK(wrong == 0);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
    MESSAGE(calls, " calls in ", ms, " ms; with the session's setup, ", handlers, " handlers of the io_context");
    CHECK(ms < calls * 30);
    CHECK(handlers < calls / 4);
}

namespace {

// A busy client's coroutine that calls again at once whenever a call fails at once (a
// request above the session's limit), resumed first by the busy turn that took a
// response: its failures complete one after another, and a timer still fires among
// them (the turn ran each completion a failure queued in the same loop, for ever).
struct Relentless {
    bool first_ok = false;
    int failed_at_once = 0;
    bool timer_fired = false;
};

asio::awaitable<void> call_relentlessly(rpc::Endpoint* client, std::uint16_t port, Relentless* out) {
    auto session = co_await client->connect("127.0.0.1", port);
    REQUIRE_MESSAGE(session.has_value(), (session ? "" : session.error().message()));
    const auto small = message(1, 32);
    const std::vector<std::byte> too_large(session->info().max_request + 1);
    std::vector<std::byte> response(64);
    out->first_ok = (co_await session->call(echo, small, response)).has_value();
    asio::steady_timer timer(co_await asio::this_coro::executor, 20ms);
    timer.async_wait([out](std::error_code ec) { out->timer_fired = !ec; });
    while (!out->timer_fired && out->failed_at_once < 1'000'000) {
        const auto r = co_await session->call(echo, too_large, response);
        if (r || !r.error().is_errno(EMSGSIZE))
            break;
        ++out->failed_at_once;
    }
}

} // namespace

TEST_CASE("rpc endpoint: a busy client's coroutine whose calls fail at once, call after call, lets a timer fire") {
    EchoServerThread server;
    asio::io_context io;
    rpc::EndpointOptions options;
    options.drive = {.mode = async::CompletionMode::busy};
    auto client = must(rpc::Endpoint::create(io, options));
    Relentless out;
    run(io, call_relentlessly(client.get(), server.port(), &out), 120s);
    CHECK(out.first_ok);
    MESSAGE(out.failed_at_once, " calls failed at once before the 20 ms timer fired (or a million)");
    CHECK(out.timer_fired);
}

TEST_CASE("rpc endpoint: a response waiting in the client's CQ when its RTO expires is taken, not asked for "
          "again") {
    // A manual-mode client whose application never polls: each response waits in the
    // CQ (as behind a driver whose turn has not come) until its call's RTO expires. The
    // timer takes it then, and asks for nothing again (it resent every request, and no
    // call ended, before it took arrivals first).
    EchoServerThread server;
    asio::io_context io;
    rpc::EndpointOptions options;
    options.drive = {.mode = async::CompletionMode::manual};
    auto client = must(rpc::Endpoint::create(io, options));
    // few: each round trip measured is the RTO that took it, and the RTO grows with them
    // (50, 150, 250 ms)
    constexpr int calls = 3;
    int wrong = 0;
    std::chrono::steady_clock::duration took{};
    run(io, timed_calls(client.get(), server.port(), calls, &wrong, &took), 120s);
    CHECK(wrong == 0);
    CHECK(client->counters().completed == calls);
    CHECK(client->counters().taken_by_timer == calls);
    CHECK(client->counters().retransmissions == 0);
}

namespace {

constexpr std::uint8_t destroy_victim = 6;

// `both` (manual mode: it polls only when a client session of its has an RTO or a
// deadline due) calls `holder`, which holds the call: the victim session stays due at
// each RTO. Then `holder` calls `both`, whose handler destroys the victim: it runs in
// the poll the timer makes for the victim's due RTO, the only poll `both` makes.
asio::awaitable<void> destroy_in_timer_poll(rpc::Endpoint* both, Rig* rig, std::optional<rpc::Session>* victim,
                                            std::optional<Result<std::size_t>>* victim_call,
                                            std::optional<Result<std::size_t>>* destroy_call) {
    auto to_holder = co_await both->connect("127.0.0.1", rig->port);
    REQUIRE_MESSAGE(to_holder.has_value(), (to_holder ? "" : to_holder.error().message()));
    victim->emplace(std::move(*to_holder));
    auto to_both = co_await rig->client->connect("127.0.0.1", both->listen_port());
    REQUIRE_MESSAGE(to_both.has_value(), (to_both ? "" : to_both.error().message()));
    const auto request = message(4, 32);
    std::vector<std::byte> held_response(64), response(64);
    (*victim)->call(hold_it, request, held_response, {.timeout = 20s},
                    [victim_call](Result<std::size_t> r) { victim_call->emplace(std::move(r)); });
    co_await until([rig] { return !rig->held.empty(); });
    destroy_call->emplace(co_await to_both->call(destroy_victim, request, response, {.timeout = 20s}));
    co_await until([victim_call] { return victim_call->has_value(); });
}

} // namespace

TEST_CASE("rpc endpoint: a request handler run by the RTO timer's poll may destroy the session the timer "
          "serves") {
    // The timer went on with the destroyed session's state (its calls, its window)
    // after the poll: a use after free.
    Rig rig; // its server: the holder; its client: the one that asks for the destruction
    rpc::EndpointOptions manual;
    manual.drive = {.mode = async::CompletionMode::manual};
    manual.listen_port = next_port();
    manual.listen_address = "127.0.0.1";
    auto both = must(rpc::Endpoint::create(rig.io, manual));
    std::optional<rpc::Session> victim;
    int destroyed = 0;
    both->set_handler(destroy_victim, [&victim, &destroyed](rpc::Request request, rpc::Responder responder) {
        victim.reset();
        ++destroyed;
        responder.respond(request.bytes());
    });
    std::optional<Result<std::size_t>> victim_call, destroy_call;
    run(rig.io, destroy_in_timer_poll(both.get(), &rig, &victim, &victim_call, &destroy_call), 60s);
    CHECK(destroyed == 1);
    REQUIRE(destroy_call.has_value());
    CHECK(destroy_call->has_value());
    REQUIRE(victim_call.has_value());
    REQUIRE_FALSE(victim_call->has_value());
    CHECK(victim_call->error().is_errno(ECONNRESET));
    CHECK(both->counters().taken_by_timer >= 1);
    rig.held.clear();
    spin(rig.io, 50ms);
}

namespace {

// `calls` calls, then the session and the endpoint destroyed where the last one resumed:
// inside the driver handler of the endpoint's own CQ, which took the response.
asio::awaitable<void> calls_then_destroy(std::unique_ptr<rpc::Endpoint>* client, std::uint16_t port, int calls,
                                         int* wrong, std::uint64_t* taken_by_timer) {
    auto connected = co_await (*client)->connect("127.0.0.1", port);
    REQUIRE_MESSAGE(connected.has_value(), (connected ? "" : connected.error().message()));
    std::optional<rpc::Session> session(std::move(*connected));
    const auto request = message(3, 32);
    std::vector<std::byte> response(64);
    for (int i = 0; i < calls; ++i) {
        const Result<std::size_t> got = co_await session->call(echo, request, response, {.timeout = 20s});
        *wrong += got && *got == request.size() && echoed(response, request) ? 0 : 1;
    }
    *taken_by_timer = (*client)->counters().taken_by_timer;
    session.reset();
    client->reset();
}

} // namespace

TEST_CASE("rpc endpoint: a call's completion runs in the driver handler that took its response (busy, "
          "hybrid, event), where its coroutine may destroy the endpoint") {
    // Posted, it would wait for the io_context's next turn, whose reactor makes an
    // epoll_wait first (event mode's round trip on rxe: 300 us -> 180 us).
    EchoServerThread server;
    for (const async::CompletionMode mode :
         {async::CompletionMode::busy, async::CompletionMode::hybrid, async::CompletionMode::event}) {
        CAPTURE(static_cast<int>(mode));
        asio::io_context io;
        rpc::EndpointOptions options;
        options.drive = {.mode = mode};
        auto client = must(rpc::Endpoint::create(io, options));
        const std::uint64_t before = async::Completions::of(io).deferred_completions();
        constexpr int calls = 20;
        int wrong = 0;
        std::uint64_t taken_by_timer = 0;
        run(io, calls_then_destroy(&client, server.port(), calls, &wrong, &taken_by_timer), 120s);
        CHECK(wrong == 0);
        CHECK(client == nullptr);
        // every call's, the connect's own exchange aside (TCP), but those the RTO timer
        // took (the driver's turn not yet come: a loaded host), which run a turn later
        CHECK(async::Completions::of(io).deferred_completions() - before + taken_by_timer == calls);
        io.run_for(50ms); // what the endpoint left behind ends with nothing to touch
    }
}
