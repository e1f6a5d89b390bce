// Fixtures for the device suite: tests that run against a real RDMA device (rxe0 in
// the project's Soft-RoCE VM, or a real NIC).
#pragma once

#include <string>
#include <vector>

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

} // namespace rdmaxx::test
