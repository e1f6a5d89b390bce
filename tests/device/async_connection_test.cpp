// async::Connection and async::Listener on a real device: every call, many in flight
// from one thread, 64 clients on one listener beside a silent one, a blocking peer,
// cancellation before and after the post, and a peer that dies.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <rdmaxx/async/connection.hpp>
#include <rdmaxx/ctrl/cm.hpp>
#include <rdmaxx/ctrl/connection.hpp>

#include "../support/allocations.hpp"
#include "../support/device.hpp"
#include "../support/run_until.hpp"
#include "../support/starved.hpp"

using namespace rdmaxx;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
using rdmaxx::test::must;

namespace {

ConnectionOptions options() {
    ConnectionOptions o;
    o.timeout = 10s;
    o.receive_depth = 16;
    return o;
}

// Counts what failed (a coroutine must not throw out of doctest's macros).
struct Tally {
    int failures = 0;
    void check(bool ok, const char* what) {
        if (!ok) {
            MESSAGE("failed: ", std::string(what));
            ++failures;
        }
    }
    template <class T>
    bool ok(const Result<T>& r, const char* what) {
        if (!r)
            MESSAGE(std::string(what), ": ", fmt::format("{}", r.error()));
        check(r.has_value(), what);
        return r.has_value();
    }
};

// --- every call, many in flight --------------------------------------------------

asio::awaitable<void> one_write(async::Connection& c, LocalSlice local, RemoteMemory remote, Tally& t, int& left) {
    t.ok(co_await c.write(local, remote), "write");
    --left;
}

asio::awaitable<void> one_add(async::Connection& c, LocalSlice result, RemoteMemory target, Tally& t, int& left) {
    t.ok(co_await c.fetch_add(result, target, 1), "fetch_add");
    --left;
}

asio::awaitable<void> one_send(async::Connection& c, LocalSlice message, Tally& t, int& left) {
    t.ok(co_await c.send(message), "send");
    --left;
}

asio::awaitable<void> wait_for(asio::any_io_executor ex, const int& left) {
    asio::steady_timer timer(ex);
    while (left > 0) {
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }
}

// The server: serves the client's requests in the background (its driver does), and
// answers what the client asks by message: echoes 64 messages, takes a write_with_imm,
// lends a region and takes back what it granted.
asio::awaitable<void> server(async::Listener& listener, Tally& t, bool& done) {
    auto c = co_await listener.accept(10s);
    if (t.ok(c, "accept")) {
        CHECK(c->peer_address().starts_with("127.0.0.1:")); // the client's address and port
        std::array<std::byte, 64> buffer{};
        auto echo = must(c->alloc_local_mr(64));
        for (int i = 0; i < 64; ++i) {
            auto got = co_await c->receive(buffer);
            if (!t.ok(got, "receive"))
                break;
            std::memcpy(echo.data(), buffer.data(), got->size);
            t.ok(co_await c->send(echo.slice(0, got->size)), "echo");
        }
        auto imm = co_await c->receive_write_imm();
        t.check(imm && *imm == 0xabcd, "receive_write_imm");
        auto lent = must(c->alloc_local_mr(4096, Access::local_write | Access::remote_read));
        std::memset(lent.data(), 0x5a, 4096);
        t.ok(co_await c->send_local_mr(std::move(lent)), "send_local_mr");
        auto back = co_await c->receive_local_mr(); // the granted region, given back
        t.check(back && back->size() == 1 << 16 && back->data()[100] == std::byte{7}, "receive_local_mr");
        auto lent_back = co_await c->receive_local_mr(); // the lent one
        t.check(lent_back && lent_back->size() == 4096, "receive_local_mr (lent)");
        t.ok(co_await c->close(), "server close");
    }
    done = true;
}

asio::awaitable<void> client(asio::any_io_executor ex, std::uint16_t port, Tally& t, bool& done) {
    auto c = co_await async::Connection::connect(ex, "127.0.0.1", port, options());
    if (t.ok(c, "connect")) {
        CHECK(c->peer_address() == fmt::format("127.0.0.1:{}", port)); // as given
        // 64 writes in flight (max_send_wr), then read back
        auto remote = co_await c->request_remote_mr(1 << 16);
        if (t.ok(remote, "request_remote_mr")) {
            auto local = must(c->alloc_local_mr(1 << 16));
            for (std::size_t i = 0; i < local.size(); ++i)
                local.data()[i] = static_cast<std::byte>(i % 251);
            int left = 64;
            for (int i = 0; i < 64; ++i)
                asio::co_spawn(ex, one_write(*c, local.slice(i * 1024, 1024), remote->slice(i * 1024, 1024), t, left),
                               asio::detached);
            co_await wait_for(ex, left);
            auto check = must(c->alloc_local_mr(1 << 16));
            t.ok(co_await c->read(check.all(), remote->memory), "read");
            t.check(std::memcmp(check.data(), local.data(), 1 << 16) == 0, "bytes read back");
            // 100 fetch_adds at once on one counter, then a compare_swap
            auto results = must(c->alloc_local_mr(8 * 100));
            left = 100;
            for (int i = 0; i < 100; ++i)
                asio::co_spawn(ex, one_add(*c, results.slice(8 * i, 8), remote->slice(0, 8), t, left), asio::detached);
            co_await wait_for(ex, left);
            std::uint64_t before = 0;
            std::memcpy(&before, check.data(), 8); // what the first 8 bytes were
            t.ok(co_await c->compare_swap(results.slice(0, 8), remote->slice(0, 8), before + 100, 42), "compare_swap");
            std::uint64_t old = 0;
            std::memcpy(&old, results.data(), 8);
            t.check(old == before + 100, "100 fetch_adds counted");
            check.data()[100] = std::byte{7};
            t.ok(co_await c->write(check.slice(100, 1), remote->slice(100, 1)), "write one byte");
            // 64 messages, 16 in flight at a time (the server's receive depth)
            auto messages = must(c->alloc_local_mr(64 * 8));
            std::array<std::byte, 8> echoed{};
            for (int round = 0; round < 4; ++round) {
                left = 16;
                for (int i = 0; i < 16; ++i) {
                    const int n = round * 16 + i;
                    std::memcpy(messages.data() + 8 * n, &n, sizeof n);
                    asio::co_spawn(ex, one_send(*c, messages.slice(8 * n, 8), t, left), asio::detached);
                }
                for (int i = 0; i < 16; ++i) {
                    auto got = co_await c->receive(echoed);
                    int n = -1;
                    std::memcpy(&n, echoed.data(), sizeof n);
                    t.check(got && got->size == 8 && n == round * 16 + i, "echo in order");
                }
                co_await wait_for(ex, left);
            }
            t.ok(co_await c->write_with_imm(check.slice(0, 8), remote->slice(0, 8), 0xabcd), "write_with_imm");
            auto lent = co_await c->receive_remote_mr();
            if (t.ok(lent, "receive_remote_mr")) {
                auto into = must(c->alloc_local_mr(4096));
                t.ok(co_await c->read(into.all(), lent->memory), "read the lent region");
                t.check(into.data()[4095] == std::byte{0x5a}, "lent bytes");
                t.ok(co_await c->send_remote_mr(*remote), "send_remote_mr (granted)");
                t.ok(co_await c->send_remote_mr(*lent), "send_remote_mr (lent)");
            }
        }
        auto closed = co_await c->receive(std::span<std::byte>{}, 10s);
        t.check(!closed && closed.error().code() == ECONNRESET, "the server's goodbye");
    }
    done = true;
}

} // namespace

