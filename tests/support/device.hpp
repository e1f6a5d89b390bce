// Fixtures for the device suite: tests that run against a real RDMA device (rxe0 in
// the project's Soft-RoCE VM, or a real NIC).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include <span>

#include <net/if.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <rdmaxx/wrap.hpp>

#include "check.hpp"

namespace rdmaxx::test {

// The verbs objects of one process's "rdma res show" (qp, cq, mr, pd) that are
// still alive, one line each; empty when nothing leaked.
std::vector<std::string> leftover_resources();

// A context, PD and CQ: what almost every device test starts from.
struct Rig {
    Context context = must(Context::open());
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 256}));

    QueuePair make_qp(QpType type, QpCaps caps = {}) {
        return must(QueuePair::create(pd, {.type = type, .send_cq = &cq, .recv_cq = &cq, .caps = caps}));
    }
};

// One of a context's provider entry points (ibv_context_ops: post_send, poll_cq,
// req_notify_cq, ...) replaced for this object's life: the device made to fail as it
// may, without faking verbs. `op` is e.g. context.get()->ops.post_send.
template <class Op>
class ReplacedOp {
public:
    ReplacedOp(Op& op, Op replacement) : op_(op), saved_(op) { op = replacement; }
    ReplacedOp(const ReplacedOp&) = delete;
    ReplacedOp& operator=(const ReplacedOp&) = delete;
    ~ReplacedOp() { op_ = saved_; }

private:
    Op& op_;
    Op saved_;
};

// Whether the device has type 2 memory windows: where it has none, the cases that need
// them are skipped, not passed.
inline bool device_has_windows() {
    auto context = Context::open();
    return context && context->attributes().type2_windows;
}

// Two RC QPs of one process connected to each other, each with its own CQ, and a
// registered buffer on each side.
struct RcPair {
    Context context = must(Context::open());
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    CompletionQueue cq_a = must(CompletionQueue::create(context, {.depth = 1024, .channel = true}));
    CompletionQueue cq_b = must(CompletionQueue::create(context, {.depth = 1024, .channel = true}));
    QueuePair a;
    QueuePair b;
    MemoryRegion mem_a = must(MemoryRegion::allocate(pd, 1 << 20, access_all));
    MemoryRegion mem_b = must(MemoryRegion::allocate(pd, 1 << 20, access_all));

    explicit RcPair(PostApi api = PostApi::automatic, QpCaps caps = {.max_send_wr = 256, .max_recv_wr = 256,
                                                                     .max_send_sge = 4, .max_recv_sge = 4,
                                                                     .max_inline_data = 64},
                    QpConnectOptions options = {})
        : a(must(QueuePair::create(pd, {.send_cq = &cq_a, .recv_cq = &cq_a, .caps = caps, .post_api = api}))),
          b(must(QueuePair::create(pd, {.send_cq = &cq_b, .recv_cq = &cq_b, .caps = caps, .post_api = api}))) {
        must(a.connect(b.endpoint(), options));
        must(b.connect(a.endpoint(), options));
    }
};

// An address for RDMA CM, which needs one on the RDMA device's netdev, not loopback:
// the VM's, else the IPv4 address in the device's chosen GID.
inline std::string cm_address() {
    if (const char* vm = std::getenv("RDMAXX_VM_ADDR"); vm && *vm)
        return vm;
    auto context = must(Context::open());
    const GidEntry gid = must(context.choose_gid(1));
    return fmt::format("{}.{}.{}.{}", gid.gid.bytes[12], gid.gid.bytes[13], gid.gid.bytes[14], gid.gid.bytes[15]);
}

// Takes the netdev under a RoCE GID down, as a pulled cable would (PORT_ERR on every
// context of its device), and up again on up() or destruction, then waits (bounded:
// 5 s) for the port's GID to come back with the address, so that the next test finds
// the port as it was. Needs root (the VM's init runs the suites as root).
class LinkDown {
public:
    explicit LinkDown(const GidEntry& gid) {
        char name[IF_NAMESIZE] = {};
        REQUIRE(::if_indextoname(gid.netdev_ifindex, name) != nullptr);
        netdev_ = name;
        REQUIRE(std::system(fmt::format("ip link set {} down", netdev_).c_str()) == 0);
    }
    LinkDown(const LinkDown&) = delete;
    LinkDown& operator=(const LinkDown&) = delete;
    ~LinkDown() { up(); }

    void up() {
        if (netdev_.empty())
            return;
        CHECK(std::system(fmt::format("ip link set {} up", netdev_).c_str()) == 0);
        netdev_.clear();
        const auto gid_back = [] {
            auto context = Context::open();
            return context && context->choose_gid(1).has_value();
        };
        for (int i = 0; i < 500 && !gid_back(); ++i)
            ::usleep(10000);
        CHECK(gid_back());
    }

private:
    std::string netdev_;
};

// A raw RDMA WRITE of `sge` into `remote`, for a test that posts behind the library's
// back (ibv_post_send on QueuePair::get()); wr_id 0.
inline ibv_send_wr raw_write_wr(ibv_sge& sge, const RemoteMemory& remote, bool signaled) {
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = remote.addr;
    wr.wr.rdma.rkey = remote.rkey;
    return wr;
}

// Fills `bytes` with a pattern that differs per `seed`.
inline void fill(std::span<std::byte> bytes, unsigned seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
}

} // namespace rdmaxx::test
