// async::connect's exchange for verbs QPs that no async::QueuePair wraps (the QP of an
// async::Connection, which its own driver completes).
#pragma once

#include <source_location>

#include <string>
#include <vector>

#include <rdmaxx/async/tcp.hpp>

namespace rdmaxx::async::detail {

// As async::connect; `qps` are not null. ExchangeOptions::metadata must stay valid
// until the coroutine completes.
asio::awaitable<Result<Exchanged>> connect_verbs(asio::any_io_executor executor, std::string host, std::uint16_t port,
                                                 std::vector<rdmaxx::QueuePair*> qps, ExchangeOptions options,
                                                 std::source_location where = std::source_location::current());
// "address:port" of the socket's peer, for messages.
std::string peer_name(const asio::ip::tcp::socket& socket);

} // namespace rdmaxx::async::detail