TEST_CASE("async Connection: every call, many in flight on one connection, from one thread") {
    asio::io_context io;
    auto listener = must(async::Listener::listen(io.get_executor(), "127.0.0.1", 0, options()));
    Tally t;
    bool server_done = false, client_done = false;
    asio::co_spawn(io, server(listener, t, server_done), asio::detached);
    asio::co_spawn(io, client(io.get_executor(), listener.port(), t, client_done), asio::detached);
    REQUIRE(test::run_until(io, [&] { return client_done; }, 60s));
    REQUIRE(test::run_until(io, [&] { return server_done; }, 60s));
    CHECK(t.failures == 0);
    CHECK(listener.stats().accepted == 1);
}

// --- allocations per call ----------------------------------------------------------

namespace {

// Writes and reads one region of the peer, one call at a time; counts the allocations
// of calls 100.. (after the warm-up: the op slots, Asio's recycled frames).
asio::awaitable<void> counted_calls(async::Connection& c, long& counted, Tally& t) {
    auto remote = co_await c.request_remote_mr(4096);
    if (!t.ok(remote, "request_remote_mr"))
        co_return;
    auto local = must(c.alloc_local_mr(4096));
    for (int i = 0; i < 2100; ++i) {
        if (i == 100) {
            test::allocations = 0;
            test::aligned_allocations = 0;
            test::counting = true;
        }
        if (i % 2 == 0)
            t.ok(co_await c.write(local.slice(0, 64), remote->slice(0, 64)), "write");
        else
            t.ok(co_await c.read(local.slice(64, 64), remote->slice(0, 64)), "read");
    }
    test::counting = false;
    counted = test::allocations;
}

asio::awaitable<void> counted_client(asio::any_io_executor ex, std::uint16_t port, long& counted, Tally& t,
                                     bool& done) {
    auto c = co_await async::Connection::connect(ex, "127.0.0.1", port, options());
    if (t.ok(c, "connect")) {
        co_await counted_calls(*c, counted, t);
        t.ok(co_await c->close(), "client close");
    }
    done = true;
}

asio::awaitable<void> passive_server(async::Listener& listener, Tally& t, bool& done) {
    auto c = co_await listener.accept(10s);
    if (t.ok(c, "accept")) {
        auto closed = co_await c->receive(std::span<std::byte>{}, 60s); // serves the requests meanwhile
        t.check(!closed && closed.error().code() == ECONNRESET, "the client's goodbye");
    }
    done = true;
}

} // namespace

