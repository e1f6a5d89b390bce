#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include <pthread.h>

#include <doctest/doctest.h>

#include "../support/device.hpp"
#include "../support/thread.hpp"
#include "../support/watchdog.hpp"

using namespace rdmaxx;
using namespace std::chrono_literals;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

// Polls `cq` until one completion arrives (at most ~5 s) and checks its status.
ibv_wc poll_one(const CompletionQueue& cq) {
    ibv_wc wc{};
    for (int spins = 0; spins < 5'000'000; ++spins) {
        const int n = ibv_poll_cq(cq.get(), 1, &wc);
        REQUIRE(n >= 0);
        if (n == 1) {
            INFO("wc status: ", ibv_wc_status_str(wc.status));
            REQUIRE(wc.status == IBV_WC_SUCCESS);
            return wc;
        }
    }
    FAIL("no completion within the spin budget");
    return wc;
}

// Raw one-WR posts: these tests prove the wrap layer's connections carry data; the
// data layer has its own suite.
ibv_send_wr signaled(ibv_sge& sge, ibv_wr_opcode opcode) {
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    return wr;
}

void post(QueuePair& qp, ibv_send_wr wr) {
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(qp.get(), &wr, &bad) == 0);
}

void post(QueuePair& qp, ibv_wr_opcode opcode, const LocalSlice& local, const RemoteMemory& remote) {
    ibv_sge sge = local.sge();
    ibv_send_wr wr = signaled(sge, opcode);
    wr.wr.rdma.remote_addr = remote.addr;
    wr.wr.rdma.rkey = remote.rkey;
    post(qp, wr);
}

} // namespace

TEST_CASE("two RC QPs connect to RTS and carry RDMA WRITE and READ") {
    test::Rig rig;
    QueuePair a = rig.make_qp(QpType::rc);
    QueuePair b = rig.make_qp(QpType::rc);
    CHECK(a.state() == QpState::reset);
    CHECK(a.endpoint().psn <= 0xffffff);
    CHECK(a.endpoint().qpn == a.get()->qp_num);
    must(a.connect(b.endpoint()));
    must(b.connect(a.endpoint()));
    CHECK(must(a.query_state()) == QpState::rts);
    CHECK(must(b.query_state()) == QpState::rts);

    MemoryRegion src = must(MemoryRegion::allocate(rig.pd, 4096, access_all));
    MemoryRegion dst = must(MemoryRegion::allocate(rig.pd, 4096, access_all));
    for (std::size_t i = 0; i < src.size(); ++i)
        src.data()[i] = static_cast<std::byte>(i * 7 + 1);
    post(a, IBV_WR_RDMA_WRITE, src.slice(0, 1000), dst.remote().slice(24, 1000));
    CHECK(poll_one(rig.cq).opcode == IBV_WC_RDMA_WRITE);
    CHECK(std::memcmp(dst.data() + 24, src.data(), 1000) == 0);
    CHECK(dst.data()[23] == std::byte{0});
    CHECK(dst.data()[1024] == std::byte{0});

    std::memset(src.data(), 0, src.size());
    post(b, IBV_WR_RDMA_READ, src.slice(0, 1000), dst.remote().slice(24, 1000));
    CHECK(poll_one(rig.cq).opcode == IBV_WC_RDMA_READ);
    CHECK(std::memcmp(src.data(), dst.data() + 24, 1000) == 0);
}

TEST_CASE("two UC QPs connect and carry an RDMA WRITE") {
    test::Rig rig;
    QueuePair a = rig.make_qp(QpType::uc);
    QueuePair b = rig.make_qp(QpType::uc);
    must(a.connect(b.endpoint()));
    must(b.connect(a.endpoint()));
    CHECK(must(a.query_state()) == QpState::rts);
    MemoryRegion src = must(MemoryRegion::allocate(rig.pd, 256, access_all));
    MemoryRegion dst = must(MemoryRegion::allocate(rig.pd, 256, access_all));
    std::memset(src.data(), 0x5a, 256);
    post(a, IBV_WR_RDMA_WRITE, src.all(), dst.remote());
    poll_one(rig.cq);
    CHECK(dst.data()[255] == std::byte{0x5a});
}

