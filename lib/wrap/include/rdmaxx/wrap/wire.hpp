/// @file
/// Big-endian integers in byte buffers: the one encoding of every rdmaxx wire format
/// (remote descriptors, endpoint messages, connection control messages, RPC headers).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rdmaxx::wire {

namespace detail {
template <class T>
constexpr T big_endian(T value) noexcept {
    if constexpr (std::endian::native == std::endian::little)
        return std::byteswap(value);
    else
        return value;
}
} // namespace detail

/// Writes the low `bytes` bytes of `value` to out[0..bytes), most significant first.
/// (Every caller passes a constant: inlined, the widths of a machine word are one store.)
[[gnu::always_inline]] inline void put(std::byte* out, std::uint64_t value, int bytes) noexcept {
    switch (bytes) {
    case 2: {
        const auto v = detail::big_endian(static_cast<std::uint16_t>(value));
        std::memcpy(out, &v, 2);
        return;
    }
    case 4: {
        const auto v = detail::big_endian(static_cast<std::uint32_t>(value));
        std::memcpy(out, &v, 4);
        return;
    }
    case 8: {
        const auto v = detail::big_endian(value);
        std::memcpy(out, &v, 8);
        return;
    }
    default:
        for (int i = bytes - 1; i >= 0; --i, value >>= 8)
            out[i] = static_cast<std::byte>(value & 0xff);
    }
}

/// Reads `bytes` bytes, most significant first.
[[gnu::always_inline]] inline std::uint64_t get(const std::byte* in, int bytes) noexcept {
    switch (bytes) {
    case 2: {
        std::uint16_t v;
        std::memcpy(&v, in, 2);
        return detail::big_endian(v);
    }
    case 4: {
        std::uint32_t v;
        std::memcpy(&v, in, 4);
        return detail::big_endian(v);
    }
    case 8: {
        std::uint64_t v;
        std::memcpy(&v, in, 8);
        return detail::big_endian(v);
    }
    default: {
        std::uint64_t value = 0;
        for (int i = 0; i < bytes; ++i)
            value = value << 8 | static_cast<std::uint8_t>(in[i]);
        return value;
    }
    }
}

} // namespace rdmaxx::wire