TEST_CASE("async Connection: 2,000 one-sided calls allocate nothing once warm, Asio's coroutine frames included "
          "(both ends on this thread)") {
    asio::io_context io;
    auto listener = must(async::Listener::listen(io.get_executor(), "127.0.0.1", 0, options()));
    Tally t;
    long counted = -1;
    bool server_done = false, client_done = false;
    asio::co_spawn(io, passive_server(listener, t, server_done), asio::detached);
    asio::co_spawn(io, counted_client(io.get_executor(), listener.port(), counted, t, client_done), asio::detached);
    REQUIRE(test::run_until(io, [&] { return client_done; }, 120s));
    REQUIRE(test::run_until(io, [&] { return server_done; }, 60s));
    CHECK(t.failures == 0);
    // Asio's frames (aligned_alloc) counted too: a call is one coroutine of its own plus
    // its timer wait's, which Asio's per-thread cache of two frames recycles (a call that
    // nested its waits as coroutines allocated about 4 times)
    CHECK(test::aligned_allocations == 0);
    CHECK(counted == 0);
}

// --- 64 clients and a silent one --------------------------------------------------

namespace {

asio::awaitable<void> echo_once(async::Connection c, Tally& t, int& served) {
    std::array<std::byte, 8> in{};
    auto got = co_await c.receive(in);
    if (t.ok(got, "server receive")) {
        auto out = must(c.alloc_local_mr(8));
        std::memcpy(out.data(), in.data(), 8);
        t.ok(co_await c.send(out.slice(0, got->size)), "server send");
    }
    auto bye = co_await c.receive(in); // until the client closes
    t.check(!bye && bye.error().code() == ECONNRESET, "client's goodbye");
    ++served;
}

asio::awaitable<void> accept_all(asio::any_io_executor ex, async::Listener& listener, int clients, Tally& t,
                                 int& served) {
    for (int i = 0; i < clients; ++i) {
        auto c = co_await listener.accept(30s);
        if (!t.ok(c, "accept"))
            co_return;
        asio::co_spawn(ex, echo_once(std::move(*c), t, served), asio::detached);
    }
}

// One client's exchange: its id out, echoed back, then close.
asio::awaitable<void> exchange_id(async::Connection& c, int id, Tally& t) {
    auto mr = must(c.alloc_local_mr(16));
    std::memcpy(mr.data(), &id, sizeof id);
    t.ok(co_await c.send(mr.slice(0, 8)), "client send");
    std::array<std::byte, 8> back{};
    auto got = co_await c.receive(back);
    int echoed = -1;
    std::memcpy(&echoed, back.data(), sizeof echoed);
    t.check(got && echoed == id, "echoed id");
    t.ok(co_await c.close(), "client close");
}

asio::awaitable<void> another_client(asio::awaitable<Result<async::Connection>> connecting, int id, Tally& t,
                                     int& finished) {
    auto c = co_await std::move(connecting);
    if (t.ok(c, "connect_another"))
        co_await exchange_id(*c, id, t);
    ++finished;
}

// The clients share one context, PD, CQ and pool (connect_another), as a program's
// connections would: 64 processes' worth of pools would not fit the VM's memory.
asio::awaitable<void> clients(asio::any_io_executor ex, std::uint16_t port, int n, Tally& t, int& finished) {
    auto first = co_await async::Connection::connect(ex, "127.0.0.1", port, options());
    if (t.ok(first, "connect")) {
        for (int id = 1; id < n; ++id)
            asio::co_spawn(ex, another_client(first->connect_another("127.0.0.1", port), id, t, finished),
                           asio::detached);
        co_await exchange_id(*first, 0, t);
    }
    ++finished;
}

} // namespace

