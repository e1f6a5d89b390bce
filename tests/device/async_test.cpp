// lib/async on a real device: every operation in every completion mode, many in
// flight from one thread, the queue-entry wait, cancellation and quiescing.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/redirect_error.hpp>
#include <asio/write.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/async/completions.hpp>
#include <rdmaxx/async/error_code.hpp>
#include <rdmaxx/async/queue_pair.hpp>
#include <rdmaxx/async/task.hpp>
#include <rdmaxx/async/tcp.hpp>

#include "../support/allocations.hpp"
#include "../support/capabilities.hpp"
#include "../support/device.hpp"
#include "../support/run_until.hpp"
#include "../support/starved.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// operator new and aligned_alloc are counted while a window is open (the zero-allocation case:
// support/allocations.cpp).
using rdmaxx::test::allocations;
using rdmaxx::test::counting;

using namespace rdmaxx;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
using rdmaxx::test::must;

namespace {

constexpr std::array modes = {async::CompletionMode::event, async::CompletionMode::busy,
                              async::CompletionMode::hybrid, async::CompletionMode::manual};

std::string name(async::CompletionMode mode) {
    switch (mode) {
    case async::CompletionMode::event: return "event";
    case async::CompletionMode::busy: return "busy";
    case async::CompletionMode::hybrid: return "hybrid";
    case async::CompletionMode::manual: return "manual";
    }
    return "?";
}

// Two connected RC QPs of one process on async CQs of one io_context, and 1 MiB of
// registered memory per side.
struct AsyncPair {
    asio::io_context io;
    Context context = must(Context::open());
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    async::CompletionQueue cq_a, cq_b;
    async::QueuePair a, b;
    MemoryRegion mem_a = must(MemoryRegion::allocate(pd, 1 << 20, access_all));
    MemoryRegion mem_b = must(MemoryRegion::allocate(pd, 1 << 20, access_all));

    explicit AsyncPair(async::CompletionMode mode, QpCaps caps = {.max_send_wr = 64, .max_recv_wr = 64},
                       QpConnectOptions options = {})
        : cq_a(must(async::CompletionQueue::create(io, context, {.depth = 256}, {.mode = mode}))),
          cq_b(must(async::CompletionQueue::create(io, context, {.depth = 256}, {.mode = mode}))),
          a(attach(cq_a, caps)), b(attach(cq_b, caps)) {
        must(a.get().connect(b.get().endpoint(), options));
        must(b.get().connect(a.get().endpoint(), options));
    }
    async::QueuePair attach(async::CompletionQueue& cq, QpCaps caps) {
        auto qp = must(QueuePair::create(pd, {.send_cq = &cq.get(), .recv_cq = &cq.get(), .caps = caps}));
        return async::QueuePair::attach(std::move(qp), cq, cq);
    }
    // Runs the io_context until `done`; a manual-mode io_context is polled by hand.
    void run_until(const bool& done, std::chrono::seconds bound = 30s) {
        const auto deadline = std::chrono::steady_clock::now() + bound;
        while (!done && std::chrono::steady_clock::now() < deadline) {
            if (cq_a.mode() == async::CompletionMode::manual)
                async::Completions::of(io).poll();
            io.restart();
            io.run_for(10ms);
        }
        REQUIRE(done);
    }
};

// Every operation of async::QueuePair, awaited in turn through `token` by a coroutine of
// type Coroutine (asio::awaitable, async::Task); counts the checks that failed (a
// coroutine must not throw out of doctest's macros).
template <class Coroutine, class Token>
Coroutine every_operation(AsyncPair& p, Token token, int& failures, bool& done) {
    int step = 0;
    auto fails = [&](bool ok) {
        ++step;
        if (!ok)
            MESSAGE("step ", step, " failed");
        failures += ok ? 0 : 1;
    };
    test::fill(p.mem_a.bytes().subspan(0, 4096), 1);
    // WRITE, then READ it back
    auto w = co_await p.a.write(p.mem_a.slice(0, 4096), p.mem_b.remote().slice(0, 4096), token);
    fails(w.has_value());
    fails(std::memcmp(p.mem_a.data(), p.mem_b.data(), 4096) == 0);
    auto r = co_await p.a.read(p.mem_a.slice(8192, 4096), p.mem_b.remote().slice(0, 4096), token);
    fails(r.has_value() && r->opcode() == WcOpcode::rdma_read);
    fails(std::memcmp(p.mem_a.data() + 8192, p.mem_b.data(), 4096) == 0);
    // SEND with an immediate into a receive posted first (a callback initiates at once;
    // the awaitable of co_spawn would post it only when awaited)
    std::optional<Result<WorkCompletion>> got;
    auto keep = [&got](Result<WorkCompletion> r) { got = std::move(r); };
    p.b.receive(p.mem_b.slice(65536, 256), keep);
    auto s = co_await p.a.send_with_imm(p.mem_a.slice(0, 200), 0xfeed, token);
    fails(s.has_value());
    while (!got)
        co_await asio::post(p.io.get_executor(), token);
    fails(got->has_value() && (*got)->byte_len() == 200 && (*got)->imm() == 0xfeedu);
    // WRITE_WITH_IMM consumes a receive
    got.reset();
    p.b.receive(p.mem_b.slice(65536, 256), keep);
    auto wi = co_await p.a.write_with_imm(p.mem_a.slice(0, 64), p.mem_b.remote().slice(4096, 64), 7, token);
    fails(wi.has_value());
    while (!got)
        co_await asio::post(p.io.get_executor(), token);
    fails(got->has_value() && (*got)->opcode() == WcOpcode::recv_rdma_with_imm && (*got)->imm() == 7u);
    // atomics (where the device has them: rxe does)
    if (p.a.get().supports_atomics()) {
        std::memset(p.mem_b.data() + 16384, 0, 8);
        auto faa = co_await p.a.fetch_add(p.mem_a.slice(32768, 8), p.mem_b.remote().slice(16384, 8), 5, token);
        fails(faa.has_value());
        auto cas = co_await p.a.compare_swap(p.mem_a.slice(32768, 8), p.mem_b.remote().slice(16384, 8), 5, 9, token);
        std::uint64_t old = 0, now = 0;
        std::memcpy(&old, p.mem_a.data() + 32768, 8);
        std::memcpy(&now, p.mem_b.data() + 16384, 8);
        fails(cas.has_value() && old == 5 && now == 9);
    }
    // a prebuilt batch of three WRITEs as one operation
    SendBatch<3> batch(p.a.get());
    for (std::size_t k = 0; k < 3; ++k)
        batch.write(p.mem_a.slice(k * 100, 100), p.mem_b.remote().slice(200000 + k * 100, 100));
    auto posted = co_await p.a.post(batch, token);
    fails(posted.has_value());
    fails(std::memcmp(p.mem_a.data(), p.mem_b.data() + 200000, 300) == 0);
    done = true;
}

} // namespace

TEST_CASE("every async operation completes with its data, in every completion mode, awaited by an "
          "asio::awaitable and by an async::Task") {
    for (const auto mode : modes)
        for (const bool task : {false, true}) {
            CAPTURE(name(mode));
            CAPTURE(task);
            AsyncPair p(mode);
            int failures = 0;
            bool done = false;
            if (task)
                async::spawn(p.io.get_executor(),
                             every_operation<async::Task<void>>(p, async::use_task, failures, done));
            else
                asio::co_spawn(p.io, every_operation<asio::awaitable<void>>(p, asio::use_awaitable, failures, done),
                               asio::detached);
            p.run_until(done);
            CHECK(failures == 0);
            CHECK(async::Completions::of(p.io).in_flight() == 0);
            CHECK(p.a.posted() == 0);
            CHECK_FALSE(p.a.dead());
        }
}

TEST_CASE("an io_context without operations in flight has nothing to run: run() returns") {
    for (const auto mode : {async::CompletionMode::event, async::CompletionMode::busy, async::CompletionMode::hybrid}) {
        CAPTURE(name(mode));
        AsyncPair p(mode);
        bool done = false;
        p.a.write(p.mem_a.slice(0, 64), p.mem_b.remote().slice(0, 64),
                  [&](Result<WorkCompletion> r) { done = r.has_value(); });
        p.io.run(); // returns once the write completed: no driver left pending
        CHECK(done);
    }
}

