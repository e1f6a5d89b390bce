// Two devices over a real (virtual) wire with packet loss: RC recovers every byte.
// Runs where scripts/vm/pair.sh made rxeA and rxeB (RDMAXX_PAIR_* set); elsewhere
// every test case here is skipped.
#include <cstdlib>
#include <cstring>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <thread>

#include <rdmaxx/ctrl/connection.hpp>
#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>

#include "../support/device.hpp"
#include "../support/pair.hpp"
#include "../support/thread.hpp"

using namespace rdmaxx;
using namespace std::chrono_literals;
using rdmaxx::test::must;
using rdmaxx::test::env;
using rdmaxx::test::have_pair;
using rdmaxx::test::Netem;

namespace {

// One side: its own device, PD, CQ, QP and 1 MiB buffer.
struct Side {
    Context context;
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 64}));
    QueuePair qp = must(QueuePair::create(pd, {.send_cq = &cq, .recv_cq = &cq}));
    MemoryRegion mem = must(MemoryRegion::allocate(pd, 1 << 20, access_all));
    explicit Side(const char* device) : context(must(Context::open(device))) {}
};

} // namespace

TEST_CASE("1 MiB WRITE, READ and SEND between two devices under 5 % loss each way" *
          doctest::skip(!have_pair())) {
    Side a(env("RDMAXX_PAIR_A_DEV"));
    Side b(env("RDMAXX_PAIR_B_DEV"));
    must(a.qp.connect(b.qp.endpoint()));
    must(b.qp.connect(a.qp.endpoint()));
    const Netem lossy_a(env("RDMAXX_PAIR_A_IF"), "loss 5%");
    const Netem lossy_b(env("RDMAXX_PAIR_B_IF"), "loss 5%");
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

}

TEST_CASE("an RDMA CM connection across the wire moves 1 MiB each way under 5 % loss" * doctest::skip(!have_pair())) {
    ConnectionOptions options;
    options.transport = Transport::rdma_cm;
    options.timeout = 60s;
    const std::string server_address = env("RDMAXX_PAIR_A_ADDR");
    Listener listener = must(Listener::listen(server_address, 0, options));
    const Netem lossy_a(env("RDMAXX_PAIR_A_IF"), "loss 5%");
    const Netem lossy_b(env("RDMAXX_PAIR_B_IF"), "loss 5%");
    test::Thread client([&, port = listener.port()] {
        Connection conn = must(Connection::connect(server_address, port, options));
        CHECK(std::string_view(ibv_get_device_name(conn.queue_pair().get()->context->device)) ==
              env("RDMAXX_PAIR_B_DEV"));
        MemoryRegion mr = must(conn.alloc_local_mr(1 << 20));
        test::fill(mr.bytes(), 21);
        const RemoteMr remote = must(conn.request_remote_mr(1 << 20));
        must(conn.write(mr.all(), remote.memory));
        MemoryRegion copy = must(conn.alloc_local_mr(1 << 20));
        must(conn.read(copy.all(), remote.memory));
        CHECK(std::memcmp(copy.data(), mr.data(), mr.size()) == 0);
        must(conn.send_remote_mr(remote));
    });
    Connection conn = must(listener.accept(60s));
    CHECK(std::string_view(ibv_get_device_name(conn.queue_pair().get()->context->device)) == env("RDMAXX_PAIR_A_DEV"));
    MemoryRegion back = must(conn.receive_local_mr());
    std::vector<std::byte> expected(1 << 20);
    test::fill(expected, 21);
    CHECK(std::memcmp(back.data(), expected.data(), expected.size()) == 0);
    client.join();
}
