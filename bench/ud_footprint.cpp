// rdmaxx-ud-footprint: what user-space code run between a receive and the next send
// costs a UD round trip on a software device under emulation (bench/results/rpc.md,
// "Where the round trip goes"). Raw verbs, as perftest: two UD QPs of one process, a
// pinger thread on CPU 1 and a ponger on CPU 0, each sending the next packet as soon as
// its poll finds one. Between the two, each side runs one of three kinds of work:
//   none      nothing (perftest's loop)
//   same      one small function called 256 times (many instructions, little code)
//   distinct  256 small functions called once each (as many calls, 256 times the code)
// Printed per kind, medians of the rounds' medians (us): the round trip; the delivery of
// a packet (its post begins -> the peer's poll finds it: the kernel's whole send and
// receive path, rxe's work) each way; the ponger's time from finding a packet to posting
// the answer.
//
// Usage: rdmaxx-ud-footprint [ROUNDS [ITERATIONS]] on a machine with an RDMA device
// (scripts/vm/run.sh build/bench/rdmaxx-ud-footprint). The GID index comes from
// $RDMAXX_GID_INDEX or $RDMAXX_VM_GID_INDEX (default 1).
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "stats.hpp"

namespace {

using rdmaxx::perf::median;

using Clock = std::chrono::steady_clock;

constexpr int ring = 64;                 // receive buffers per QP
constexpr std::uint32_t slot = 40 + 1024; // GRH + an MTU of 1024
constexpr std::uint32_t payload = 32;
constexpr std::uint32_t qkey = 0x11;

enum class Work { none, same, distinct };
constexpr std::array<const char*, 3> work_names{"none", "same", "distinct"};
constexpr std::size_t functions = 256;

// The work: each function updates its own cache line (the data footprint is the same
// for both kinds of work that call functions: 256 lines). Per thread: the two sides'
// work alternates, but only the device orders it.
thread_local std::array<std::uint64_t, functions * 8> lines{};
thread_local volatile std::uint64_t sink = 0;

template <std::size_t I>
[[gnu::noinline]] void touch(std::uint64_t x) {
    lines[I * 8] += x * (I + 3);
    if (lines[I * 8] & 1)
        sink = sink ^ I;
}

template <std::size_t... I>
void distinct(std::index_sequence<I...>) {
    (touch<I>(I), ...);
}

void work(Work kind) {
    if (kind == Work::distinct) {
        distinct(std::make_index_sequence<functions>{});
    } else if (kind == Work::same) {
        for (std::size_t i = 0; i < functions; ++i)
            touch<0>(i);
    }
}

[[noreturn]] void fail(const char* what) {
    std::perror(what);
    std::exit(1);
}

struct Side {
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_mr* mr = nullptr;
    std::unique_ptr<std::byte[]> memory;
    ibv_ah* ah = nullptr;
    std::uint32_t peer_qpn = 0;
    std::vector<Clock::time_point> posted, found; // per iteration