// More operations than the send queue holds: they wait for entries, in order.
// What a sink saw: each wr_id once, every completion a success.
struct SinkTally {
    std::vector<int> seen;
    int failures = 0;
    std::size_t total = 0;
    static void take(void* self, std::span<const WorkCompletion> completions) {
        auto& tally = *static_cast<SinkTally*>(self);
        for (const WorkCompletion& wc : completions) {
            tally.failures += wc.ok() && wc.wr_id() < tally.seen.size() ? 0 : 1;
            if (wc.wr_id() < tally.seen.size())
                ++tally.seen[wc.wr_id()];
            ++tally.total;
        }
    }
};

// Two RC QPs on a sink CQ, connected to each other: `messages` sends from a (wr_ids
// 0..messages-1) to receives of b (messages..2 messages-1), posted.
struct SinkLoopback {
    Context context;
    ProtectionDomain pd;
    MemoryRegion mem;
    SinkTally tally;
    std::optional<async::CompletionQueue> cq;
    std::optional<QueuePair> a, b;
    SinkLoopback(asio::io_context& io, async::CompletionMode mode, int messages, std::uint32_t depth)
        : context(must(Context::open())), pd(must(ProtectionDomain::create(context))),
          mem(must(MemoryRegion::allocate(pd, static_cast<std::size_t>(2 * messages) * 64, access_all))) {
        tally.seen.assign(static_cast<std::size_t>(2 * messages), 0);
        cq.emplace(must(async::CompletionQueue::create(io, context, async::CompletionSink{&tally, &SinkTally::take},
                                                       {.depth = depth}, {.mode = mode})));
        const QpOptions options{.send_cq = &cq->get(), .recv_cq = &cq->get(),
                                .caps = {.max_send_wr = static_cast<std::uint32_t>(messages),
                                         .max_recv_wr = static_cast<std::uint32_t>(messages)}};
        a.emplace(must(QueuePair::create(pd, options)));
        b.emplace(must(QueuePair::create(pd, options)));
        must(a->connect(b->endpoint()));
        must(b->connect(a->endpoint()));
        for (int i = 0; i < messages; ++i)
            must(post_recv(*b, mem.slice(static_cast<std::size_t>(messages + i) * 64, 64),
                           static_cast<std::uint64_t>(messages + i)));
        for (int i = 0; i < messages; ++i)
            must(post_send(*a, mem.slice(static_cast<std::size_t>(i) * 64, 64),
                           {.wr_id = static_cast<std::uint64_t>(i), .signaled = true}));
    }
};

TEST_CASE("a CQ with a CompletionSink hands it every completion of raw posts, and is driven until destroyed") {
    constexpr int messages = 500; // sends 0..499 and their receives 500..999
    for (const auto mode : modes) {
        CAPTURE(name(mode));
        asio::io_context io;
        SinkLoopback sink(io, mode, messages, 2048);
        auto& [context, pd, mem, tally, cq, a, b] = sink;
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while (tally.total < 2 * messages && std::chrono::steady_clock::now() < deadline) {
            if (mode == async::CompletionMode::manual)
                cq->poll();
            io.restart();
            io.run_for(10ms);
        }
        CHECK(tally.total == 2 * messages);
        CHECK(tally.failures == 0);
        CHECK(std::count(tally.seen.begin(), tally.seen.end(), 1) == 2 * messages);
        // destroyed, the sink CQ is no longer driven: run() returns at once
        a.reset();
        b.reset();
        cq.reset();
        io.restart();
        const auto start = std::chrono::steady_clock::now();
        io.run_for(5s);
        CHECK(std::chrono::steady_clock::now() - start < 4s);
    }
}

// A sink CQ destroyed with completions still in it, its busy or hybrid turn pending:
// the turn polls it no more. (It took them for operations of the service's: stale at
// best, and a wr_id that named a live operation would have ended it.)
TEST_CASE("a sink CQ destroyed with completions in it: its pending turn takes none of them") {
    constexpr int messages = 16;
    for (const auto mode : {async::CompletionMode::busy, async::CompletionMode::hybrid}) {
        CAPTURE(name(mode));
        asio::io_context io;
        SinkLoopback sink(io, mode, messages, 64);
        auto& [context, pd, mem, tally, cq, a, b] = sink;
        std::this_thread::sleep_for(300ms); // the device completes them; the io_context has not run
        a.reset();
        b.reset();
        cq.reset();
        io.run_for(500ms);
        CHECK(tally.total == 0);
        CHECK(async::Completions::of(io).stale_completions() == 0);
    }
}

TEST_CASE("200 writes on a send queue of 8 wait for entries and complete in order") {
    AsyncPair p(async::CompletionMode::busy, {.max_send_wr = 8, .max_recv_wr = 8});
    std::vector<int> order;
    for (int i = 0; i < 200; ++i)
        p.a.write(p.mem_a.slice(static_cast<std::size_t>(i) * 8, 8),
                  p.mem_b.remote().slice(static_cast<std::size_t>(i) * 8, 8),
                  [&order, i](Result<WorkCompletion> r) { order.push_back(r ? i : -1 - i); });
    CHECK(p.a.posted() <= 8);
    p.io.run();
    REQUIRE(order.size() == 200);
    for (int i = 0; i < 200; ++i)
        CHECK(order[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("a handler's exception leaves run(); the rest of its batch, the write it started and later "
          "operations still complete") {
    // Asio's rule: an exception out of a handler leaves run(), and run() may be called
    // again. What the poll had taken besides (the batch's later completions), the write
    // the handler started (held for the batch's doorbell) and the CQ's driving must
    // survive it: they were lost before (8 writes: 3 handlers ran, then none again).
    for (const auto mode : modes) {
        CAPTURE(name(mode));
        AsyncPair p(mode);
        int ran = 0, failed = 0, threw = 0;
        bool started_done = false;
        for (int i = 0; i < 8; ++i)
            p.a.write(p.mem_a.slice(static_cast<std::size_t>(i) * 8, 8),
                      p.mem_b.remote().slice(static_cast<std::size_t>(i) * 8, 8),
                      [&, i](Result<WorkCompletion> r) {
                          ++ran;
                          failed += r ? 0 : 1;
                          if (i != 2)
                              return;
                          p.a.write(p.mem_a.slice(64, 8), p.mem_b.remote().slice(64, 8),
                                    [&started_done](Result<WorkCompletion> w) { started_done = w.has_value(); });
                          throw std::runtime_error("the application's");
                      });
        std::this_thread::sleep_for(100ms); // all 8 in the CQ before its first poll: one batch
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while (!(ran == 8 && started_done) && std::chrono::steady_clock::now() < deadline) {
            try {
                if (mode == async::CompletionMode::manual)
                    async::Completions::of(p.io).poll();
                p.io.restart();
                p.io.run_for(10ms);
            } catch (const std::runtime_error&) {
                ++threw;
            }
        }
        CHECK(threw == 1);
        CHECK(ran == 8);
        CHECK(failed == 0);
        CHECK(started_done);
        CHECK(async::Completions::of(p.io).in_flight() == 0);
        // and the CQ is driven as before
        bool later = false;
        p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8),
                  [&later](Result<WorkCompletion> w) { later = w.has_value(); });
        p.run_until(later);
        CHECK(later);
    }
}

TEST_CASE("an operation cancelled while it waits for entries ends cleanly; the QP lives on") {
    AsyncPair p(async::CompletionMode::event, {.max_send_wr = 2, .max_recv_wr = 2});
    int ok = 0;
    std::optional<Result<WorkCompletion>> cancelled;
    const auto depth = static_cast<int>(p.a.get().caps().max_send_wr); // the device may round 2 up
    for (int i = 0; i < depth; ++i)
        p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) { ok += r ? 1 : 0; });
    asio::cancellation_signal signal;
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8),
              asio::bind_cancellation_slot(signal.slot(), [&](Result<WorkCompletion> r) { cancelled = std::move(r); }));
    signal.emit(asio::cancellation_type::total);
    p.io.run();
    REQUIRE(cancelled.has_value());
    REQUIRE_FALSE(cancelled->has_value());
    CHECK(cancelled->error().is_cancelled());
    CHECK(async::to_error_code(cancelled->error()) == std::errc::operation_canceled);
    CHECK(ok == depth);
    CHECK_FALSE(p.a.dead());
    p.io.restart();
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) { ok += r ? 1 : 0; });
    p.io.run();
    CHECK(ok == depth + 1);
}

