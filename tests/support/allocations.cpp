// The counting operator new and aligned_alloc of tests/support/allocations.hpp: linked into the test
// programs that count allocations (device-alloc-tests, device-async-tests,
// device-rpc-tests), and only those.
#include "allocations.hpp"

#include <cstdlib>
#include <new>

#include <malloc.h>

// The replacements pair malloc with free on purpose; GCC, seeing through them, would
// call each free "mismatched" with the operator new it inlined.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::test {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
std::atomic<long> aligned_allocations{0};
} // namespace rdmaxx::test

void* operator new(std::size_t size) {
    if (rdmaxx::test::counting.load(std::memory_order_relaxed))
        rdmaxx::test::allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(size == 0 ? 1 : size))
        return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

// Asio allocates its operations and coroutine frames with aligned_alloc
// (asio/detail/memory.hpp), past operator new: counted too, or an allocation per
// operation through Asio's per-thread cache (two blocks per purpose) goes unseen.
extern "C" void* aligned_alloc(std::size_t alignment, std::size_t size) noexcept {
    if (rdmaxx::test::counting.load(std::memory_order_relaxed)) {
        rdmaxx::test::allocations.fetch_add(1, std::memory_order_relaxed);
        rdmaxx::test::aligned_allocations.fetch_add(1, std::memory_order_relaxed);
    }
    return memalign(alignment, size);
}
