// Batches, selective signaling, waits, error paths and asynchronous events.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include <net/if.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/events.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/data/signaling.hpp>

#include "../support/capabilities.hpp"
#include "../support/device.hpp"
#include "../support/thread.hpp"

using namespace rdmaxx;
using namespace std::chrono_literals;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

TEST_CASE("a 64-WR batch is posted with one doorbell, on both post APIs") {
    for (const PostApi api : {PostApi::classic, PostApi::extended}) {
        CAPTURE(static_cast<int>(api));
        test::RcPair p(api);
        test::fill(p.mem_a.bytes().subspan(0, 64 * 1024), 7);
        SendBatch<64> batch(p.a);
        for (std::uint64_t i = 0; i < 64; ++i)
            batch.write(p.mem_a.slice(i * 1024, 1024), p.mem_b.remote().slice(i * 2048, 1024), {.wr_id = i});
        CHECK(batch.size() == 64);
        RDMAXX_CHECK_DEATH(batch.write(p.mem_a.slice(0, 8), p.mem_b.remote()), "SendBatch<64> is full");
        must(batch.post());
        std::array<WorkCompletion, 64> wcs;
        must(wait_n(p.cq_a, wcs, 64));
        for (std::uint64_t i = 0; i < 64; ++i) {
            CHECK(wcs[i].wr_id() == i); // in order
            REQUIRE(std::memcmp(p.mem_b.data() + i * 2048, p.mem_a.data() + i * 1024, 1024) == 0);
        }
        // mixed operations; the batch is reusable
        batch.clear();
        must(post_recv(p.b, p.mem_b.slice(500000, 0), 98)); // taken by the WRITE_WITH_IMM
        must(post_recv(p.b, p.mem_b.slice(500000, 64), 99));
        batch.read(p.mem_a.slice(200000, 1024), p.mem_b.remote().slice(0, 1024), {.wr_id = 1})
            .write_with_imm(p.mem_a.slice(0, 16), p.mem_b.remote().slice(300000, 16), 77, {.wr_id = 2})
            .send(p.mem_a.slice(0, 64), {.wr_id = 3})
            .fetch_add(p.mem_a.slice(400000, 8), p.mem_b.remote().slice(600000, 8), 5, {.wr_id = 4})
            .compare_swap(p.mem_a.slice(400008, 8), p.mem_b.remote().slice(600000, 8), 5, 9, {.wr_id = 5});
        must(batch.post());
        must(wait_n(p.cq_a, wcs, 5));
        CHECK(std::memcmp(p.mem_a.data() + 200000, p.mem_b.data(), 1024) == 0);
        std::uint64_t after = 0, seen_by_cas = 0;
        std::memcpy(&after, p.mem_b.data() + 600000, 8);
        std::memcpy(&seen_by_cas, p.mem_a.data() + 400008, 8);
        CHECK(seen_by_cas == 5);
        CHECK(after == 9);
        must(wait_n(p.cq_b, wcs, 2));
        CHECK(wcs[0].wr_id() == 98);
        CHECK(wcs[0].opcode() == WcOpcode::recv_rdma_with_imm);
        CHECK(wcs[0].imm() == 77);
        CHECK(wcs[1].wr_id() == 99);
        CHECK(wcs[1].opcode() == WcOpcode::recv);
    }
}