namespace {

int refuse_arm(ibv_cq*, int) { return EIO; }

// `n` receives on b, each waiting a while for a's SEND: its CQ has nothing to find when
// it goes to sleep (a loopback WRITE completes within its post).
asio::awaitable<void> receive_in_turn(AsyncPair& p, int n, int& ok, bool& done) {
    const auto executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(executor);
    for (int i = 0; i < n; ++i) {
        std::optional<Result<WorkCompletion>> got;
        p.b.receive(p.mem_b.slice(0, 64), [&got](Result<WorkCompletion> r) { got = std::move(r); });
        timer.expires_after(5ms);
        co_await timer.async_wait(asio::use_awaitable);
        const bool sent = (co_await p.a.send(p.mem_a.slice(0, 64))).has_value();
        while (!got)
            co_await asio::post(executor, asio::use_awaitable);
        ok += sent && got->has_value() ? 1 : 0;
    }
    done = true;
}

} // namespace

TEST_CASE("an event CQ whose arm fails is polled instead: every operation completes") {
    AsyncPair p(async::CompletionMode::event);
    // the device refuses every arm of this context's CQs (its provider's entry point)
    const test::ReplacedOp arm(p.context.get()->ops.req_notify_cq, refuse_arm);
    int ok = 0;
    bool done = false;
    asio::co_spawn(p.io, receive_in_turn(p, 20, ok, done), asio::detached);
    p.run_until(done, 20s); // the receive's CQ waited on its channel for an event that never came
    CHECK(ok == 20);
}

namespace {

int poll_nothing(ibv_cq*, int, ibv_wc*) { return 0; }

// A QP whose flush never comes (its device polls nothing once the write is posted),
// destroyed, then its CQs: in a process of its own (the leaked QP goes with it).
// Returns 0 when both went without aborting.
int qp_leaked_then_cq_destroyed() {
    auto p = std::make_unique<AsyncPair>(async::CompletionMode::manual);
    p->a.write(p->mem_a.slice(0, 8), p->mem_b.remote().slice(0, 8), [](Result<WorkCompletion>) {});
    p->context.get()->ops.poll_cq = poll_nothing;
    { async::QueuePair gone = std::move(p->a); } // 10 s without a flush: leaked
    { async::CompletionQueue cq = std::move(p->cq_a); } // it kept the CQ's count of QPs: this aborted
    return 0;
}

} // namespace

TEST_CASE("a QueuePair leaked for want of flushes lets its CQ be destroyed") {
    test::check_in_child(qp_leaked_then_cq_destroyed); // it died of SIGABRT: "an async::CompletionQueue destroyed
                                                       // before the QPs attached to it"
}

// --- doorbells: the sends a poll's handlers start go out together -------------------

namespace {

std::uint64_t word(const MemoryRegion& mem, std::size_t at) {
    std::uint64_t v = 0;
    std::memcpy(&v, mem.data() + at, sizeof v);
    return v;
}

void put_word(MemoryRegion& mem, std::size_t at, std::uint64_t v) { std::memcpy(mem.data() + at, &v, sizeof v); }

} // namespace

TEST_CASE("a completion's handler: its first write is posted at once, the next 7 held for one doorbell, in "
          "order; a batch after them rings them first") {
    AsyncPair p(async::CompletionMode::busy);
    async::Completions& service = async::Completions::of(p.io);
    for (std::uint64_t k = 0; k <= 9; ++k)
        put_word(p.mem_a, 8 * k, k);
    int ok = 0, failed = 0;
    auto count = [&](Result<WorkCompletion> r) { (r ? ok : failed) += 1; };
    SendBatch<1> last(p.a.get());
    last.write(p.mem_a.slice(8 * 9, 8), p.mem_b.remote().slice(0, 8));
    std::uint64_t doorbells = 0, sends = 0;
    // the first write is started here, outside a poll: posted at once
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(4096, 8), [&](Result<WorkCompletion> r) {
        count(std::move(r));
        doorbells = service.held_doorbells();
        sends = service.held_sends();
        // values 1..8 into one word, then the batch's 9: the word ends 9 only if the
        // held writes went out before the batch, in their order
        for (std::size_t k = 1; k <= 8; ++k)
            p.a.write(p.mem_a.slice(8 * k, 8), p.mem_b.remote().slice(0, 8), count);
        CHECK(p.a.posted() == 1); // the first; the others held, not posted yet
        p.a.post(last, count);
        CHECK(p.a.posted() == 9);
    });
    p.io.run();
    CHECK(failed == 0);
    CHECK(ok == 10);
    CHECK(service.held_doorbells() - doorbells == 1);
    CHECK(service.held_sends() - sends == 7);
    CHECK(word(p.mem_b, 0) == 9);
}

namespace {

asio::awaitable<void> stream_writes(AsyncPair& p, std::size_t worker, std::size_t rounds, int& failures, int& ended) {
    for (std::size_t k = 0; k < rounds; ++k) {
        const std::size_t at = (worker * rounds + k) * 64;
        auto w = co_await p.a.write(p.mem_a.slice(at, 64), p.mem_b.remote().slice(at, 64));
        failures += w ? 0 : 1;
    }
    ++ended;
}

} // namespace

TEST_CASE("16 coroutines streaming writes on one QP: the writes their completions start share doorbells, and "
          "every byte lands") {
    for (const auto mode : {async::CompletionMode::busy, async::CompletionMode::event, async::CompletionMode::hybrid}) {
        CAPTURE(name(mode));
        constexpr std::size_t workers = 16, rounds = 200;
        AsyncPair p(mode);
        test::fill(p.mem_a.bytes(), 5);
        async::Completions& service = async::Completions::of(p.io);
        const std::uint64_t doorbells = service.held_doorbells(), sends = service.held_sends();
        int failures = 0, ended = 0;
        for (std::size_t w = 0; w < workers; ++w)
            asio::co_spawn(p.io, stream_writes(p, w, rounds, failures, ended), asio::detached);
        p.io.run();
        CHECK(ended == static_cast<int>(workers));
        CHECK(failures == 0);
        // a poll that takes several completions holds all but (at most) one of the
        // writes they start: with 16 in flight, polls take several
        CHECK(service.held_sends() - sends > 0);
        CHECK(service.held_doorbells() - doorbells <= service.held_sends() - sends);
        MESSAGE(name(mode), ": ", service.held_sends() - sends, " held writes in ",
                service.held_doorbells() - doorbells, " doorbells");
        CHECK(std::memcmp(p.mem_a.data(), p.mem_b.data(), workers * rounds * 64) == 0);
    }
}

namespace {

// Writes of 64 bytes on p.a until `stop`, counting each completed one.
asio::awaitable<void> writes_until(AsyncPair& p, std::size_t worker, const bool& stop, std::size_t& completed,
                                   int& failures, int& ended) {
    while (!stop) {
        auto w = co_await p.a.write(p.mem_a.slice(worker * 64, 64), p.mem_b.remote().slice(worker * 64, 64));
        failures += w ? 0 : 1;
        ++completed;
    }
    ++ended;
}

asio::awaitable<void> echo_lines(asio::ip::tcp::acceptor& acceptor) {
    asio::ip::tcp::socket socket = co_await acceptor.async_accept(asio::use_awaitable);
    std::array<char, 64> line{};
    std::error_code ec;
    for (;;) {
        const std::size_t n = co_await socket.async_read_some(asio::buffer(line), asio::redirect_error(asio::use_awaitable, ec));
        if (ec)
            co_return;
        co_await asio::async_write(socket, asio::buffer(line.data(), n), asio::use_awaitable);
    }
}

// The most write completions counted while an expired timer waited for its handler,
// and while a byte went to the echo server and back, over `rounds` of each.
struct Waits {
    std::size_t timer = 0, echo = 0;
};

asio::awaitable<void> probe(asio::ip::tcp::endpoint server, int rounds, const std::size_t& completed, Waits& worst,
                            bool& stop) {
    auto executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(executor);
    asio::ip::tcp::socket socket(executor);
    co_await socket.async_connect(server, asio::use_awaitable);
    char byte = 'x';
    for (int r = 0; r < rounds; ++r) {
        std::size_t before = completed;
        timer.expires_after(0s);
        co_await timer.async_wait(asio::use_awaitable);
        worst.timer = std::max(worst.timer, completed - before);
        before = completed;
        co_await asio::async_write(socket, asio::buffer(&byte, 1), asio::use_awaitable);
        co_await asio::async_read(socket, asio::buffer(&byte, 1), asio::use_awaitable);
        worst.echo = std::max(worst.echo, completed - before);
    }
    stop = true;
}

} // namespace

