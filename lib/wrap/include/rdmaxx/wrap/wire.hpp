/// @file
/// Big-endian integers in byte buffers: the one encoding of every rdmaxx wire format
/// (remote descriptors, endpoint messages, connection control messages).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmaxx::wire {

/// Writes the low `bytes` bytes of `value` to out[0..bytes), most significant first.
inline void put(std::byte* out, std::uint64_t value, int bytes) noexcept {
    for (int i = bytes - 1; i >= 0; --i, value >>= 8)
        out[i] = static_cast<std::byte>(value & 0xff);
}

/// Reads `bytes` bytes, most significant first.
inline std::uint64_t get(const std::byte* in, int bytes) noexcept {
    std::uint64_t value = 0;
    for (int i = 0; i < bytes; ++i)
        value = value << 8 | static_cast<std::uint8_t>(in[i]);
    return value;
}

} // namespace rdmaxx::wire