TEST_CASE("two UD QPs activate and exchange a datagram through an address handle") {
    test::Rig rig;
    QueuePair a = rig.make_qp(QpType::ud);
    QueuePair b = rig.make_qp(QpType::ud);
    must(a.activate());
    must(b.activate());
    CHECK(must(a.query_state()) == QpState::rts);
    const AddressHandle to_b = must(AddressHandle::create(a, b.endpoint()));
    // an address handle uses the peer's address alone: a description without PSN or
    // MTU (a UD peer's) is enough; one without an address is an Error
    Endpoint address_only = b.endpoint();
    address_only.psn = 0xffffffff;
    address_only.mtu = Mtu::unknown;
    must(AddressHandle::create(a, address_only));
    Endpoint no_address = b.endpoint();
    no_address.gid = {};
    no_address.lid = 0;
    CHECK(must_fail(AddressHandle::create(a, no_address)).is_errno(EINVAL));
    // a local GID beyond ibv_ah_attr's 8-bit sgid_index (rxe's table has 1024 entries)
    GidEntry far = a.gid();
    far.index = 300;
    const Error beyond =
        must_fail(AddressHandle::create(a.pd(), b.endpoint(), far, a.port(), a.link_layer()));
    CHECK(beyond.message().find("sgid_index holds 8 bits") != std::string::npos);

    constexpr std::size_t grh = 40; // a UD receive starts with the global routing header
    MemoryRegion buf = must(MemoryRegion::allocate(rig.pd, 4096, Access::local_write));
    ibv_sge recv_sge = buf.slice(1024, grh + 64).sge();
    ibv_recv_wr rwr{.wr_id = 9, .next = nullptr, .sg_list = &recv_sge, .num_sge = 1};
    ibv_recv_wr* bad_recv = nullptr;
    REQUIRE(ibv_post_recv(b.get(), &rwr, &bad_recv) == 0);

    std::memcpy(buf.data(), "datagram", 8);
    ibv_sge sge = buf.slice(0, 8).sge();
    ibv_send_wr wr = signaled(sge, IBV_WR_SEND);
    wr.wr.ud = {.ah = to_b.get(), .remote_qpn = b.qpn(), .remote_qkey = b.qkey()};
    post(a, wr);
    // the send and the receive completion land in the shared CQ in either order
    ibv_wc first = poll_one(rig.cq);
    ibv_wc second = poll_one(rig.cq);
    const ibv_wc& received = first.opcode == IBV_WC_RECV ? first : second;
    CHECK(received.wr_id == 9);
    CHECK(received.byte_len == grh + 8);
    CHECK(received.src_qp == a.qpn());
    CHECK(std::memcmp(buf.data() + 1024 + grh, "datagram", 8) == 0);
}

TEST_CASE("capabilities beyond the device's limits are an Error naming the cap") {
    test::Rig rig;
    const ibv_device_attr& limits = rig.context.attributes().raw;
    const auto too_many = static_cast<std::uint32_t>(limits.max_qp_wr) + 1;
    const auto too_wide = static_cast<std::uint32_t>(limits.max_sge) + 1;
    for (const auto& [caps, name] : {std::pair{QpCaps{.max_send_wr = too_many}, "max_send_wr"},
                                     std::pair{QpCaps{.max_recv_wr = too_many}, "max_recv_wr"},
                                     std::pair{QpCaps{.max_send_sge = too_wide}, "max_send_sge"},
                                     std::pair{QpCaps{.max_recv_sge = too_wide}, "max_recv_sge"}}) {
        const Error e = must_fail(QueuePair::create(rig.pd, {.send_cq = &rig.cq, .recv_cq = &rig.cq, .caps = caps}));
        CHECK(e.is_errno(EINVAL));
        CHECK(e.message().find(name) != std::string::npos);
    }
    // inline data has no device attribute: the device itself refuses
    CHECK_FALSE(QueuePair::create(rig.pd, {.send_cq = &rig.cq, .recv_cq = &rig.cq,
                                           .caps = {.max_inline_data = 1u << 20}}));
    const QueuePair qp = rig.make_qp(QpType::rc, {.max_send_wr = 64, .max_inline_data = 64});
    CHECK(qp.caps().max_send_wr >= 64);
    CHECK(qp.caps().max_inline_data >= 64);
}

TEST_CASE("a peer description that cannot be right is an Error and leaves the QP in RESET") {
    test::Rig rig;
    QueuePair a = rig.make_qp(QpType::rc);
    const QueuePair b = rig.make_qp(QpType::rc);
    const Endpoint good = b.endpoint();
    Endpoint wide_qpn = good;
    wide_qpn.qpn = 0x1000000;
    Endpoint wide_psn = good;
    wide_psn.psn = 0x1000000;
    Endpoint no_mtu = good;
    no_mtu.mtu = Mtu::unknown;
    Endpoint no_address = good;
    no_address.gid = {};
    no_address.lid = 0;
    for (const auto& [peer, what] : {std::pair{wide_qpn, "QPN"}, std::pair{wide_psn, "PSN"},
                                     std::pair{no_mtu, "MTU"}, std::pair{no_address, "peer"}}) {
        const Error e = must_fail(a.connect(peer));
        CHECK(e.is_errno(EINVAL));
        CHECK(e.message().find(what) != std::string::npos);
        CHECK(must(a.query_state()) == QpState::reset);
    }
    if (a.endpoint().mtu < Mtu::b4096) { // an MTU above the port's active MTU: found after INIT
        CHECK(must_fail(a.connect(good, {.path_mtu = Mtu::b4096})).message().find("MTU") != std::string::npos);
        CHECK(a.state() == QpState::reset); // back in RESET: connect() may be tried again
        CHECK(must(a.query_state()) == QpState::reset);
    }
    must(a.connect(good));
}