TEST_CASE("a busy CQ that never runs dry lets an expired timer and a socket's echo run within a few turns' "
          "completions") {
    // A busy turn ends after DriveOptions::busy_polls polls or busy_completions
    // completions: a CQ kept full by 64 streaming writes hands the io_context to its
    // reactor every turn. Polls alone (1024 of up to 16 completions) held a socket's echo
    // for tens of thousands of completions (async_mixed: 6 lines echoed in 204,800
    // operations). An expired timer waits for the reactor's next run (one turn at most,
    // two with the one its coroutine's resumption queued behind); an echo takes a few
    // reactor runs (the server's read, the client's).
    AsyncPair p(async::CompletionMode::busy);
    constexpr std::size_t workers = 64;
    const std::size_t turn = async::DriveOptions{}.busy_completions + async::Completions::poll_batch;
    bool stop = false;
    std::size_t completed = 0;
    int failures = 0, ended = 0;
    for (std::size_t w = 0; w < workers; ++w)
        asio::co_spawn(p.io, writes_until(p, w, stop, completed, failures, ended), asio::detached);
    asio::ip::tcp::acceptor acceptor(p.io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    asio::co_spawn(p.io, echo_lines(acceptor), asio::detached);
    Waits worst;
    asio::co_spawn(p.io, probe(acceptor.local_endpoint(), 50, completed, worst, stop), asio::detached);
    p.run_until(stop, 120s);
    p.io.restart();
    p.io.run_for(30s); // the workers' last writes; the echo server sees the probe's socket closed
    MESSAGE(completed, " writes; at most ", worst.timer, " completed while an expired timer waited, ", worst.echo,
            " while a byte was echoed (a turn: up to ", turn, ")");
    CHECK(failures == 0);
    CHECK(ended == static_cast<int>(workers));
    CHECK(worst.timer <= 2 * turn);
    CHECK(worst.echo <= 6 * turn);
}

// Writes one after another, each started by the last one's completion (a callback
// initiates at once), until `left` is 0; then runs `last`.
struct ChainedWrites {
    AsyncPair* p;
    int left;
    int failures = 0;
    std::function<void()> last;
    void next() {
        p->a.write(p->mem_a.slice(0, 64), p->mem_b.remote().slice(0, 64), [this](Result<WorkCompletion> w) {
            failures += w ? 0 : 1;
            if (--left == 0)
                last();
            else
                next();
        });
    }
};

TEST_CASE("busy CQs of one io_context share their turns: a completion on one is taken while another's turn "
          "spins") {
    // A sink CQ is driven until destroyed, and its turn here lasts 4M polls (seconds on
    // rxe under TCG). Before, each CQ's completions waited for the turn of the CQ before
    // it to end: lib/rpc's RC transfers waited ~300 us per hop for its UD CQ's turns.
    // Now the 20 writes, each started by the last one's completion, all complete within
    // the sink's first turn, which ends when the last completion destroys the sink (before,
    // the sink's whole turn went first). The writes' CQ busy, or hybrid (spinning).
    for (const auto mode : {async::CompletionMode::busy, async::CompletionMode::hybrid}) {
        CAPTURE(name(mode));
        AsyncPair p(mode);
        SinkTally idle;
        std::optional<async::CompletionQueue> sink(must(async::CompletionQueue::create(
            p.io, p.context, async::CompletionSink{&idle, &SinkTally::take}, {.depth = 16},
            {.mode = async::CompletionMode::busy, .busy_polls = 1u << 22, .busy_completions = 1u << 22})));
        bool yielded = false, done = false, yielded_before_done = false;
        ChainedWrites writes{.p = &p, .left = 20, .last = [&] {
            yielded_before_done = yielded;
            sink.reset(); // the sink's turn sees nothing wanted and ends
            done = true;
        }};
        asio::post(p.io, [&] { yielded = true; }); // queued after the sink's first turn, before the writes' CQ's
        writes.next();
        p.run_until(done, 120s);
        CHECK(writes.failures == 0);
        CHECK_FALSE(yielded_before_done);
        CHECK(idle.total == 0);
    }
}

TEST_CASE("a held write cancelled before its doorbell ends cleanly; the QP lives on") {
    AsyncPair p(async::CompletionMode::busy);
    std::optional<Result<WorkCompletion>> cancelled;
    int ok = 0;
    asio::cancellation_signal signal;
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) {
        ok += r ? 1 : 0;
        // the handler's first write is posted at once, its second held
        p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> w) { ok += w ? 1 : 0; });
        p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8),
                  asio::bind_cancellation_slot(signal.slot(), [&](Result<WorkCompletion> c) { cancelled = std::move(c); }));
        signal.emit(asio::cancellation_type::terminal); // terminal: a posted write would kill the QP
    });
    p.io.run();
    REQUIRE(cancelled.has_value());
    REQUIRE_FALSE(cancelled->has_value());
    CHECK(cancelled->error().is_cancelled());
    CHECK_FALSE(p.a.dead());
    p.io.restart();
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) { ok += r ? 1 : 0; });
    p.io.run();
    CHECK(ok == 3);
}

// An io_context destroyed with writes waiting for send queue entries, the handler of
// one owning the QueuePair (and its CQ): the shutdown fails them, destroying that
// handler, and with it the QueuePair, while it was still failing the others on it (a
// use of freed memory, which the sanitizer build sees).
TEST_CASE("an io_context destroyed with waiting writes whose handler owns their QueuePair") {
    Context context = must(Context::open());
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    MemoryRegion mem = must(MemoryRegion::allocate(pd, 4096, access_all));
    std::optional<asio::io_context> io(std::in_place);
    struct Owned { // the QP goes first, then its CQ
        std::shared_ptr<async::CompletionQueue> cq;
        std::shared_ptr<async::QueuePair> qp;
    };
    auto cq = std::make_shared<async::CompletionQueue>(
        must(async::CompletionQueue::create(*io, context, {.depth = 64}, {.mode = async::CompletionMode::busy})));
    auto peer_cq = must(CompletionQueue::create(context, {.depth = 64})); // not driven: the peer only answers
    const QpCaps one{.max_send_wr = 1, .max_recv_wr = 1};
    auto raw = must(QueuePair::create(pd, {.send_cq = &cq->get(), .recv_cq = &cq->get(), .caps = one}));
    auto peer = must(QueuePair::create(pd, {.send_cq = &peer_cq, .recv_cq = &peer_cq, .caps = one}));
    must(raw.connect(peer.endpoint()));
    must(peer.connect(raw.endpoint()));
    auto qp = std::make_shared<async::QueuePair>(async::QueuePair::attach(std::move(raw), *cq, *cq));
    int ended = 0;
    qp->write(mem.slice(0, 8), mem.remote().slice(8, 8), [&ended](Result<WorkCompletion>) { ++ended; }); // posted
    for (int i = 0; i < 3; ++i) // waiting for the one entry; the first owns the QP
        qp->write(mem.slice(0, 8), mem.remote().slice(16, 8),
                  [&ended, owned = i == 0 ? Owned{cq, qp} : Owned{}](Result<WorkCompletion>) { ++ended; });
    qp.reset();
    cq.reset();
    io.reset(); // without running it: the handlers are destroyed, not called
    CHECK(ended == 0);
}

