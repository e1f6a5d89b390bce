// Counting operator new and aligned_alloc (Asio's), for the zero-allocation tests: the
// replacements (allocations.cpp) are linked into the programs that count, and count
// every allocation while `counting` is set.
#pragma once

#include <atomic>

namespace rdmaxx::test {

extern std::atomic<bool> counting;
extern std::atomic<long> allocations;         // operator new and aligned_alloc
extern std::atomic<long> aligned_allocations; // aligned_alloc alone

} // namespace rdmaxx::test