TEST_CASE("a batch built once is posted again and again, changing only what varies, on both post APIs") {
    for (const PostApi api : {PostApi::classic, PostApi::extended}) {
        CAPTURE(static_cast<int>(api));
        test::RcPair p(api);
        const RemoteMemory remote = p.mem_b.remote();
        SendBatch<2> batch(p.a);
        batch.write_with_imm(p.mem_a.slice(0, 8), remote.slice(64, 8), 0)
            .fetch_add(p.mem_a.slice(128, 8), remote.slice(256, 8), 10, {.signaled = false});
        RecvBatch<1> receive(p.b);
        receive.add(p.mem_b.slice(512, 0), 0);
        std::array<WorkCompletion, 2> wcs;
        for (std::uint32_t round = 0; round < 5; ++round) {
            std::memcpy(p.mem_a.data(), &round, 4);
            must(receive.set_wr_id(0, 100 + round).post());
            batch.set_wr_id(0, round).set_imm(0, 7000 + round).set_atomic(1, round + 1);
            batch.set_signaled(1, round == 4); // the last round also signals the FAA
            must(batch.post());
            must(wait_n(p.cq_a, wcs, round == 4 ? 2 : 1));
            CHECK(wcs[0].wr_id() == round);
            const WorkCompletion got = must(wait_for(p.cq_b, 100 + round));
            CHECK(got.imm() == 7000 + round);
            std::uint32_t landed = 0;
            std::memcpy(&landed, p.mem_b.data() + 64, 4);
            CHECK(landed == round);
        }
        std::uint64_t total = 0;
        std::memcpy(&total, p.mem_b.data() + 256, 8);
        CHECK(total == 1 + 2 + 3 + 4 + 5); // each round's addend, set in place

        // a copy posts on its own storage, after the original is gone
        std::optional<SendBatch<2>> original(std::in_place, p.a);
        original->write(p.mem_a.slice(1024, 16), remote.slice(2048, 16), {.wr_id = 55});
        SendBatch<2> copy = *original;
        original.reset();
        test::fill(p.mem_a.bytes().subspan(1024, 16), 3);
        must(copy.post());
        CHECK(must(wait_for(p.cq_a, 55)).ok());
        CHECK(std::memcmp(p.mem_b.data() + 2048, p.mem_a.data() + 1024, 16) == 0);

        RDMAXX_CHECK_DEATH(batch.set_imm(1, 1), "carries no immediate");
        RDMAXX_CHECK_DEATH(batch.set_atomic(0, 1), "is not an atomic");
        RDMAXX_CHECK_DEATH(batch.set_wr_id(2, 1), "WR 2 of a batch of 2");
        RDMAXX_CHECK_DEATH(receive.set_wr_id(1, 1), "WR 1 of a batch of 1");
        RDMAXX_CHECK_DEATH(receive.add(p.mem_b.slice(0, 8), 1), "a RecvBatch<1> is full");
        RDMAXX_CHECK_DEATH((void)RecvBatch<1>(p.b).post(), "post of an empty batch");
    }
}

TEST_CASE("a batch may be built before its QP is connected, not posted") {
    test::RcPair p;
    QueuePair fresh = must(QueuePair::create(p.pd, {.send_cq = &p.cq_a, .recv_cq = &p.cq_a}));
    SendBatch<1> batch(fresh);
    batch.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8));
    RDMAXX_CHECK_DEATH((void)batch.post(), "connect it first");
    RecvBatch<1> receive(fresh);
    receive.add(p.mem_a.slice(0, 8), 1);
    RDMAXX_CHECK_DEATH((void)receive.post(), "in RESET");
}

TEST_CASE("a failed batch post says which WR failed and why") {
    // far more WRs than the send queue holds: the device takes what fits
    test::RcPair p(PostApi::classic, {.max_send_wr = 16, .max_recv_wr = 16});
    SendBatch<256> batch(p.a);
    for (std::uint32_t i = 0; i < 256; ++i)
        batch.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), {.wr_id = i});
    const Error e = must_fail(batch.post());
    CHECK(std::string_view(e.call()) == "ibv_post_send");
    CHECK(batch.accepted() >= p.a.caps().max_send_wr);
    CHECK(batch.accepted() < 256);
    CHECK(e.message().find(fmt::format("WR {} of 256 (wr_id {})", batch.accepted(), batch.accepted())) !=
          std::string::npos);
    std::vector<WorkCompletion> wcs(batch.accepted());
    must(wait_n(p.cq_a, wcs, wcs.size())); // the WRs before it were posted and complete
    CHECK(wcs.back().wr_id() == batch.accepted() - 1);
}

namespace {
// bad_wr left as it was
int fail_silently(ibv_qp*, ibv_send_wr*, ibv_send_wr**) { return EINVAL; }
int fail_receives_silently(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**) { return EINVAL; }
} // namespace

