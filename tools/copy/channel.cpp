#include "channel.hpp"

#include <cstring>

#include <fmt/format.h>

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them), as examples/kv notes.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::copy {

Channel::Channel(async::Connection& connection, MemoryRegion out)
    : connection_(&connection), out_(std::move(out)), in_(max_message) {}

Result<Channel> Channel::open(async::Connection& connection) {
    auto out = connection.alloc_local_mr(max_message, Access::local_write);
    if (!out)
        return std::unexpected(out.error());
    return Channel(connection, std::move(*out));
}

asio::awaitable<Result<void>> Channel::say(const Message& message) {
    encode(message, encoded_);
    std::memcpy(out_.data(), encoded_.data(), encoded_.size());
    const LocalSlice slice = out_.slice(0, encoded_.size());
    co_return co_await connection_->send(slice);
}

asio::awaitable<Result<Message>> Channel::hear(std::chrono::milliseconds timeout) {
    const Timeout bound = timeout;
    auto got = co_await connection_->receive(std::span(in_), bound);
    if (!got)
        co_return std::unexpected(got.error());
    if (got->imm)
        co_return std::unexpected(Error::protocol("rdmaxx-copy", "a message with an immediate"));
    co_return decode(std::span<const std::byte>(in_).first(got->size));
}

std::string describe(const Error& error) {
    if (std::string_view(error.call()) == "rdmaxx-copy" && !error.detail().empty())
        return error.detail();
    return error.message();
}

Error unexpected_message(std::string_view expected, const Message& got) {
    if (const auto* e = std::get_if<SessionError>(&got))
        return Error::from_errno("rdmaxx-copy", static_cast<int>(e->code), fmt::format("the server: {}", e->text));
    return Error::protocol("rdmaxx-copy", fmt::format("expected {}, got a {} message", expected,
                                                      type_name(static_cast<Type>(got.index() + 1))));
}

std::chrono::milliseconds bound_for(const ConnectionOptions& options, std::uint64_t bytes) {
    const std::uint64_t mib = (bytes + (1 << 20) - 1) >> 20;
    return options.timeout + options.timeout_per_mib * static_cast<std::int64_t>(mib);
}

} // namespace rdmaxx::copy