    void post_receive(std::uint64_t i) {
        ibv_sge sge{reinterpret_cast<std::uintptr_t>(memory.get() + i * slot), slot, mr->lkey};
        ibv_recv_wr wr{};
        wr.wr_id = i;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (ibv_post_recv(qp, &wr, &bad) != 0)
            fail("ibv_post_recv");
    }
    void post_send() {
        ibv_sge sge{reinterpret_cast<std::uintptr_t>(memory.get() + ring * slot), payload, mr->lkey};
        ibv_send_wr wr{};
        wr.wr_id = ring;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = peer_qpn;
        wr.wr.ud.remote_qkey = qkey;
        ibv_send_wr* bad = nullptr;
        if (ibv_post_send(qp, &wr, &bad) != 0)
            fail("ibv_post_send");
    }
    // Polls until a receive completes (send completions are taken on the way); its buffer.
    std::uint64_t wait_receive() {
        std::array<ibv_wc, 8> wcs;
        for (;;) {
            const int n = ibv_poll_cq(cq, static_cast<int>(wcs.size()), wcs.data());
            if (n < 0)
                fail("ibv_poll_cq");
            for (int k = 0; k < n; ++k) {
                if (wcs[k].status != IBV_WC_SUCCESS) {
                    std::fprintf(stderr, "rdmaxx-ud-footprint: %s\n", ibv_wc_status_str(wcs[k].status));
                    std::exit(1);
                }
                if (wcs[k].opcode == IBV_WC_RECV)
                    return wcs[k].wr_id;
            }
        }
    }
};

void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

void make_side(Side& s, ibv_context* context, ibv_pd* pd, const ibv_gid& gid, int gid_index, int iterations) {
    s.cq = ibv_create_cq(context, 4 * ring, nullptr, nullptr, 0);
    if (s.cq == nullptr)
        fail("ibv_create_cq");
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = s.cq;
    init.cap = {.max_send_wr = ring, .max_recv_wr = ring, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
    init.qp_type = IBV_QPT_UD;
    s.qp = ibv_create_qp(pd, &init);
    if (s.qp == nullptr)
        fail("ibv_create_qp");
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    attr.qkey = qkey;
    if (ibv_modify_qp(s.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) != 0)
        fail("ibv_modify_qp INIT");
    attr.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(s.qp, &attr, IBV_QP_STATE) != 0)
        fail("ibv_modify_qp RTR");
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = 0;
    if (ibv_modify_qp(s.qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN) != 0)
        fail("ibv_modify_qp RTS");
    const std::size_t bytes = std::size_t{ring + 1} * slot;
    s.memory = std::make_unique<std::byte[]>(bytes);
    s.mr = ibv_reg_mr(pd, s.memory.get(), bytes, IBV_ACCESS_LOCAL_WRITE);
    if (s.mr == nullptr)
        fail("ibv_reg_mr");
    ibv_ah_attr ah{};
    ah.is_global = 1;
    ah.port_num = 1;
    ah.grh.dgid = gid;
    ah.grh.sgid_index = static_cast<std::uint8_t>(gid_index);
    ah.grh.hop_limit = 64;
    s.ah = ibv_create_ah(pd, &ah);
    if (s.ah == nullptr)
        fail("ibv_create_ah");
    for (int i = 0; i < ring; ++i)
        s.post_receive(static_cast<std::uint64_t>(i));
    s.posted.resize(static_cast<std::size_t>(iterations));
    s.found.resize(static_cast<std::size_t>(iterations));
}

double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// One round of `iterations` round trips with `kind` of work on both sides; the medians
// of round trip, delivery there, delivery back and the ponger's turnaround.
std::array<double, 4> one_round(std::array<Side, 2>& sides, int iterations, Work kind) {
    auto ping = [&] {
        pin(1);
        Side& s = sides[0];
        for (int k = 0; k < iterations; ++k) {
            s.posted[k] = Clock::now();
            s.post_send();
            const auto buffer = s.wait_receive();
            s.found[k] = Clock::now();
            s.post_receive(buffer);
            work(kind);
        }
    };
    auto pong = [&] {
        pin(0);
        Side& s = sides[1];
        for (int k = 0; k < iterations; ++k) {
            const auto buffer = s.wait_receive();
            s.found[k] = Clock::now();
            s.post_receive(buffer);
            work(kind);
            s.posted[k] = Clock::now();
            s.post_send();
        }
    };
    std::thread a(ping), b(pong);
    a.join();
    b.join();
    std::array<std::vector<double>, 4> v;
    for (int k = iterations / 5; k < iterations; ++k) { // the first fifth warms up
        v[0].push_back(us(sides[0].found[k] - sides[0].posted[k]));
        v[1].push_back(us(sides[1].found[k] - sides[0].posted[k]));
        v[2].push_back(us(sides[0].found[k] - sides[1].posted[k]));
        v[3].push_back(us(sides[1].posted[k] - sides[1].found[k]));
    }
    return {median(v[0]), median(v[1]), median(v[2]), median(v[3])};
}

} // namespace

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
    const int iterations = argc > 2 ? std::max(10, std::atoi(argv[2])) : 3000;
    const char* index = std::getenv("RDMAXX_GID_INDEX");
    if (index == nullptr)
        index = std::getenv("RDMAXX_VM_GID_INDEX");
    const int gid_index = index != nullptr ? std::atoi(index) : 1;
    int count = 0;
    ibv_device** devices = ibv_get_device_list(&count);
    if (devices == nullptr || count == 0) {
        std::fprintf(stderr, "rdmaxx-ud-footprint: no RDMA device\n");
        return 1;
    }
    ibv_context* context = ibv_open_device(devices[0]);
    if (context == nullptr)
        fail("ibv_open_device");
    ibv_pd* pd = ibv_alloc_pd(context);
    if (pd == nullptr)
        fail("ibv_alloc_pd");
    ibv_gid gid{};
    if (ibv_query_gid(context, 1, gid_index, &gid) != 0)
        fail("ibv_query_gid");
    std::array<Side, 2> sides;
    for (Side& s : sides)
        make_side(s, context, pd, gid, gid_index, iterations);
    sides[0].peer_qpn = sides[1].qp->qp_num;
    sides[1].peer_qpn = sides[0].qp->qp_num;

    std::array<std::array<std::vector<double>, 4>, 3> all; // per kind, per figure: the rounds' medians
    for (int r = 0; r < rounds; ++r)
        for (std::size_t kind = 0; kind < all.size(); ++kind) {
            const auto m = one_round(sides, iterations, static_cast<Work>(kind));
            for (std::size_t f = 0; f < m.size(); ++f)
                all[kind][f].push_back(m[f]);
        }
    std::printf("%s: %d rounds of %d round trips, 32 B, medians [us]\n", ibv_get_device_name(devices[0]), rounds,
                iterations);
    std::printf("%-9s %10s %14s %14s %16s\n", "work", "round trip", "delivery there", "delivery back",
                "ponger's turn");
    for (std::size_t kind = 0; kind < all.size(); ++kind)
        std::printf("%-9s %10.2f %14.2f %14.2f %16.2f\n", work_names[kind], median(all[kind][0]),
                    median(all[kind][1]), median(all[kind][2]), median(all[kind][3]));
    // the process ends here: the device's resources go with it
    return 0;
}
