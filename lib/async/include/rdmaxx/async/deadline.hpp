/// @file
/// Bounding a coroutine's Asio operation by a deadline, without exceptions: the one
/// helper lib/async's setup code (and lib/rpc's) uses for every step of an exchange.
///
/// @code
/// asio::steady_timer timer(executor, timeout);   // one deadline for several steps
/// auto [ec, n] = co_await rdmaxx::async::bounded(asio::async_read(socket, buffer, rdmaxx::async::no_throw), timer);
/// @endcode
///
/// @threadsafety As the io_context.
#pragma once

#include <system_error>
#include <tuple>
#include <utility>
#include <variant>

#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

namespace rdmaxx::async {

/// A completion token for coroutines that gives (error_code, values...) instead of throwing.
inline constexpr auto no_throw = asio::experimental::as_tuple(asio::use_awaitable);

/// `op` against the deadline of `timer`: what it completed with, or asio::error::timed_out
/// (the operation is then cancelled).
template <class Value>
asio::awaitable<std::pair<std::error_code, Value>> bounded(asio::awaitable<std::tuple<std::error_code, Value>> op,
                                                           asio::steady_timer& timer) {
    using namespace asio::experimental::awaitable_operators;
    auto result = co_await (std::move(op) || timer.async_wait(no_throw));
    if (result.index() == 1)
        co_return std::pair{std::error_code(asio::error::timed_out), Value{}};
    auto [ec, value] = std::get<0>(std::move(result));
    co_return std::pair{ec, std::move(value)};
}

} // namespace rdmaxx::async
