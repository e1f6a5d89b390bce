// One side of rdmaxx-copy's conversation on an async::Connection: protocol messages
// out of a registered buffer, in through a plain one, each decoded and checked.
//
// Thread safety: none (the io_context's thread). One say() and one hear() at a time.
#pragma once

#include <cstdlib>

#include <asio/awaitable.hpp>

#include <rdmaxx/async/connection.hpp>

#include "protocol.hpp"

namespace rdmaxx::copy {

// Receives each side posts: room for a window of max_depth immediates beside the
// messages (the library's default of 32 would make a deep window wait for credits).
inline constexpr std::uint32_t receive_depth = 2 * max_depth;

class Channel {
public:
    // Programming error: the connection's max_message below copy::max_message.
    static Result<Channel> open(async::Connection& connection);
    // g++ 12: pass a named Message, not a temporary built inside the co_await.
    asio::awaitable<Result<void>> say(const Message& message);
    // The next message, decoded; an immediate on a message is a protocol Error.
    asio::awaitable<Result<Message>> hear(std::chrono::milliseconds timeout);

private:
    Channel(async::Connection& connection, MemoryRegion out);
    async::Connection* connection_;
    MemoryRegion out_;
    std::vector<std::byte> encoded_;
    std::vector<std::byte> in_;
};

// An Error for a person: rdmaxx-copy's own say all in their detail; others whole.
std::string describe(const Error& error);

// "expected X, got Y" as a protocol Error.
Error unexpected_message(std::string_view expected, const Message& got);

// The bound of one wait that covers `bytes` (the connection's rule: timeout, plus
// timeout_per_mib for each MiB, started).
std::chrono::milliseconds bound_for(const ConnectionOptions& options, std::uint64_t bytes);

} // namespace rdmaxx::copy