TEST_CASE("a failed post whose provider names no WR counts them all as posted, and says so (receives: says so)") {
    test::RcPair p(PostApi::classic);
    const test::ReplacedOp post(p.context.get()->ops.post_send, fail_silently);
    SendBatch<3> batch(p.a);
    for (std::uint32_t i = 0; i < 3; ++i)
        batch.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), {.wr_id = 7 + i});
    const Error e = must_fail(batch.post());
    CHECK(e.is_errno(EINVAL));
    // the safe side: a buffer of a WR the device may hold is not thought free
    CHECK(batch.accepted() == 3);
    // it read "WR 3 of 3 (wr_id 0) failed": a WR that does not exist
    CHECK(e.message().find("the provider did not say which failed") != std::string::npos);

    const test::ReplacedOp receive(p.context.get()->ops.post_recv, fail_receives_silently);
    RecvBatch<2> receives(p.b);
    receives.add(p.mem_b.slice(0, 8), 1);
    receives.add(p.mem_b.slice(8, 8), 2);
    CHECK(must_fail(receives.post()).message().find("the provider did not say which failed") != std::string::npos);
}

TEST_CASE("a post refused because the process's credentials changed since it opened the device says so (EACCES)") {
    // Soft-RoCE's posts are commands written to the device file, which the kernel takes
    // only from the credentials that opened it; on hardware the post never asks the
    // kernel and goes through
    for (const PostApi api : {PostApi::classic, PostApi::automatic}) {
        CAPTURE(api == PostApi::classic);
        test::RcPair p(api);
        SendBatch<1> batch(p.a);
        batch.write(p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), {.wr_id = 1});
        must(batch.post());
        CHECK(must(wait_for(p.cq_a, 1)).ok());
        const test::WithoutIpcLock capset; // the process's credentials are new from here
        const Error e = must_fail(batch.post());
        CHECK(e.is_errno(EACCES));
        CHECK(e.message().find("credentials changed since it opened the device") != std::string::npos);
    }
}

