// The performance contract: post, poll and a warm pool's allocation allocate nothing.
#include <doctest/doctest.h>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>

#include "../support/allocations.hpp"
#include "../support/device.hpp"

// operator new is counted while a window is open (support/allocations.cpp).
using rdmaxx::test::allocations;
using rdmaxx::test::counting;

using namespace rdmaxx;
using rdmaxx::test::must;

TEST_CASE("10,000 post + poll round trips allocate nothing, on both post APIs") {
    for (const PostApi api : {PostApi::classic, PostApi::extended}) {
        test::RcPair p(api);
        std::array<WorkCompletion, 16> wcs;
        SendBatch<1> prebuilt(p.a);
        prebuilt.write(p.mem_a.slice(0, 64), p.mem_b.remote().slice(8192, 64));
        RecvBatch<1> receive(p.b);
        receive.add(p.mem_b.slice(0, 64), 0);
        allocations = 0;
        long failures = 0; // counted, not checked, inside the window: a check may allocate
        auto count = [&failures](const auto& result) { failures += result ? 0 : 1; };
        counting = true;
        for (std::uint64_t i = 0; i < 10'000; ++i) {
            // a WRITE, and a SEND into a receive: every hot-path call
            count(post_recv(p.b, p.mem_b.slice(0, 64), i));
            count(post_write(p.a, p.mem_a.slice(0, 64), p.mem_b.remote().slice(4096, 64), {.wr_id = i}));
            count(post_send(p.a, p.mem_a.slice(64, 64), {.wr_id = i, .signaled = false}));
            count(wait_for(p.cq_a, i));
            count(wait_for(p.cq_b, i));
            const auto stray = poll(p.cq_a, wcs);
            count(stray);
            failures += stray && *stray == 0 ? 0 : 1; // the SEND was unsignaled: nothing more
            // the same through batches built once
            count(receive.set_wr_id(0, i).post());
            count(post_send(p.a, p.mem_a.slice(64, 64), {.wr_id = i, .signaled = false}));
            count(prebuilt.set_wr_id(0, i).post());
            count(wait_n(p.cq_a, std::span(wcs).first(1), 1));
            failures += wcs[0].wr_id() == i && wcs[0].opcode() == WcOpcode::rdma_write ? 0 : 1;
            count(wait_for(p.cq_b, i));
        }
        counting = false;
        CHECK(failures == 0);
        CHECK(allocations.load() == 0);
        // the counter works: an allocation in the window is seen
        counting = true;
        void* probe = ::operator new(16);
        counting = false;
        ::operator delete(probe);
        CHECK(allocations.load() == 1);
    }
}

TEST_CASE("pool allocations allocate no heap memory once the pool is warm") {
    test::Rig rig;
    MemoryPool pool = must(MemoryPool::create(rig.pd));
    const std::size_t sizes[] = {64, 4096, 1 << 20};
    for (std::size_t size : sizes) // warm-up: the arena, a run of each class, the free lists' capacity
        (void)must(pool.allocate(size));
    allocations = 0;
    long failures = 0;
    counting = true;
    for (int i = 0; i < 10'000; ++i) {
        auto region = pool.allocate(sizes[i % 3], access_all, i % 2 == 0);
        failures += region ? 0 : 1;
    }
    counting = false;
    CHECK(failures == 0);
    CHECK(allocations.load() == 0);
}