TEST_CASE("a QueuePair destroyed by a handler while it holds writes fails them, and nothing waits") {
    AsyncPair p(async::CompletionMode::busy);
    std::optional<async::QueuePair> owned(std::move(p.a));
    std::vector<Result<WorkCompletion>> held;
    std::optional<Result<WorkCompletion>> posted;
    int ok = 0;
    owned->write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) {
        ok += r ? 1 : 0;
        // the first posted at once (it ends with its flush), the next 3 held
        owned->write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> f) { posted = std::move(f); });
        for (int k = 0; k < 3; ++k)
            owned->write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8),
                         [&](Result<WorkCompletion> h) { held.push_back(std::move(h)); });
        owned.reset();
    });
    p.io.run();
    CHECK(ok == 1);
    CHECK(posted.has_value()); // done or flushed, whichever came first: completed before the QP went
    REQUIRE(held.size() == 3);
    for (const auto& h : held) {
        REQUIRE_FALSE(h.has_value());
        CHECK(h.error().is_cancelled());
    }
    CHECK(async::Completions::of(p.io).in_flight() == 0);
}

namespace {

// A responder that never answers: its QP is taken back to RESET, so the requester's
// packets are dropped and its WR stays in flight until its retries run out (here
// 7 x 4.096 us x 2^18 = 7.5 s, far beyond the test's cancellations).
constexpr QpConnectOptions slow_retries{.ack_timeout = 18, .retry_cnt = 7};

void stop_responder(AsyncPair& p) { must(p.b.get().reset()); }

// A READ whose destination is in this coroutine's frame, cancelled by a timer: the
// coroutine resumes only once the flush completion is in, so the frame it returns to
// (and the READ's destination in it) was never freed under the NIC.
asio::awaitable<void> cancelled_read(AsyncPair& p, std::optional<Result<WorkCompletion>>& out, std::size_t& posted_at_resume,
                                     std::chrono::steady_clock::duration& took) {
    alignas(64) std::array<std::byte, 4096> in_frame{};
    auto mr = must(MemoryRegion::register_memory(p.pd, in_frame, Access::local_write));
    asio::steady_timer timer(p.io, 50ms);
    const auto start = std::chrono::steady_clock::now();
    auto first = co_await (p.a.read(mr.all(), p.mem_b.remote().slice(0, 4096)) || timer.async_wait(asio::use_awaitable));
    took = std::chrono::steady_clock::now() - start;
    posted_at_resume = p.a.posted();
    if (first.index() == 0)
        out = std::move(std::get<0>(first));
}

} // namespace

TEST_CASE("cancelling a posted READ into coroutine-frame memory completes it only after its flush") {
    AsyncPair p(async::CompletionMode::event, {.max_send_wr = 16, .max_recv_wr = 16}, slow_retries);
    stop_responder(p);
    std::optional<Result<WorkCompletion>> out;
    std::size_t posted_at_resume = 99;
    std::chrono::steady_clock::duration took{};
    asio::co_spawn(p.io, cancelled_read(p, out, posted_at_resume, took), asio::detached);
    p.io.run();
    // the timer won: the read's own result is dropped by operator||, but its slot
    // was released only when its completion came
    CHECK(posted_at_resume == 0);
    CHECK_FALSE(out.has_value());
    CHECK(took < 5s);
    CHECK(p.a.dead());
    CHECK(p.a.dead()->is_cancelled());
    CHECK(async::Completions::of(p.io).in_flight() == 0);
    // a dead QP fails a new operation at once
    std::optional<Result<WorkCompletion>> late;
    p.io.restart();
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) { late = std::move(r); });
    p.io.run();
    REQUIRE(late.has_value());
    CHECK_FALSE(late->has_value());
}

namespace {

// A batch of four READs into this coroutine's frame, of which the device takes only
// the first two (its send queue is full behind them): the coroutine resumes only once
// the NIC is done with them, so the frame it returns to was never freed under it.
asio::awaitable<void> batch_refused_partway(AsyncPair& p, std::optional<Result<WorkCompletion>>& out,
                                            std::size_t& posted_at_resume, bool& dead_at_resume) {
    alignas(64) std::array<std::byte, 4 * 1024> in_frame{};
    auto mr = must(MemoryRegion::register_memory(p.pd, in_frame, Access::local_write));
    SendBatch<4> batch(p.a.get());
    for (std::size_t k = 0; k < 4; ++k)
        batch.read(mr.slice(k * 1024, 1024), p.mem_b.remote().slice(k * 1024, 1024));
    out = co_await p.a.post(batch, asio::use_awaitable);
    posted_at_resume = p.a.posted();
    dead_at_resume = p.a.dead().has_value() && p.a.get().state() == QpState::error;
}

} // namespace

namespace {

// An unsignaled 8-byte WRITE posted on `qp` behind its async::QueuePair's back, with a
// wr_id no operation has (its flush is stale); the post's return code.
int raw_write(AsyncPair& p, async::QueuePair& qp) {
    ibv_sge sge = p.mem_a.slice(0, 8).sge();
    ibv_send_wr wr = test::raw_write_wr(sge, p.mem_b.remote(), false);
    wr.wr_id = 0xffff'ffff;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp.get().get(), &wr, &bad);
}

constexpr QpCaps eight{.max_send_wr = 8, .max_recv_wr = 8};

// How many WRs a send queue of `eight` really takes (a provider may round its ring
// up past what it reports): raw WRITEs on a throw-away pair's stopped QP until one is
// refused.
std::uint32_t send_ring_room() {
    AsyncPair probe(async::CompletionMode::event, eight, slow_retries);
    stop_responder(probe);
    std::uint32_t taken = 0;
    while (taken < 4096 && raw_write(probe, probe.a) == 0)
        ++taken;
    return taken;
}

} // namespace

TEST_CASE("a batch the device refuses after its first WRs completes only once they are flushed, the QP dead") {
    const std::uint32_t room = send_ring_room();
    REQUIRE(room >= 8);
    AsyncPair p(async::CompletionMode::event, eight, slow_retries);
    stop_responder(p); // what the device takes stays in flight
    for (std::uint32_t i = 0; i + 2 < room; ++i) // all but two entries
        REQUIRE(raw_write(p, p.a) == 0);
    std::optional<Result<WorkCompletion>> out;
    std::size_t posted_at_resume = 99;
    bool dead_at_resume = false;
    asio::co_spawn(p.io, batch_refused_partway(p, out, posted_at_resume, dead_at_resume), asio::detached);
    const auto start = std::chrono::steady_clock::now();
    p.io.run_for(30s);
    REQUIRE(out.has_value());
    REQUIRE_FALSE(out->has_value());
    INFO(out->error().message());
    CHECK(out->error().is_errno(ENOMEM)); // the post's refusal, not the flush's status
    CHECK(out->error().message().find("WR 2 of 4") != std::string::npos);
    CHECK(dead_at_resume);        // the two READs taken were flushed before it resumed
    CHECK(posted_at_resume == 0);
    CHECK(std::chrono::steady_clock::now() - start < 5s); // not the READs' retries
    CHECK(async::Completions::of(p.io).in_flight() == 0);
}

namespace {

// A provider that fails the next `silent_failures` posts without naming the WR it
// refused (bad_wr left null), having taken them if `silent_takes`; the real entry
// points' otherwise.
decltype(ibv_context_ops::post_send) real_post_send = nullptr;
decltype(ibv_context_ops::post_recv) real_post_recv = nullptr;
int silent_failures = 0;
bool silent_takes = false;

template <class Wr, auto& real>
int post_silently_failing(ibv_qp* qp, Wr* wr, Wr** bad) {
    if (silent_failures == 0)
        return real(qp, wr, bad);
    --silent_failures;
    if (silent_takes)
        (void)real(qp, wr, bad);
    *bad = nullptr;
    return ENOMEM;
}

// What an operation's handler saw: its result, and its QP's state then.
struct PostOutcome {
    std::optional<Result<WorkCompletion>> result;
    QpState qp_state = QpState::unknown;
};

void check_refused_unnamed(const PostOutcome& ended) {
    REQUIRE(ended.result.has_value());
    REQUIRE_FALSE(ended.result->has_value());
    INFO(ended.result->error().message());
    CHECK(ended.result->error().is_errno(ENOMEM)); // the post's refusal, not the flush's status
    CHECK(ended.result->error().message().find("did not say which failed") != std::string::npos);
    CHECK(ended.qp_state == QpState::error); // completed by its flush, the NIC done with it
}

} // namespace

