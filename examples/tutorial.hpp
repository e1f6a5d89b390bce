// Shared by the examples: the tutorial's five scenarios (examples/server and
// examples/client, each side asserting what it got), and what every example needs.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string_view>

#include <fmt/format.h>

#include <rdmaxx/ctrl/connection.hpp>

namespace tutorial {

inline constexpr std::uint16_t default_port = 7471;
inline constexpr std::uint32_t greeting_imm = 42;
inline constexpr std::size_t region_size = 4096;

// The value of a Result, or a message and exit(1).
template <class T>
T must(rdmaxx::Result<T> result, std::string_view what) {
    if (!result) {
        fmt::print(stderr, "{}: {}\n", what, result.error());
        std::exit(1);
    }
    if constexpr (!std::is_void_v<T>)
        return std::move(*result);
}

// co_spawn's completion: a coroutine's exception (a socket's error, as use_awaitable
// throws it) leaves run() and ends the program with its message; asio::detached would
// swallow it.
inline void rethrow(std::exception_ptr thrown) {
    if (thrown)
        std::rethrow_exception(thrown);
}

inline void expect(bool ok, std::string_view what) {
    if (!ok) {
        fmt::print(stderr, "FAILED: {}\n", what);
        std::exit(1);
    }
    fmt::print("ok: {}\n", what);
}

// The bytes the client writes: byte i of the pattern is (i * 7 + seed) mod 251.
inline void fill(std::span<std::byte> bytes, unsigned seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<std::byte>((i * 7 + seed) % 251);
}

inline bool matches(std::span<const std::byte> bytes, unsigned seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i)
        if (bytes[i] != static_cast<std::byte>((i * 7 + seed) % 251))
            return false;
    return true;
}

inline bool zero(std::span<const std::byte> bytes) {
    for (std::byte b : bytes)
        if (b != std::byte{0})
            return false;
    return true;
}

// "[--host H] [--port P] [--transport tcp|cm]"
struct Address {
    std::string host = "127.0.0.1";
    std::uint16_t port = default_port;
    rdmaxx::ConnectionOptions options;
};
inline Address parse_address(int argc, char** argv) {
    Address a;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        const std::string_view value = argv[i + 1];
        if (flag == "--host")
            a.host = value;
        else if (flag == "--port")
            a.port = static_cast<std::uint16_t>(std::atoi(argv[i + 1]));
        else if (flag == "--transport" && (value == "tcp" || value == "cm"))
            a.options.transport = value == "cm" ? rdmaxx::Transport::rdma_cm : rdmaxx::Transport::tcp;
        else {
            fmt::print(stderr, "usage: {} [--host H] [--port P] [--transport tcp|cm]\n", argv[0]);
            std::exit(2);
        }
    }
    return a;
}

} // namespace tutorial
