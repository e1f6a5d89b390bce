// Counting operator new, for the zero-allocation tests: the replacement
// (allocations.cpp) is linked into the programs that count, and counts every
// allocation while `counting` is set.
#pragma once

#include <atomic>

namespace rdmaxx::test {

extern std::atomic<bool> counting;
extern std::atomic<long> allocations;

} // namespace rdmaxx::test