TEST_CASE("async Listener: 64 clients at once on one thread (sharing a group), and a silent client holds up no one") {
    asio::io_context io;
    ConnectionOptions o = options();
    o.timeout = 8s; // the silent client's bound (64 handshakes at once take seconds at -O0 with ASan)
    auto listener = must(async::Listener::listen(io.get_executor(), "127.0.0.1", 0, o));
    asio::ip::tcp::socket silent(io);
    silent.connect({asio::ip::make_address("127.0.0.1"), listener.port()});
    constexpr int n = 64;
    Tally t;
    int served = 0, finished = 0;
    asio::co_spawn(io, accept_all(io.get_executor(), listener, n, t, served), asio::detached);
    asio::co_spawn(io, clients(io.get_executor(), listener.port(), n, t, finished), asio::detached);
    bool all = false;
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (!all && std::chrono::steady_clock::now() < deadline) {
        io.restart();
        io.run_for(10ms);
        all = finished == n && served == n && listener.stats().timed_out == 1;
    }
    CHECK(finished == n);
    CHECK(served == n);
    CHECK(t.failures == 0);
    const ListenerStats stats = listener.stats();
    CHECK(stats.accepted == n);
    CHECK(stats.timed_out == 1);
    CHECK(stats.pending == 0);
}

namespace {

asio::awaitable<void> connect_and_send(asio::any_io_executor ex, std::uint16_t port, Tally& t, bool& done) {
    auto c = co_await async::Connection::connect(ex, "127.0.0.1", port, options());
    if (t.ok(c, "connect after the descriptors came back")) {
        auto mr = must(c->alloc_local_mr(8));
        t.ok(co_await c->send(mr.slice(0, 1)), "send");
    }
    done = true;
}

asio::awaitable<void> accept_one(async::Listener& listener, Tally& t, bool& done) {
    auto c = co_await listener.accept(20s);
    if (t.ok(c, "accept after the descriptors came back")) {
        std::array<std::byte, 8> buffer{};
        t.ok(co_await c->receive(buffer), "receive");
    }
    done = true;
}

} // namespace

TEST_CASE("async Listener: clients not yet accepted count against max_pending_handshakes; more are turned away") {
    asio::io_context io;
    ConnectionOptions o = options();
    o.max_pending_handshakes = 4;
    auto listener = must(async::Listener::listen(io.get_executor(), "127.0.0.1", 0, o));
    constexpr int n = 10;
    std::array<std::atomic<int>, n> outcome{}; // 0 connecting, 1 connected, 2 refused
    std::atomic<bool> leave{false};
    std::vector<std::thread> clients;
    for (int i = 0; i < n; ++i)
        clients.emplace_back([&, i, port = listener.port()] {
            ConnectionOptions c = options();
            c.timeout = 5s;
            auto conn = Connection::connect("127.0.0.1", port, c);
            outcome[i] = conn ? 1 : 2;
            while (conn && !leave)
                std::this_thread::sleep_for(1ms);
        });
    // nobody accepts: the listener serves on its own, and holds at most 4 clients
    std::size_t most_held = 0;
    const auto settled = [&] {
        return std::all_of(outcome.begin(), outcome.end(), [](const std::atomic<int>& x) { return x != 0; });
    };
    // settled: every client knows its fate, and the listener finished the handshakes
    // (a client is connected a step before the listener reads its confirmation)
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!(settled() && listener.stats().pending == 0) && std::chrono::steady_clock::now() < deadline) {
        io.restart();
        io.run_for(10ms);
        const ListenerStats stats = listener.stats();
        most_held = std::max(most_held, stats.pending + stats.ready);
    }
    const ListenerStats stats = listener.stats();
    CHECK(most_held <= 4);
    CHECK(stats.ready == 4);
    CHECK(stats.turned_away + stats.failed >= n - 4);
    CHECK(std::count(outcome.begin(), outcome.end(), 1) == 4);
    CHECK(std::count(outcome.begin(), outcome.end(), 2) == n - 4);
    leave = true;
    for (std::thread& t : clients)
        t.join();
}

