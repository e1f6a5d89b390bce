// Two devices over a real (virtual) wire with packet loss: RC recovers every byte.
// Runs where scripts/vm/pair.sh made rxeA and rxeB (RDMAXX_PAIR_* set); elsewhere
// every test case here is skipped.
#include <cstdlib>
#include <cstring>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>

#include "../support/device.hpp"

using namespace rdmaxx;
using namespace std::chrono_literals;
using rdmaxx::test::must;

namespace {

const char* env(const char* name) {
    const char* value = std::getenv(name);
    return value ? value : "";
}

bool have_pair() { return *env("RDMAXX_PAIR_A_DEV") && *env("RDMAXX_PAIR_B_DEV"); }

// One side: its own device, PD, CQ, QP and 1 MiB buffer.
struct Side {
    Context context;
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 64}));
    QueuePair qp = must(QueuePair::create(pd, {.send_cq = &cq, .recv_cq = &cq}));
    MemoryRegion mem = must(MemoryRegion::allocate(pd, 1 << 20, access_all));
    explicit Side(const char* device) : context(must(Context::open(device))) {}
};

void netem(const char* interface, const char* verb, const char* rule) {
    const std::string command = fmt::format("tc qdisc {} dev {} root netem {}", verb, interface, rule);
    REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command);
}

} // namespace

TEST_CASE("1 MiB WRITE, READ and SEND between two devices under 5 % loss each way" *
          doctest::skip(!have_pair())) {
    Side a(env("RDMAXX_PAIR_A_DEV"));
    Side b(env("RDMAXX_PAIR_B_DEV"));
    must(a.qp.connect(b.qp.endpoint()));
    must(b.qp.connect(a.qp.endpoint()));
    netem(env("RDMAXX_PAIR_A_IF"), "add", "loss 5%");
    netem(env("RDMAXX_PAIR_B_IF"), "add", "loss 5%");
    const WaitOptions patient{.timeout = 60s};

    test::fill(a.mem.bytes(), 1);
    must(post_write(a.qp, a.mem.all(), b.mem.remote(), {.wr_id = 1}));
    must(wait_for(a.cq, 1, patient));
    CHECK(std::memcmp(a.mem.data(), b.mem.data(), a.mem.size()) == 0);

    test::fill(b.mem.bytes(), 2);
    must(post_read(a.qp, a.mem.all(), b.mem.remote(), {.wr_id = 2}));
    must(wait_for(a.cq, 2, patient));
    CHECK(std::memcmp(a.mem.data(), b.mem.data(), a.mem.size()) == 0);

    test::fill(a.mem.bytes(), 3);
    must(post_recv(b.qp, b.mem.all(), 3));
    must(post_send(a.qp, a.mem.all(), {.wr_id = 4}));
    CHECK(must(wait_for(b.cq, 3, patient)).byte_len() == a.mem.size());
    must(wait_for(a.cq, 4, patient));
    CHECK(std::memcmp(a.mem.data(), b.mem.data(), a.mem.size()) == 0);

    netem(env("RDMAXX_PAIR_A_IF"), "del", "");
    netem(env("RDMAXX_PAIR_B_IF"), "del", "");
}
