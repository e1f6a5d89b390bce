// The end-to-end checksum of a file: XXH3-64 (Debian's libxxhash-dev, header-only here).
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
    struct State; // xxhash's state, 64-byte aligned: on the heap, never in a coroutine frame
    std::unique_ptr<State> state_;
};

std::uint64_t checksum_of(std::span<const std::byte> bytes) noexcept;

} // namespace rdmaxx::copy