TEST_CASE("async Listener: out of file descriptors, it rests between accepts rather than spin, and serves once it "
          "has them again") {
    const test::CapturedLog log; // the listener's warnings
    asio::io_context io;
    auto listener = must(async::Listener::listen(io.get_executor(), "127.0.0.1", 0, options()));
    std::vector<asio::ip::tcp::socket> queued; // clients the kernel took, waiting for the accept
    for (int i = 0; i < 3; ++i)
        queued.emplace_back(io).connect({asio::ip::make_address("127.0.0.1"), listener.port()});
    {
        const test::NoMoreFiles starved; // each accept fails (EMFILE), the connection stays queued
        const auto until = std::chrono::steady_clock::now() + 1500ms;
        while (std::chrono::steady_clock::now() < until) {
            io.restart();
            io.run_for(10ms);
        }
    }
    // rests of 10, 20, 40 ... ms: 8 accepts in 1.5 s (thousands, spinning on the ready fd)
    const std::size_t failed_accepts = log.count("Listener: accept");
    CHECK(failed_accepts >= 1);
    CHECK(failed_accepts <= 12);
    CHECK(log.count("Too many open files") >= 1);
    Tally t;
    bool accepted = false, sent = false;
    asio::co_spawn(io, accept_one(listener, t, accepted), asio::detached);
    asio::co_spawn(io, connect_and_send(io.get_executor(), listener.port(), t, sent), asio::detached);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!(accepted && sent) && std::chrono::steady_clock::now() < deadline) {
        io.restart();
        io.run_for(10ms);
    }
    CHECK(accepted);
    CHECK(sent);
    CHECK(t.failures == 0);
}

// --- a blocking peer --------------------------------------------------------------

namespace {

asio::awaitable<void> async_side(asio::any_io_executor ex, std::uint16_t port, Tally& t, bool& done) {
    auto c = co_await async::Connection::connect(ex, "127.0.0.1", port, options());
    if (t.ok(c, "connect to a blocking listener")) {
        auto remote = co_await c->request_remote_mr(4096);
        if (t.ok(remote, "request_remote_mr from a blocking peer")) {
            auto mr = must(c->alloc_local_mr(4096));
            std::memset(mr.data(), 0x33, 4096);
            t.ok(co_await c->write(mr.all(), remote->memory), "write");
            t.ok(co_await c->send(mr.slice(0, 16)), "send");
            t.ok(co_await c->send_remote_mr(*remote), "send_remote_mr");
        }
        t.ok(co_await c->close(), "close");
    }
    done = true;
}

} // namespace

TEST_CASE("async Connection: a blocking Listener on another thread is the same protocol") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, options()));
    std::optional<Error> server_error;
    bool checked = false;
    std::thread server([&] {
        auto run = [&]() -> Result<void> {
            auto c = listener.accept(20s);
            if (!c)
                return std::unexpected(c.error());
            std::array<std::byte, 16> in{};
            auto got = c->receive(in);
            if (!got)
                return std::unexpected(got.error());
            auto mr = c->receive_local_mr();
            if (!mr)
                return std::unexpected(mr.error());
            checked = got->size == 16 && in[15] == std::byte{0x33} && mr->data()[4095] == std::byte{0x33};
            // the client closes first: its goodbye, then ours (closing at once, each would
            // see the other's goodbye instead of its own completions)
            auto bye = c->receive(in);
            if (bye || bye.error().code() != ECONNRESET)
                return std::unexpected(Error::protocol("test", "no goodbye from the async client"));
            return {};
        };
        if (auto ok = run(); !ok)
            server_error = ok.error();
    });
    asio::io_context io;
    Tally t;
    bool done = false;
    asio::co_spawn(io, async_side(io.get_executor(), listener.port(), t, done), asio::detached);
    REQUIRE(test::run_until(io, [&] { return done; }, 60s));
    server.join();
    CHECK(t.failures == 0);
    CHECK(!server_error.has_value());
    CHECK(checked);
}

