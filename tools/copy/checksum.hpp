// The end-to-end checksum of a file: XXH64 (Debian's libxxhash-dev, header-only here).
// Not XXH3, the newer hash of the same library: XXH3 leans on the vector unit (16-18
// GB/s per core natively against XXH64's 10), and where that unit is emulated (QEMU's
// TCG, where rdmaxx's CI runs) XXH3 managed 160-360 MiB/s against XXH64's 3-4 GiB/s,
// and hashing became the client's largest cost beside Soft-RoCE. XXH64 is scalar: fast
// everywhere, and still faster than the copy out of the page cache that pread makes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace rdmaxx::copy {

class Checksum {
public:
    Checksum();
    ~Checksum();
    Checksum(Checksum&&) noexcept;
    Checksum& operator=(Checksum&&) noexcept;
    void update(std::span<const std::byte> bytes) noexcept;
    std::uint64_t digest() const noexcept;

private:
    struct State; // xxhash's state: on the heap, out of coroutine frames (g++ 12 and alignment)
    std::unique_ptr<State> state_;
};

std::uint64_t checksum_of(std::span<const std::byte> bytes) noexcept;

} // namespace rdmaxx::copy