TEST_CASE("the state machine is driven step by step, to ERR and back to RESET") {
    test::Rig rig;
    QueuePair a = rig.make_qp(QpType::rc);
    const QueuePair b = rig.make_qp(QpType::rc);
    must(a.to_init());
    CHECK(a.state() == QpState::init);
    must(a.to_rtr(b.endpoint(), {.path_mtu = Mtu::b256, .min_rnr_timer = 1}));
    CHECK(must(a.query_state()) == QpState::rtr);
    must(a.to_rts({.ack_timeout = 10, .retry_cnt = 3, .rnr_retry = 2}));
    CHECK(must(a.query_state()) == QpState::rts);
    must(a.to_error());
    CHECK(must(a.query_state()) == QpState::error);
    must(a.reset());
    CHECK(must(a.query_state()) == QpState::reset);
    // raw modify keeps the cached state in step
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    must(a.modify(attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    CHECK(a.state() == QpState::init);
    // the device refuses a transition it does not allow: INIT -> RTS
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    CHECK(must_fail(a.modify(rts, IBV_QP_STATE)).call() == std::string_view("ibv_modify_qp"));
}

TEST_CASE("misusing the state machine is a programming error") {
    test::Rig rig;
    QueuePair rc = rig.make_qp(QpType::rc);
    QueuePair ud = rig.make_qp(QpType::ud);
    const Endpoint peer = rig.make_qp(QpType::rc).endpoint();
    RDMAXX_CHECK_DEATH((void)rc.to_rtr(peer), "not INIT");
    RDMAXX_CHECK_DEATH((void)rc.to_rts(), "not RTR");
    RDMAXX_CHECK_DEATH((void)rc.activate(), "activate() on a RC QP");
    RDMAXX_CHECK_DEATH((void)ud.connect(peer), "connect() on a UD QP");
    RDMAXX_CHECK_DEATH((void)AddressHandle::create(rc, peer), "only UD sends");
    must(rc.to_init());
    RDMAXX_CHECK_DEATH((void)rc.to_rtr(peer, {.min_rnr_timer = 32}), "min_rnr_timer 32");
    RDMAXX_CHECK_DEATH((void)rc.connect(peer), "not RESET");
    RDMAXX_CHECK_DEATH((void)QueuePair::create(rig.pd, {.send_cq = &rig.cq}), "send_cq and recv_cq");
    QueuePair moved = std::move(rc);
    RDMAXX_CHECK_DEATH((void)rc.query_state(), "moved-from QueuePair");
}

TEST_CASE("completion queues: depth limits, channels and bounded waits") {
    test::Rig rig;
    const auto max_cqe = static_cast<std::uint32_t>(rig.context.attributes().raw.max_cqe);
    CHECK(must_fail(CompletionQueue::create(rig.context, {.depth = max_cqe + 1})).message().find("max_cqe") !=
          std::string::npos);
    CompletionQueue plain = must(CompletionQueue::create(rig.context, {.depth = 100}));
    CHECK(plain.depth() >= 100);
    CHECK_FALSE(plain.has_channel());
    RDMAXX_CHECK_DEATH((void)plain.arm(), "without a channel");

    CompletionQueue cq = must(CompletionQueue::create(rig.context, {.depth = 16, .channel = true}));
    must(cq.arm());
    const auto start = std::chrono::steady_clock::now();
    CHECK(must_fail(cq.wait_event(50ms)).is_timeout());
    CHECK(std::chrono::steady_clock::now() - start >= 50ms);
    const auto deadline = std::chrono::steady_clock::now() + 50ms;
    CHECK(must_fail(cq.wait_event_until(deadline)).is_timeout());
    CHECK(std::chrono::steady_clock::now() >= deadline);

    // an event arrives for a completion after arming, and is taken and acknowledged
    QueuePair a = must(QueuePair::create(rig.pd, {.send_cq = &cq, .recv_cq = &cq}));
    QueuePair b = rig.make_qp(QpType::rc);
    must(a.connect(b.endpoint()));
    must(b.connect(a.endpoint()));
    MemoryRegion mr = must(MemoryRegion::allocate(rig.pd, 64, access_all));
    const test::Watchdog bound(60s, "waiting for CQ events, half of them with no limit");
    for (int round = 0; round < 40; ++round) { // past the ack batch
        must(cq.arm());
        post(a, IBV_WR_RDMA_WRITE, mr.slice(0, 8), mr.remote().slice(32, 8));
        if (round % 2)
            must(cq.wait_event(5000ms));
        else
            must(cq.wait_event_until(std::chrono::steady_clock::time_point::max())); // no limit
        poll_one(cq);
    }
    CHECK(cq.channel_fd() >= 0);
}

TEST_CASE("a completion queue resized keeps its completions, its channel and its arming") {
    test::Rig rig;
    const auto max_cqe = static_cast<std::uint32_t>(rig.context.attributes().raw.max_cqe);
    CompletionQueue cq = must(CompletionQueue::create(rig.context, {.depth = 16, .channel = true}));
    QueuePair a = must(QueuePair::create(rig.pd, {.send_cq = &cq, .recv_cq = &cq, .caps = {.max_send_wr = 128}}));
    QueuePair b = rig.make_qp(QpType::rc);
    must(a.connect(b.endpoint()));
    must(b.connect(a.endpoint()));
    MemoryRegion mr = must(MemoryRegion::allocate(rig.pd, 64, access_all));
    must(cq.arm());
    must(cq.resize(200));
    CHECK(cq.depth() >= 200);
    for (int i = 0; i < 100; ++i) // more than the first 16 entries hold, none polled yet
        post(a, IBV_WR_RDMA_WRITE, mr.slice(0, 8), mr.remote().slice(32, 8));
    must(cq.wait_event(5000ms)); // still armed
    CHECK(must_fail(cq.resize(max_cqe + 1)).is_errno(EINVAL));
    for (int i = 0; i < 100; ++i)
        poll_one(cq);
    RDMAXX_CHECK_DEATH((void)cq.resize(0), "depth 0");
}

TEST_CASE("a completion-event wait interrupted by signals still ends at its timeout") {
    test::Rig rig;
    CompletionQueue cq = must(CompletionQueue::create(rig.context, {.depth = 16, .channel = true}));
    must(cq.arm());
    // a handler without SA_RESTART: each signal ends poll() with EINTR
    struct sigaction action {};
    struct sigaction previous {};
    action.sa_handler = [](int) {};
    REQUIRE(sigaction(SIGUSR1, &action, &previous) == 0);
    const pthread_t waiter = pthread_self();
    std::atomic<bool> done{false};
    test::Thread interrupter([&] {
        // every 50 ms for up to 5 s: a wait that restarts its 500 ms at each signal never ends meanwhile
        for (int i = 0; i < 100 && !done; ++i) {
            pthread_kill(waiter, SIGUSR1);
            std::this_thread::sleep_for(50ms);
        }
    });
    const auto start = std::chrono::steady_clock::now();
    const Error e = must_fail(cq.wait_event(500ms));
    const auto waited = std::chrono::steady_clock::now() - start;
    done = true;
    interrupter.join();
    sigaction(SIGUSR1, &previous, nullptr);
    CHECK(e.is_timeout());
    CHECK(waited >= 500ms);
    CHECK(waited < 2500ms);
}

TEST_CASE("shared receive queues feed a QP's receives") {
    test::Rig rig;
    const auto max_srq_wr = static_cast<std::uint32_t>(rig.context.attributes().raw.max_srq_wr);
    CHECK(must_fail(SharedReceiveQueue::create(rig.pd, {.max_wr = max_srq_wr + 1})).is_errno(EINVAL));
    const SharedReceiveQueue srq = must(SharedReceiveQueue::create(rig.pd, {.max_wr = 64}));
    CHECK(srq.max_wr() >= 64);
    QueuePair a = rig.make_qp(QpType::rc);
    QueuePair b = must(QueuePair::create(rig.pd, {.send_cq = &rig.cq, .recv_cq = &rig.cq, .srq = &srq}));
    must(a.connect(b.endpoint()));
    must(b.connect(a.endpoint()));
    MemoryRegion mr = must(MemoryRegion::allocate(rig.pd, 128, access_all));
    ibv_sge rsge = mr.slice(64, 64).sge();
    ibv_recv_wr rwr{.wr_id = 5, .next = nullptr, .sg_list = &rsge, .num_sge = 1};
    ibv_recv_wr* bad_recv = nullptr;
    REQUIRE(ibv_post_srq_recv(srq.get(), &rwr, &bad_recv) == 0);
    std::memcpy(mr.data(), "via srq!", 8);
    ibv_sge sge = mr.slice(0, 8).sge();
    post(a, signaled(sge, IBV_WR_SEND));
    ibv_wc first = poll_one(rig.cq);
    ibv_wc second = poll_one(rig.cq);
    const ibv_wc& received = first.opcode == IBV_WC_RECV ? first : second;
    CHECK(received.wr_id == 5);
    CHECK(received.byte_len == 8);
    CHECK(std::memcmp(mr.data() + 64, "via srq!", 8) == 0);
}