// --- cancellation -----------------------------------------------------------------

namespace {

// A READ of `remote` into `local`, cancelled (terminally) 1 ms after it began, then,
// if `emissions` is 2, once more as soon as the io_context gets to it: after the READ's
// coroutine resumed from its wait and began to drain the flush. How the READ ended.
asio::awaitable<Result<void>> cancelled_read(async::Connection& c, LocalSlice local, RemoteMemory remote,
                                             int emissions) {
    auto ex = co_await asio::this_coro::executor;
    asio::cancellation_signal cancel;
    std::optional<Result<void>> outcome;
    asio::co_spawn(ex, c.read(local, remote),
                   asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr, Result<void> r) {
                       outcome = std::move(r);
                   }));
    asio::steady_timer soon(ex, 1ms);
    co_await soon.async_wait(asio::use_awaitable);
    cancel.emit(asio::cancellation_type::terminal);
    if (emissions == 2)
        asio::post(ex, [&cancel] { cancel.emit(asio::cancellation_type::terminal); });
    while (!outcome) {
        soon.expires_after(1ms);
        co_await soon.async_wait(asio::use_awaitable);
    }
    co_return std::move(*outcome);
}

asio::awaitable<void> cancel_then_use(async::Listener& listener, Tally& t, bool& done) {
    auto ex = co_await asio::this_coro::executor;
    auto c = co_await async::Connection::connect(ex, "127.0.0.1", listener.port(), options());
    auto s = co_await listener.accept(10s);
    if (t.ok(c, "connect") && t.ok(s, "accept")) {
        // nothing posted: the receive ends cancelled and the connection lives on
        std::array<std::byte, 8> in{};
        asio::steady_timer timer(ex, 50ms);
        auto raced = co_await (c->receive(in) || timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
        t.check(raced.index() == 1, "the timer won");
        auto mr = must(s->alloc_local_mr(8));
        t.ok(co_await s->send(mr.slice(0, 8)), "send after the cancelled receive");
        auto got = co_await c->receive(in);
        t.check(got && got->size == 8, "the connection still works");
        // a posted READ cancelled: the call resumes only after its completion. A READ
        // still in flight is flushed (Error::cancelled) and the connection ends; one the
        // NIC finished first returns what it did. (Not `read || timer`: that hides which,
        // and the READ can complete in the very turn the timer fires.)
        auto remote = co_await c->request_remote_mr(4 << 20);
        if (t.ok(remote, "request_remote_mr")) {
            auto local = must(c->alloc_local_mr(4 << 20));
            const auto outcome = co_await cancelled_read(*c, local.all(), remote->memory, 1);
            if (outcome) {
                MESSAGE("the READ completed before its cancellation");
            } else {
                t.check(outcome.error().is_cancelled(), "the cancelled READ ends with Error::cancelled");
                auto after = co_await c->write(local.slice(0, 8), remote->slice(0, 8));
                t.check(!after, "the connection ended with the cancelled READ");
            }
        }
    }
    done = true;
}

} // namespace

TEST_CASE("async Connection: a cancelled wait leaves the connection usable; a cancelled posted READ ends it safely") {
    asio::io_context io;
    auto listener = must(async::Listener::listen(io.get_executor(), "127.0.0.1", 0, options()));
    Tally t;
    bool done = false;
    asio::co_spawn(io, cancel_then_use(listener, t, done), asio::detached);
    REQUIRE(test::run_until(io, [&] { return done; }, 60s));
    CHECK(t.failures == 0);
}

