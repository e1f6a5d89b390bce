// lib/async's pure logic: the op slab's wr_ids (a stale or foreign completion never
// names a live operation), the credit queue, the deferred completions' queue, and
// Error -> std::error_code.
#include <array>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/error.hpp>
#include <asio/io_context.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/async/completions.hpp>
#include <rdmaxx/async/detail/deferred.hpp>
#include <rdmaxx/async/detail/op.hpp>
#include <rdmaxx/async/error_code.hpp>
#include <rdmaxx/async/tcp.hpp>

#include "../support/check.hpp"

using namespace rdmaxx;
using rdmaxx::async::detail::Op;
using rdmaxx::async::detail::OpQueue;
using rdmaxx::async::detail::OpSlab;

TEST_CASE("a wr_id finds its operation only while it is posted and of its generation") {
    OpSlab slab;
    Op& op = slab.acquire();
    const std::uint64_t first = op.wr_id();
    CHECK(slab.find(first) == nullptr); // acquired, not posted yet
    op.state = Op::State::posted;
    CHECK(slab.find(first) == &op);
    slab.release(op);
    CHECK(slab.find(first) == nullptr); // a late completion of the released op
    Op& again = slab.acquire();
    CHECK(&again == &op); // the slot is reused ...
    again.state = Op::State::posted;
    CHECK(again.wr_id() != first); // ... under a new name
    CHECK(slab.find(first) == nullptr);
    CHECK(slab.find(again.wr_id()) == &again);
    // foreign wr_ids: past the slab, or a user's small integers of another generation
    CHECK(slab.find(std::uint64_t{1} << 40 | 5'000'000) == nullptr);
    CHECK(slab.find(0) == nullptr);
    CHECK(slab.at(again.index, again.generation) == &again);
    CHECK(slab.at(again.index, again.generation - 1) == nullptr);
}

TEST_CASE("the slab grows in fixed chunks, never moves a slot, and counts what is in use") {
    OpSlab slab;
    std::vector<Op*> ops;
    std::set<std::uint32_t> indices;
    for (int i = 0; i < 1000; ++i) {
        ops.push_back(&slab.acquire());
        indices.insert(ops.back()->index);
    }
    CHECK(indices.size() == 1000);
    CHECK(slab.in_use() == 1000);
    CHECK(slab.capacity() >= 1000);
    const std::set<Op*> slots(ops.begin(), ops.end());
    const std::size_t capacity = slab.capacity();
    for (Op* op : ops)
        slab.release(*op);
    CHECK(slab.in_use() == 0);
    // as many again: the same slots, no growth
    for (int i = 0; i < 1000; ++i)
        CHECK(slots.count(&slab.acquire()) == 1);
    CHECK(slab.capacity() == capacity);
}

TEST_CASE("the credit queue is FIFO and removes from anywhere") {
    OpSlab slab;
    Op& a = slab.acquire();
    Op& b = slab.acquire();
    Op& c = slab.acquire();
    OpQueue queue;
    queue.push_back(a);
    queue.push_back(b);
    queue.push_back(c);
    queue.remove(b); // a cancelled waiter
    CHECK(queue.front() == &a);
    queue.remove(a);
    CHECK(queue.front() == &c);
    queue.remove(c);
    CHECK(queue.empty());
}

TEST_CASE("the deferred completions run in order, in recycled memory; at shutdown destroyed uncalled") {
    using rdmaxx::async::detail::DeferredOp;
    async::detail::HandlerMemory memory;
    async::detail::DeferredQueue queue;
    std::vector<int> ran;
    int destroyed = 0;
    struct Tracked { // counts its destruction, once moved from or not
        int* destroyed;
        explicit Tracked(int* d) : destroyed(d) {}
        Tracked(Tracked&& other) noexcept : destroyed(std::exchange(other.destroyed, nullptr)) {}
        ~Tracked() {
            if (destroyed)
                ++*destroyed;
        }
    };
    for (int i = 0; i < 3; ++i)
        queue.push(memory, [&ran, i, t = Tracked(&destroyed)] { ran.push_back(i); });
    DeferredOp* first = queue.pop();
    first->end(first, true);
    DeferredOp* second = queue.pop();
    second->end(second, true);
    // a handler's block is free before it runs: the next push takes it again
    queue.push(memory, [&ran] { ran.push_back(3); });
    DeferredOp* third = queue.pop();
    third->end(third, false); // destroyed uncalled
    DeferredOp* fourth = queue.pop();
    CHECK(fourth == second);
    CHECK(queue.empty());
    fourth->end(fourth, true);
    CHECK(ran == std::vector<int>{0, 1, 3});
    CHECK(destroyed == 3);
}

TEST_CASE("a completion handed to the service outside its driver handlers is posted, never run inline") {
    asio::io_context io;
    int ran = 0;
    async::Completions::of(io).post_completion([&ran] { ++ran; });
    CHECK(ran == 0);
    CHECK(io.poll() == 1);
    CHECK(ran == 1);
    CHECK(async::Completions::of(io).deferred_completions() == 0);
}

TEST_CASE("an Error maps to a std::error_code a caller can compare") {
    CHECK(async::to_error_code(Error::timeout("x")) == std::errc::timed_out);
    CHECK(async::to_error_code(Error::cancelled("x")) == std::errc::operation_canceled);
    CHECK(async::to_error_code(Error::from_errno("x", ENOMEM)) == std::errc::not_enough_memory);
    const std::error_code flushed = async::to_error_code(Error::completion(IBV_WC_WR_FLUSH_ERR));
    CHECK(flushed.category() == async::completion_category());
    CHECK(flushed.value() == IBV_WC_WR_FLUSH_ERR);
    CHECK(flushed.message() == ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR));
}

TEST_CASE("an Asio error code gives its errno: Asio's system category is not std's") {
    const std::error_code refused = asio::error::connection_refused;
    CHECK(refused.category() != std::system_category()); // why errno_of exists
    CHECK(async::errno_of(refused) == ECONNREFUSED);
    CHECK(async::errno_of(std::make_error_code(std::errc::address_in_use)) == EADDRINUSE);
    CHECK(async::errno_of(asio::error::eof) == EIO); // Asio's misc category: no errno
    CHECK(async::errno_of(std::error_code{}) == EIO);
}

TEST_CASE("async::connect given a null QP aborts naming its caller, before any I/O") {
    asio::io_context io;
    std::array<async::QueuePair*, 1> qps{nullptr};
    RDMAXX_CHECK_DEATH((void)async::connect(io.get_executor(), "127.0.0.1", 1, qps), "a null async::QueuePair");
}