TEST_CASE("a write or a receive whose provider fails its post without naming the WR, having taken it, completes "
          "only once flushed, the QP dead") {
    for (const bool receive : {false, true}) {
        CAPTURE(receive);
        AsyncPair p(async::CompletionMode::event, {.max_send_wr = 16, .max_recv_wr = 16}, slow_retries);
        stop_responder(p); // the write stays in flight (retried slowly), the receive waits
        ibv_context_ops& ops = p.context.get()->ops;
        real_post_send = ops.post_send;
        real_post_recv = ops.post_recv;
        const test::ReplacedOp send_op(ops.post_send, post_silently_failing<ibv_send_wr, real_post_send>);
        const test::ReplacedOp recv_op(ops.post_recv, post_silently_failing<ibv_recv_wr, real_post_recv>);
        silent_failures = 1;
        silent_takes = true;
        PostOutcome ended;
        auto end = [&](Result<WorkCompletion> r) {
            ended.result = std::move(r);
            ended.qp_state = p.a.get().state();
        };
        async::Completions& service = async::Completions::of(p.io);
        const std::uint64_t stale = service.stale_completions();
        const auto start = std::chrono::steady_clock::now();
        if (receive)
            p.a.receive(p.mem_a.slice(0, 64), end);
        else
            p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), end);
        p.io.run_for(30s);
        // it failed at once, while the write or the receive was still the NIC's
        check_refused_unnamed(ended);
        CHECK(p.a.dead().has_value());
        CHECK(std::chrono::steady_clock::now() - start < 5s); // the flush, not the write's retries
        CHECK(service.in_flight() == 0);
        // its own WR's flush completed it, and the marker's came after it, stale (an
        // operation failed at once leaves no marker, and its WR's flush is not taken here)
        CHECK(service.stale_completions() - stale == 1);
    }
}

// Soft-RoCE refuses every post once the process's credentials changed (EACCES), having
// taken the WR into its queue; the flush marker's post is refused too (logged).
TEST_CASE("an async write refused for good (EACCES: credentials changed) completes with that Error once flushed, "
          "the QP dead") {
    AsyncPair p(async::CompletionMode::event, {.max_send_wr = 16, .max_recv_wr = 16});
    std::optional<Result<WorkCompletion>> warm;
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) { warm = std::move(r); });
    CHECK(test::run_until(p.io, [&] { return warm.has_value(); }, 10s));
    const test::CapturedLog log; // the marker's refused post
    const test::WithoutIpcLock capset; // the process's credentials are new from here
    PostOutcome ended;
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) {
        ended.result = std::move(r);
        ended.qp_state = p.a.get().state();
    });
    CHECK(test::run_until(p.io, [&] { return ended.result.has_value(); }, 10s));
    REQUIRE(ended.result.has_value());
    REQUIRE_FALSE(ended.result->has_value());
    INFO(ended.result->error().message());
    CHECK(ended.result->error().is_errno(EACCES));
    CHECK(ended.result->error().message().find("credentials changed") != std::string::npos);
    CHECK(ended.qp_state == QpState::error);
    CHECK(p.a.dead().has_value());
    CHECK(async::Completions::of(p.io).in_flight() == 0);
    CHECK(log.count("the flush marker after a failed post") == 1);
}

TEST_CASE("held writes whose doorbell the provider refuses without naming a WR, having taken none, complete with "
          "the refusal once flushed") {
    AsyncPair p(async::CompletionMode::event, {.max_send_wr = 16, .max_recv_wr = 16});
    ibv_context_ops& ops = p.context.get()->ops;
    real_post_send = ops.post_send;
    const test::ReplacedOp send_op(ops.post_send, post_silently_failing<ibv_send_wr, real_post_send>);
    std::vector<PostOutcome> started(4);
    std::optional<Result<WorkCompletion>> first;
    // the writes a completion's handler starts: the first posted at once, the others
    // held for one doorbell
    p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), [&](Result<WorkCompletion> r) {
        first = std::move(r);
        for (PostOutcome& e : started)
            p.a.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(8, 8), [&](Result<WorkCompletion> r) {
                e.result = std::move(r);
                e.qp_state = p.a.get().state();
            });
        silent_failures = 1; // the held ones' doorbell
        silent_takes = false;
    });
    bool done = false;
    const auto start = std::chrono::steady_clock::now();
    while (!done && std::chrono::steady_clock::now() - start < 10s) {
        p.io.restart();
        p.io.run_for(10ms);
        done = std::ranges::all_of(started, [](const PostOutcome& e) { return e.result.has_value(); });
    }
    REQUIRE(first.has_value());
    CHECK(first->has_value());
    // the held ones were counted as posted, and nothing could complete them
    REQUIRE(done);
    // started[0], posted at once, completed as it ran: done, or flushed when the QP
    // stopped (on rxe the doorbell failed a few microseconds after its post)
    for (std::size_t k = 1; k < started.size(); ++k)
        check_refused_unnamed(started[k]);
    CHECK(async::Completions::of(p.io).in_flight() == 0);
}

TEST_CASE("async QueuePair: a batch of another QP, or on a QP that signals every WR, aborts naming the caller") {
    AsyncPair p(async::CompletionMode::event, eight);
    SendBatch<2> batch(p.b.get());
    batch.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8));
    RDMAXX_CHECK_DEATH((void)p.a.post(batch, [](Result<WorkCompletion>) {}), "posted on QP");
    auto raw = must(QueuePair::create(p.pd, {.send_cq = &p.cq_a.get(), .recv_cq = &p.cq_a.get(), .caps = eight,
                                             .signal_all = true}));
    async::QueuePair every = async::QueuePair::attach(std::move(raw), p.cq_a, p.cq_a);
    SendBatch<2> two(every.get());
    two.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8)).write(p.mem_a.slice(8, 8), p.mem_b.remote().slice(8, 8));
    RDMAXX_CHECK_DEATH((void)every.post(two, [](Result<WorkCompletion>) {}), "created with signal_all");
}

TEST_CASE("a write whose peer is stopped times out through op || timer with a cancelled Error") {
    AsyncPair p(async::CompletionMode::busy, {.max_send_wr = 16, .max_recv_wr = 16}, slow_retries);
    stop_responder(p);
    std::optional<Result<WorkCompletion>> out;
    asio::cancellation_signal signal;
    p.a.write(p.mem_a.slice(0, 64), p.mem_b.remote().slice(0, 64),
              asio::bind_cancellation_slot(signal.slot(), [&](Result<WorkCompletion> r) { out = std::move(r); }));
    asio::steady_timer timer(p.io, 100ms);
    timer.async_wait([&](std::error_code) { signal.emit(asio::cancellation_type::terminal); });
    const auto start = std::chrono::steady_clock::now();
    p.io.run();
    REQUIRE(out.has_value());
    REQUIRE_FALSE(out->has_value());
    CHECK(out->error().is_cancelled());
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    CHECK(p.a.posted() == 0);
}

namespace {

// Owns its CQ and QP, starts 100 writes towards a stopped peer, then waits forever:
// destroying the io_context destroys this frame with the writes in flight.
struct Owned {
    async::CompletionQueue cq;
    async::QueuePair qp;
};

// Or, with `await_last`, it awaits its 100th write itself: then the io_context's
// service destroys the frame (and the QP and CQ in it) while it takes the flushes.
asio::awaitable<void> hundred_in_flight(std::unique_ptr<Owned> owned, RemoteMemory target, const MemoryRegion& mem,
                                        bool await_last, int& started, int& handlers_run) {
    for (int i = 0; i < 99; ++i)
        owned->qp.write(mem.slice(static_cast<std::size_t>(i) * 64, 64), target.slice(static_cast<std::size_t>(i) * 64, 64),
                        [&handlers_run](Result<WorkCompletion>) { ++handlers_run; });
    if (await_last) {
        auto last = owned->qp.write(mem.slice(99 * 64, 64), target.slice(99 * 64, 64));
        started = static_cast<int>(owned->qp.posted()) + 1; // the last is posted when awaited
        (void)co_await std::move(last);
        ++handlers_run;
        co_return;
    }
    owned->qp.write(mem.slice(99 * 64, 64), target.slice(99 * 64, 64),
                    [&handlers_run](Result<WorkCompletion>) { ++handlers_run; });
    started = static_cast<int>(owned->qp.posted());
    asio::steady_timer forever(co_await asio::this_coro::executor, 1h);
    co_await forever.async_wait(asio::use_awaitable);
}

} // namespace