// A posted READ cancelled, then cancelled again while it waits for its flush (an
// enclosing task cancelled after `read || timer`'s timer won, say): the second
// cancellation does not cut the wait short, and the call resumes only once the NIC is
// done with the READ's memory.
namespace {

asio::awaitable<void> cancel_twice(async::Listener& listener, Tally& t, bool& cancelled, bool& done) {
    auto ex = co_await asio::this_coro::executor;
    auto c = co_await async::Connection::connect(ex, "127.0.0.1", listener.port(), options());
    auto s = co_await listener.accept(10s);
    if (t.ok(c, "connect") && t.ok(s, "accept")) {
        auto remote = co_await c->request_remote_mr(4 << 20);
        REQUIRE_MESSAGE(remote, (remote ? "" : remote.error().message()));
        auto local = must(c->alloc_local_mr(4 << 20));
        const auto outcome = co_await cancelled_read(*c, local.all(), remote->memory, 2);
        cancelled = !outcome && outcome.error().is_cancelled();
    }
    done = true;
}

} // namespace

TEST_CASE("async Connection: a posted READ cancelled twice resumes only after its flush") {
    const test::CapturedLog log;
    asio::io_context io;
    auto listener = must(async::Listener::listen(io.get_executor(), "127.0.0.1", 0, options()));
    Tally t;
    bool cancelled = false, done = false;
    asio::co_spawn(io, cancel_twice(listener, t, cancelled, done), asio::detached);
    REQUIRE(test::run_until(io, [&] { return done; }, 60s));
    CHECK(t.failures == 0);
    REQUIRE_MESSAGE(cancelled, "the READ completed before its cancellation: nothing tested");
    // the drain waited for the flush: it said nothing of one not done
    CHECK_MESSAGE(log.count("did not complete") == 0, log.text());
}

// --- a peer that dies -------------------------------------------------------------

namespace {

asio::awaitable<void> wait_on_dying_peer(async::Listener& listener, Tally& t, std::chrono::milliseconds& took,
                                         bool& done) {
    auto c = co_await listener.accept(20s);
    if (t.ok(c, "accept the doomed client")) {
        const auto start = std::chrono::steady_clock::now();
        std::array<std::byte, 8> in{};
        auto got = co_await c->receive(in, 30s);
        took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        t.check(!got && !got.error().is_timeout(), "the receive ended with an Error that is not a timeout");
        auto imm = co_await c->receive_write_imm(30s);
        t.check(!imm, "later calls fail at once");
    }
    done = true;
}

} // namespace

TEST_CASE("async Connection: a peer process that dies ends the pending calls, well before their timeout") {
    asio::io_context io;
    auto listener = must(async::Listener::listen(io.get_executor(), "127.0.0.1", 0, options()));
    const std::uint16_t port = listener.port();
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        // a blocking client that connects, and dies without a goodbye
        auto c = Connection::connect("127.0.0.1", port, options());
        std::this_thread::sleep_for(200ms);
        ::_exit(c ? 0 : 1);
    }
    Tally t;
    bool done = false;
    std::chrono::milliseconds took{};
    asio::co_spawn(io, wait_on_dying_peer(listener, t, took, done), asio::detached);
    REQUIRE(test::run_until(io, [&] { return done; }, 60s));
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(t.failures == 0);
    CHECK(took < 10s);
}

// --- RDMA CM ----------------------------------------------------------------------