TEST_CASE("100,000 selectively signaled WRITEs never overflow the send queue") {
    test::RcPair p(PostApi::automatic, {.max_send_wr = 128, .max_recv_wr = 16});
    SignaledSendQueue sq(p.a, p.cq_a, 32);
    const std::uint64_t depth = p.a.caps().max_send_wr;
    std::uint64_t max_outstanding = 0;
    for (std::uint32_t i = 0; i < 100'000; ++i) {
        std::memcpy(p.mem_a.data() + (i % 64) * 8, &i, 4);
        const PostOptions options = must(sq.next({.wr_id = i}, i == 99'999));
        must(post_write(p.a, p.mem_a.slice((i % 64) * 8, 8), p.mem_b.remote().slice((i % 64) * 8, 8), options));
        max_outstanding = std::max(max_outstanding, sq.outstanding());
    }
    must(sq.drain());
    CHECK(sq.outstanding() == 0);
    CHECK(max_outstanding == depth); // the queue was used to its depth, never past it
    std::uint32_t last = 0;
    std::memcpy(&last, p.mem_b.data() + (99'999 % 64) * 8, 4);
    CHECK(last == 99'999);
    RDMAXX_CHECK_DEATH(SignaledSendQueue(p.a, p.cq_a, static_cast<std::uint32_t>(depth) + 1), "signal interval");
}

TEST_CASE("SignaledSendQueue: WRs whose post failed are given back, and a signal-all QP is refused") {
    test::RcPair p;
    SignaledSendQueue sq(p.a, p.cq_a, 4);
    for (std::uint64_t i = 0; i < 6; ++i) // 6 posted: the 4th signaled
        must(post_write(p.a, p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), must(sq.next({.wr_id = i}))));
    // three more counted (7 signaled by the interval, 8 forced), and their post
    // "failed": none reached the QP
    for (std::uint64_t i = 6; i < 9; ++i)
        (void)must(sq.next({.wr_id = i}, i == 8));
    CHECK(sq.outstanding() == 9);
    sq.unpost(3);
    CHECK(sq.outstanding() == 6);
    // the interval counts from WR 3 again: 6 unsignaled, 7 signaled
    CHECK_FALSE(must(sq.next({.wr_id = 6})).signaled);
    CHECK(must(sq.next({.wr_id = 7})).signaled);
    sq.unpost(2);
    must(post_write(p.a, p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), must(sq.next({.wr_id = 6}, true))));
    must(sq.drain(2s)); // waits for WRs 3 and 6 only: a phantom signaled WR would time out here
    CHECK(sq.outstanding() == 0);
    RDMAXX_CHECK_DEATH(sq.unpost(1), "unpost(1) with 0 WRs outstanding");

    QueuePair all = must(QueuePair::create(p.pd, {.send_cq = &p.cq_a, .recv_cq = &p.cq_a, .signal_all = true}));
    CHECK(all.signals_all());
    RDMAXX_CHECK_DEATH(SignaledSendQueue(all, p.cq_a, 4), "created with signal_all");
}

TEST_CASE("SignaledSendQueue: a failed completion is its Error for good, whatever flushes follow") {
    test::RcPair p;
    SignaledSendQueue sq(p.a, p.cq_a, 4);
    RemoteMemory bad = p.mem_b.remote();
    bad.rkey ^= 0x5a5a;
    // WR 0 (unsignaled) fails at the peer; 1 and 2 (unsignaled) and 3 (signaled) flush
    for (std::uint64_t i = 0; i < 4; ++i)
        must(post_write(p.a, p.mem_a.slice(0, 8), i == 0 ? bad : p.mem_b.remote().slice(0, 8),
                        must(sq.next({.wr_id = i}))));
    const Error failed = must_fail(sq.drain(5s));
    CHECK(failed.code() == IBV_WC_REM_ACCESS_ERR);
    // the flushes still in the CQ said nothing of which WRs left the queue: a drain
    // that then found "nothing signaled" succeeded, and next() went on posting
    CHECK(must_fail(sq.drain(5s)).code() == IBV_WC_REM_ACCESS_ERR);
    CHECK(must_fail(sq.next({.wr_id = 4})).code() == IBV_WC_REM_ACCESS_ERR);
}

TEST_CASE("SignaledSendQueue: a receive completion in its CQ, or a moved-from queue, aborts naming the caller") {
    test::RcPair p;
    SignaledSendQueue sq(p.a, p.cq_a, 4);
    must(post_recv(p.a, p.mem_a.slice(0, 64), 1));
    must(post_send(p.b, p.mem_b.slice(0, 8), {.wr_id = 2}));
    must(wait_for(p.cq_b, 2));
    // counted as signaled, not posted: the one completion drain() finds is the receive,
    // which it took for the SEND's retirement and lost
    (void)must(sq.next({}, true));
    RDMAXX_CHECK_DEATH((void)sq.drain(5s), "a receive completion of QP");
    SignaledSendQueue taken = std::move(sq);
    // a move empties its ring: next() wrote past it
    RDMAXX_CHECK_DEATH((void)sq.next(), "a moved-from SignaledSendQueue");
    RDMAXX_CHECK_DEATH(sq.unpost(0), "a moved-from SignaledSendQueue");
    CHECK(taken.outstanding() == 1);
}

TEST_CASE("a wrong rkey surfaces as a remote access Error, the QP reports ERR and later WRs flush") {
    test::RcPair p;
    RemoteMemory bad = p.mem_b.remote();
    bad.rkey ^= 0x5a5a;
    must(post_write(p.a, p.mem_a.slice(0, 64), bad, {.wr_id = 1}));
    const Error e = must_fail(wait_for(p.cq_a, 1));
    CHECK(e.kind() == Error::Kind::completion);
    CHECK(e.code() == IBV_WC_REM_ACCESS_ERR);
    CHECK(e.message().find("remote access error") != std::string::npos);
    CHECK(must(p.a.query_state()) == QpState::error);
    must(post_write(p.a, p.mem_a.slice(0, 64), p.mem_b.remote(), {.wr_id = 2}));
    const Error flushed = must_fail(wait_for(p.cq_a, 2));
    CHECK(flushed.code() == IBV_WC_WR_FLUSH_ERR);
}

TEST_CASE("SEND without a posted receive and a small rnr_retry fails, without hanging") {
    test::RcPair p(PostApi::automatic, {}, {.rnr_retry = 1, .min_rnr_timer = 1});
    must(post_send(p.a, p.mem_a.slice(0, 8), {.wr_id = 5}));
    const auto start = std::chrono::steady_clock::now();
    const Error e = must_fail(wait_for(p.cq_a, 5, {.timeout = 10s}));
    CHECK(e.code() == IBV_WC_RNR_RETRY_EXC_ERR);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("waits are bounded: busy polling and the completion channel") {
    test::RcPair p;
    for (const WaitMode mode : {WaitMode::busy_poll, WaitMode::event}) {
        const auto start = std::chrono::steady_clock::now();
        CHECK(must_fail(wait_for(p.cq_b, 1234, {.timeout = 100ms, .mode = mode})).is_timeout());
        CHECK(std::chrono::steady_clock::now() - start >= 100ms);
    }
    // event mode: a completion that arrives while the waiter sleeps wakes it
    for (std::uint64_t i = 0; i < 50; ++i) {
        must(post_recv(p.b, p.mem_b.slice(0, 64), 1000 + i));
        must(post_send(p.a, p.mem_a.slice(0, 64), {.wr_id = i}));
        CHECK(must(wait_for(p.cq_b, 1000 + i, {.mode = WaitMode::event})).opcode() == WcOpcode::recv);
        must(wait_for(p.cq_a, i, {.mode = WaitMode::event}));
    }
}

TEST_CASE("a wait of milliseconds::max() has no limit: it waits for the completion, in both modes") {
    test::RcPair p;
    for (const WaitMode mode : {WaitMode::busy_poll, WaitMode::event}) {
        must(post_recv(p.b, p.mem_b.slice(0, 64), 77));
        // the SEND comes 50 ms later (now + milliseconds::max() overflowed into a
        // deadline already past: the wait timed out at once)
        test::Thread sender([&] {
            std::this_thread::sleep_for(50ms);
            must(post_send(p.a, p.mem_a.slice(0, 64), {.wr_id = 78}));
        });
        const auto got = wait_for(p.cq_b, 77, {.timeout = std::chrono::milliseconds::max(), .mode = mode});
        CHECK_MESSAGE(got.has_value(), (got ? "" : got.error().message()));
        sender.join();
        must(wait_for(p.cq_a, 78));
    }
}

TEST_CASE("wait_for hands other WRs' completions to `other`, and without one never drops them silently") {
    test::RcPair p;
    for (std::uint64_t id : {1, 2, 3})
        must(post_write(p.a, p.mem_a.slice(0, 8), p.mem_b.remote().slice(0, 8), {.wr_id = id}));
    std::vector<std::uint64_t> others;
    CHECK(must(wait_for(p.cq_a, 2, {}, [&](const WorkCompletion& wc) { others.push_back(wc.wr_id()); })).wr_id() == 2);
    CHECK(others == std::vector<std::uint64_t>{1});
    // WR 3's completion is still in the CQ, and waiting for 4 would lose it (the
    // child's poll takes it from the CQ the parent shares: nothing to wait for after)
    RDMAXX_CHECK_DEATH((void)wait_for(p.cq_a, 4, {.timeout = 5s}), "took the completion of wr_id 3");
}

TEST_CASE("a port that goes down ends waits with an Error; its events are typed") {
    test::RcPair p;
    AsyncEvents events = must(AsyncEvents::open(p.context));
    CHECK_FALSE(must(events.next())); // nothing pending
    test::LinkDown link(p.a.gid());
    const auto start = std::chrono::steady_clock::now();
    const Error e = must_fail(wait_for(p.cq_b, 1, {.timeout = 20s, .events = &events, .qp = &p.b}));
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    CHECK(e.message().find("PORT_ERR") != std::string::npos);
    const AsyncEvent event = must(events.wait(5s));
    CHECK(event.type == AsyncEventType::port_error);
    CHECK(event.port == 1);
    link.up(); // and the RoCE GID back with the address, before other tests run
    AsyncEvent back = must(events.wait(10s));
    while (back.type != AsyncEventType::port_active) // GID changes may come first
        back = must(events.wait(10s));
    CHECK(back.port == 1);
    must(events.check(&p.b, &p.cq_b)); // the port is up again
}

TEST_CASE("a solicited SEND wakes a receiver armed for solicited events only") {
    test::RcPair p;
    must(post_recv(p.b, p.mem_b.slice(0, 64), 1));
    must(post_recv(p.b, p.mem_b.slice(64, 64), 2));
    must(p.cq_b.arm(true));
    must(post_send(p.a, p.mem_a.slice(0, 8), {.wr_id = 1}));
    must(wait_for(p.cq_a, 1));
    CHECK(must_fail(p.cq_b.wait_event(200ms)).is_timeout()); // unsolicited: no event
    must(post_send(p.a, p.mem_a.slice(0, 8), {.wr_id = 2, .solicited = true}));
    must(p.cq_b.wait_event(5s));
    std::array<WorkCompletion, 2> wcs;
    must(wait_n(p.cq_b, wcs, 2));
    CHECK(wcs[1].wr_id() == 2);
}

TEST_CASE("an overflowing CQ raises a CQ error event that ends waits on that CQ, and on no other") {
    test::Rig rig;
    AsyncEvents events = must(AsyncEvents::open(rig.context));
    CompletionQueue tiny = must(CompletionQueue::create(rig.context, {.depth = 1}));
    QueuePair a = must(QueuePair::create(rig.pd, {.send_cq = &tiny, .recv_cq = &rig.cq}));
    QueuePair b = rig.make_qp(QpType::rc);
    must(a.connect(b.endpoint()));
    must(b.connect(a.endpoint()));
    MemoryRegion mr = must(MemoryRegion::allocate(rig.pd, 64, access_all));
    // more signaled completions than the CQ holds, none polled
    for (std::uint64_t i = 0; i < tiny.depth() + 8; ++i)
        must(post_write(a, mr.slice(0, 8), mr.remote().slice(8, 8), {.wr_id = i}));
    const AsyncEvent event = must(events.wait(5s));
    INFO("event: ", to_string(event.type));
    CHECK(event.type == AsyncEventType::cq_error);
    CHECK(event.cq == tiny.get());
    CHECK(event.kills(a.qpn()));
    // a wait on that CQ that watches the events fails at once, however long its timeout
    const auto drop = [](const WorkCompletion&) {};
    const auto start = std::chrono::steady_clock::now();
    const Error e = must_fail(wait_for(tiny, 12345, {.timeout = 20s, .events = &events}, drop));
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    CHECK(e.message().find("CQ_ERR") != std::string::npos);
    // a wait on another CQ runs its course: a SEND between two QPs on rig.cq
    QueuePair c = rig.make_qp(QpType::rc);
    QueuePair d = rig.make_qp(QpType::rc);
    must(c.connect(d.endpoint()));
    must(d.connect(c.endpoint()));
    must(post_recv(d, mr.slice(32, 8), 77));
    must(post_send(c, mr.slice(40, 8), {.wr_id = 78}));
    CHECK(must(wait_for(rig.cq, 77, {.timeout = 5s, .events = &events, .qp = &d}, drop)).opcode() == WcOpcode::recv);
    // and a CQ made after the event (perhaps at the dead one's address) is not touched by it
    a = must(QueuePair::create(rig.pd, {.send_cq = &rig.cq, .recv_cq = &rig.cq}));
    tiny = must(CompletionQueue::create(rig.context, {.depth = 1}));
    CHECK(must_fail(wait_for(tiny, 1, {.timeout = 100ms, .events = &events})).is_timeout());
    must(events.check(nullptr, &tiny));
}