TEST_CASE("destroying the io_context with 100 operations in flight quiesces, calls no handler, and does not hang") {
    for (const auto& [mode, await_last] : {std::pair{async::CompletionMode::event, false},
                                          std::pair{async::CompletionMode::busy, false},
                                          std::pair{async::CompletionMode::event, true},
                                          std::pair{async::CompletionMode::busy, true}}) {
        CAPTURE(name(mode));
        CAPTURE(await_last);
        Context context = must(Context::open());
        ProtectionDomain pd = must(ProtectionDomain::create(context));
        MemoryRegion mem = must(MemoryRegion::allocate(pd, 1 << 16, access_all));
        CompletionQueue peer_cq = must(CompletionQueue::create(context, {.depth = 256}));
        QueuePair peer = must(QueuePair::create(pd, {.send_cq = &peer_cq, .recv_cq = &peer_cq,
                                                     .caps = {.max_send_wr = 128, .max_recv_wr = 128}}));
        int started = 0, handlers_run = 0;
        auto io = std::make_unique<asio::io_context>();
        {
            auto cq = must(async::CompletionQueue::create(*io, context, {.depth = 512}, {.mode = mode}));
            auto raw = must(QueuePair::create(pd, {.send_cq = &cq.get(), .recv_cq = &cq.get(),
                                                   .caps = {.max_send_wr = 128, .max_recv_wr = 128}}));
            must(raw.connect(peer.endpoint(), slow_retries));
            must(peer.connect(raw.endpoint(), slow_retries));
            must(peer.reset()); // stopped: the writes stay in flight
            auto qp = async::QueuePair::attach(std::move(raw), cq, cq);
            auto owned = std::make_unique<Owned>(Owned{std::move(cq), std::move(qp)});
            asio::co_spawn(*io, hundred_in_flight(std::move(owned), mem.remote(), mem, await_last, started, handlers_run),
                           asio::detached);
        }
        io->run_for(200ms);
        CHECK(started == 100);
        const auto start = std::chrono::steady_clock::now();
        io.reset();
        CHECK(std::chrono::steady_clock::now() - start < 10s);
        CHECK(handlers_run == 0);
    }
}

TEST_CASE("one thread, 256 QPs, 10,240 writes in flight at once: every byte lands") {
    constexpr std::size_t qps = 256, per_qp = 40, bytes = 64, cqs = 8;
    asio::io_context io;
    Context context = must(Context::open());
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    MemoryRegion source = must(MemoryRegion::allocate(pd, qps * per_qp * bytes, access_all));
    MemoryRegion target = must(MemoryRegion::allocate(pd, qps * per_qp * bytes, access_all));
    test::fill(source.bytes(), 3);
    std::vector<async::CompletionQueue> cq;
    for (std::size_t c = 0; c < cqs; ++c)
        cq.push_back(must(async::CompletionQueue::create(io, context, {.depth = 2200}, {.mode = async::CompletionMode::busy})));
    std::vector<async::QueuePair> qp;
    for (std::size_t i = 0; i < qps; ++i) {
        async::CompletionQueue& c = cq[i % cqs];
        qp.push_back(async::QueuePair::attach(
            must(QueuePair::create(pd, {.send_cq = &c.get(), .recv_cq = &c.get(), .caps = {.max_send_wr = 64, .max_recv_wr = 1}})),
            c, c));
    }
    for (std::size_t i = 0; i < qps; i += 2) {
        must(qp[i].get().connect(qp[i + 1].get().endpoint()));
        must(qp[i + 1].get().connect(qp[i].get().endpoint()));
    }
    std::size_t ok = 0, failed = 0;
    for (std::size_t i = 0; i < qps; ++i)
        for (std::size_t k = 0; k < per_qp; ++k) {
            const std::size_t at = (i * per_qp + k) * bytes;
            qp[i].write(source.slice(at, bytes), target.remote().slice(at, bytes),
                        [&](Result<WorkCompletion> r) { (r ? ok : failed) += 1; });
        }
    CHECK(async::Completions::of(io).in_flight() == qps * per_qp);
    io.run();
    CHECK(ok == qps * per_qp);
    CHECK(failed == 0);
    CHECK(std::memcmp(source.data(), target.data(), source.size()) == 0);
}

namespace {

asio::awaitable<void> counted_writes(AsyncPair& p, long& counted, int& failures, bool& done) {
    for (int i = 0; i < 10'100; ++i) {
        if (i == 100) { // warm: the slab, Asio's recycled blocks, the frames
            allocations = 0;
            counting = true;
        }
        auto w = co_await p.a.write(p.mem_a.slice(0, 64), p.mem_b.remote().slice(0, 64));
        failures += w ? 0 : 1;
    }
    counting = false;
    counted = allocations;
    done = true;
}

} // namespace

TEST_CASE("10,000 awaited writes allocate nothing once warm, in busy and event modes") {
    for (const auto mode : {async::CompletionMode::busy, async::CompletionMode::event}) {
        CAPTURE(name(mode));
        AsyncPair p(mode);
        long counted = -1;
        int failures = 0;
        bool done = false;
        asio::co_spawn(p.io, counted_writes(p, counted, failures, done), asio::detached);
        p.run_until(done, 120s);
        CHECK(failures == 0);
        CHECK(counted == 0);
    }
}

// --- device async events on a bare async::QueuePair ------------------------------

namespace {

// Two pairs of RC QPs on one CQ of one context: a-b connected and alive; c-d with d
// taken back to RESET, so that c's writes stay in flight for its retries (7.5 s).
struct EventRig {
    asio::io_context io;
    Context context = must(Context::open());
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    async::CompletionQueue cq;
    MemoryRegion mem = must(MemoryRegion::allocate(pd, 1 << 16, access_all));
    async::QueuePair a, b, c, d;

    explicit EventRig(async::CompletionMode mode)
        : cq(must(async::CompletionQueue::create(io, context, {.depth = 256}, {.mode = mode}))), a(attach()),
          b(attach()), c(attach()), d(attach()) {
        must(a.get().connect(b.get().endpoint()));
        must(b.get().connect(a.get().endpoint()));
        must(c.get().connect(d.get().endpoint(), slow_retries));
        must(d.get().connect(c.get().endpoint(), slow_retries));
        must(d.get().reset());
    }
    async::QueuePair attach() {
        auto qp = must(QueuePair::create(pd, {.send_cq = &cq.get(), .recv_cq = &cq.get(),
                                              .caps = {.max_send_wr = 4, .max_recv_wr = 4}}));
        return async::QueuePair::attach(std::move(qp), cq, cq);
    }
    // One turn of the io_context (and, manual, of the application's loop).
    void turn() {
        if (cq.mode() == async::CompletionMode::manual) {
            async::Completions::of(io).take_device_events();
            async::Completions::of(io).poll();
        }
        io.restart();
        io.run_for(10ms);
    }
};

struct Ended {
    std::optional<Result<WorkCompletion>> result;
    std::chrono::steady_clock::duration took{};
};

// Records into `ended` how the operation ended and how long after `start`.
auto record(Ended& ended, const std::chrono::steady_clock::time_point& start) {
    return [&ended, &start](Result<WorkCompletion> r) {
        ended.result = std::move(r);
        ended.took = std::chrono::steady_clock::now() - start;
    };
}

bool ended_by_port_down(const Ended& ended) {
    if (!ended.result || ended.result->has_value())
        return false;
    const Error& e = ended.result->error();
    return e.code() == ENETDOWN && e.message().find("PORT_ERR") != std::string::npos;
}

} // namespace