namespace {

asio::awaitable<void> cm_server(async::Listener& listener, Tally& t, int& served) {
    for (int i = 0; i < 2; ++i) {
        auto c = co_await listener.accept(20s);
        if (!t.ok(c, "accept over RDMA CM"))
            break;
        std::array<std::byte, 8> in{};
        auto got = co_await c->receive(in);
        t.check(got && got->size == 8, "a message over RDMA CM");
        auto bye = co_await c->receive(in);
        t.check(!bye && bye.error().code() == ECONNRESET, "the client's goodbye");
        ++served;
    }
}

// WRITEs, one after another, until `stop`; then `stopped`.
asio::awaitable<void> write_until(async::Connection& c, LocalSlice source, RemoteMemory remote, const bool& stop,
                                  int& writes, bool& stopped, Tally& t) {
    while (!stop) {
        const auto wrote = co_await c.write(source, remote);
        if (!t.ok(wrote, "a WRITE while another connection is made"))
            break;
        ++writes;
    }
    stopped = true;
}

asio::awaitable<void> cm_client(asio::any_io_executor ex, std::string host, std::uint16_t port, Tally& t,
                                bool& done) {
    ConnectionOptions o = options();
    o.transport = Transport::rdma_cm;
    auto first = co_await async::Connection::connect(ex, host, port, o);
    if (t.ok(first, "connect over RDMA CM")) {
        // the first connection's WRITEs complete while the second's QP is made: the
        // group's CQ is polled for them meanwhile (the QP is made on the io_context's
        // thread, its CQ entries held there, not on the thread that waits for RDMA CM)
        auto remote = co_await first->request_remote_mr(4096);
        t.ok(remote, "request_remote_mr (first)");
        auto source = must(first->alloc_local_mr(4096));
        bool connected = false, stopped = !remote;
        int writes = 0;
        if (remote)
            asio::co_spawn(ex, write_until(*first, source.all(), remote->memory, connected, writes, stopped, t),
                           asio::detached);
        auto second = co_await first->connect_another(host, port);
        connected = true;
        for (asio::steady_timer pause(ex); !stopped;) {
            pause.expires_after(1ms);
            co_await pause.async_wait(asio::use_awaitable);
        }
        MESSAGE(writes, " WRITEs completed on the first connection while the second connected");
        if (t.ok(second, "connect_another over RDMA CM")) {
            auto mr = must(first->alloc_local_mr(8));
            t.ok(co_await first->send(mr.all()), "send (first)");
            t.ok(co_await second->send(mr.all()), "send (second)");
            t.ok(co_await second->close(), "close (second)");
        }
        t.ok(co_await first->close(), "close (first)");
    }
    done = true;
}

} // namespace

TEST_CASE("async Connection over RDMA CM: connect and connect_another without blocking the io_context") {
    asio::io_context io;
    ConnectionOptions o = options();
    o.transport = Transport::rdma_cm;
    const std::string host = test::cm_address();
    auto listener = must(async::Listener::listen(io.get_executor(), host, 0, o));
    Tally t;
    int served = 0;
    bool done = false;
    asio::co_spawn(io, cm_server(listener, t, served), asio::detached);
    asio::co_spawn(io, cm_client(io.get_executor(), host, listener.port(), t, done), asio::detached);
    REQUIRE(test::run_until(io, [&] { return done; }, 60s));
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (served < 2 && std::chrono::steady_clock::now() < deadline) {
        io.restart();
        io.run_for(10ms);
    }
    CHECK(served == 2);
    CHECK(t.failures == 0);
}

// An io_context destroyed while a connect waits for RDMA CM's answer (a listener that
// never answers): its destruction waits for that wait (an attempt's time at most) and
// destroys the connect with it; the wait's end resumed into the freed io_context, and
// the connect's coroutine, QP and PD outlived it.
TEST_CASE("async Connection over RDMA CM: an io_context destroyed while a connect waits for RDMA CM") {
    const std::string host = test::cm_address();
    const CmListener silent = must(CmListener::listen(host, 0)); // takes no request: none is answered
    ConnectionOptions o = options();
    o.transport = Transport::rdma_cm;
    o.timeout = 2s;
    bool ended = false, frame_gone = false;
    struct Gone { // in the connecting coroutine's frame
        bool* gone;
        ~Gone() { *gone = true; }
    };
    std::chrono::steady_clock::time_point destroying;
    {
        asio::io_context io;
        asio::co_spawn(
            io,
            [&]() -> asio::awaitable<void> {
                const Gone gone{&frame_gone};
                (void)co_await async::Connection::connect(io.get_executor(), host, silent.port(), o);
                ended = true;
            },
            asio::detached);
        io.run_for(300ms);
        REQUIRE_FALSE(ended);
        destroying = std::chrono::steady_clock::now();
    }
    const auto took = std::chrono::steady_clock::now() - destroying;
    MESSAGE("the io_context's destruction took ",
            std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), " ms");
    CHECK(took < 10s);
    CHECK(frame_gone);  // with the io_context, and its QP, PD and context
    CHECK_FALSE(ended); // destroyed, not resumed
    std::this_thread::sleep_for(1500ms); // past the attempt it waited for: nothing is left to wake
}
