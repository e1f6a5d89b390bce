// Counting operator new, for the zero-allocation tests: the replacement is defined once
// per test program (device/async_test.cpp for device-async-tests) and counts every
// allocation while `counting` is set.
#pragma once

#include <atomic>

namespace rdmaxx::test {

extern std::atomic<bool> counting;
extern std::atomic<long> allocations;

} // namespace rdmaxx::test