TEST_CASE("async QueuePair: a port going down ends its pending receive, posted writes and a write waiting for "
          "entries with ENETDOWN") {
    for (const auto mode : {async::CompletionMode::event, async::CompletionMode::busy, async::CompletionMode::manual}) {
        CAPTURE(name(mode));
        EventRig r(mode);
        auto start = std::chrono::steady_clock::now(); // reset when the port goes down
        Ended receive;
        r.b.receive(r.mem.slice(0, 64), record(receive, start)); // nothing will ever be sent to b
        const std::size_t depth = r.c.get().caps().max_send_wr;  // the device may round 4 up
        std::vector<Ended> writes(depth + 1);
        for (std::size_t i = 0; i <= depth; ++i)
            r.c.write(r.mem.slice(1024 + i * 8, 8), r.mem.remote().slice(4096 + i * 8, 8), record(writes[i], start));
        REQUIRE(r.b.posted() == 1);
        REQUIRE(r.c.posted() == depth); // the last write waits for an entry
        // the drivers and the device watch start: nothing has ended (one bounded turn:
        // poll() would never return in busy mode, whose driver re-posts itself while
        // operations are in flight, and b's receive never completes on its own)
        r.turn();
        REQUIRE_FALSE(receive.result);
        REQUIRE_FALSE(writes[depth].result);

        test::LinkDown link(r.a.get().gid());
        start = std::chrono::steady_clock::now();
        const auto all_ended = [&] {
            return receive.result && std::all_of(writes.begin(), writes.end(), [](const Ended& e) { return e.result; });
        };
        while (!all_ended() && std::chrono::steady_clock::now() - start < 20s)
            r.turn();
        link.up();

        REQUIRE(all_ended());
        CAPTURE(receive.result->has_value() ? std::string("a completion") : fmt::format("{}", receive.result->error()));
        CHECK(ended_by_port_down(receive));
        CHECK(receive.took < 5s); // a receive has no timeout of its own; c's retries would take 7.5 s
        for (std::size_t i = 0; i <= depth; ++i) {
            CAPTURE(i);
            CHECK(ended_by_port_down(writes[i])); // the event's Error, not the flush status
            CHECK(writes[i].took < 5s);
        }
        // every posted WR came back through its completion; the QPs stay dead
        CHECK(r.b.posted() == 0);
        CHECK(r.c.posted() == 0);
        REQUIRE(r.b.dead());
        CHECK(r.b.dead()->code() == ENETDOWN);
        Ended later;
        r.b.receive(r.mem.slice(0, 64), record(later, start));
        while (!later.result && std::chrono::steady_clock::now() - start < 30s)
            r.turn();
        CHECK(ended_by_port_down(later));
        CHECK(async::Completions::of(r.io).in_flight() == 0);
    }
}

// --- setup over TCP through Asio (rdmaxx/async/tcp.hpp) ---------------------------

namespace {

struct TcpSides {
    asio::io_context io;
    Context context = must(Context::open());
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    async::CompletionQueue cq = must(async::CompletionQueue::create(io, context, {.depth = 512}, {.mode = async::CompletionMode::event}));
    MemoryRegion mem = must(MemoryRegion::allocate(pd, 1 << 16, access_all));
    async::QueuePair make() {
        return async::QueuePair::attach(
            must(QueuePair::create(pd, {.send_cq = &cq.get(), .recv_cq = &cq.get(), .caps = {.max_send_wr = 16, .max_recv_wr = 16}})),
            cq, cq);
    }
};

// The server's side: the next client, a receive posted, ready confirmed, one SEND
// taken. Records the accept's result (an Error for a bad client) in `outcome`.
asio::awaitable<void> serve_one(asio::ip::tcp::acceptor& acceptor, async::QueuePair& qp, const MemoryRegion& mem,
                                std::optional<Error>& outcome, std::string& received) {
    async::QueuePair* qps[] = {&qp};
    auto link = co_await async::accept(acceptor, qps, {.timeout = 500ms});
    if (!link) {
        outcome = link.error();
        co_return;
    }
    std::optional<Result<WorkCompletion>> message;
    qp.receive(mem.slice(0, 64), [&message](Result<WorkCompletion> r) { message = std::move(r); });
    if (auto ready = co_await async::confirm_ready(link->socket, 2s); !ready) {
        outcome = ready.error();
        co_return;
    }
    while (!message)
        co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
    if (*message && (*message)->byte_len() == 5)
        received.assign(reinterpret_cast<const char*>(mem.data()), 5);
}

asio::awaitable<void> client_sends(std::uint16_t port, async::QueuePair& qp, const MemoryRegion& mem, bool& sent) {
    async::QueuePair* qps[] = {&qp};
    auto link = co_await async::connect(co_await asio::this_coro::executor, "127.0.0.1", port, qps, {.timeout = 2s});
    if (!link || !co_await async::confirm_ready(link->socket, 2s))
        co_return;
    std::memcpy(mem.data() + 1024, "hello", 5);
    sent = (co_await qp.send(mem.slice(1024, 5))).has_value();
}

// A peer that connects and then stays silent, or sends `junk`.
asio::awaitable<void> bad_client(std::uint16_t port, std::string junk, std::chrono::milliseconds stay) {
    asio::ip::tcp::socket socket(co_await asio::this_coro::executor);
    auto [ec] = co_await socket.async_connect({asio::ip::address_v4::loopback(), port},
                                              asio::experimental::as_tuple(asio::use_awaitable));
    if (ec)
        co_return;
    if (!junk.empty())
        co_await asio::async_write(socket, asio::buffer(junk), asio::experimental::as_tuple(asio::use_awaitable));
    asio::steady_timer hold(socket.get_executor(), stay);
    co_await hold.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
}

} // namespace

TEST_CASE("async TCP setup: two coroutines on one thread connect QPs, confirm readiness and exchange a SEND") {
    TcpSides s;
    auto server_qp = s.make(), client_qp = s.make();
    asio::ip::tcp::acceptor acceptor(s.io, {asio::ip::address_v4::loopback(), 0});
    std::optional<Error> outcome;
    std::string received;
    bool sent = false;
    asio::co_spawn(s.io, serve_one(acceptor, server_qp, s.mem, outcome, received), asio::detached);
    asio::co_spawn(s.io, client_sends(acceptor.local_endpoint().port(), client_qp, s.mem, sent), asio::detached);
    s.io.run();
    CHECK_FALSE(outcome.has_value());
    CHECK(sent);
    CHECK(received == "hello");
}

TEST_CASE("async TCP setup: a silent client and a garbage one get an Error each, and the next client is served") {
    TcpSides s;
    asio::ip::tcp::acceptor acceptor(s.io, {asio::ip::address_v4::loopback(), 0});
    const std::uint16_t port = acceptor.local_endpoint().port();
    struct Case {
        std::string junk;
        Error::Kind kind;
    };
    for (const Case& c : {Case{"", Error::Kind::timeout}, Case{std::string(12, 'x'), Error::Kind::protocol}}) {
        auto qp = s.make();
        std::optional<Error> outcome;
        std::string received;
        asio::co_spawn(s.io, serve_one(acceptor, qp, s.mem, outcome, received), asio::detached);
        asio::co_spawn(s.io, bad_client(port, c.junk, 2s), asio::detached);
        const auto start = std::chrono::steady_clock::now();
        while (!outcome && std::chrono::steady_clock::now() - start < 10s)
            s.io.run_one_for(100ms);
        REQUIRE(outcome.has_value());
        CHECK(outcome->kind() == c.kind);
        s.io.stop(); // the bad client's hold ends with the io_context's next restart
        s.io.restart();
    }
    // the listener serves the next, well-behaved client
    auto server_qp = s.make(), client_qp = s.make();
    std::optional<Error> outcome;
    std::string received;
    bool sent = false;
    asio::co_spawn(s.io, serve_one(acceptor, server_qp, s.mem, outcome, received), asio::detached);
    asio::co_spawn(s.io, client_sends(port, client_qp, s.mem, sent), asio::detached);
    const auto start = std::chrono::steady_clock::now();
    while (received.empty() && std::chrono::steady_clock::now() - start < 10s)
        s.io.run_one_for(100ms);
    CHECK_FALSE(outcome.has_value());
    CHECK(received == "hello");
}
