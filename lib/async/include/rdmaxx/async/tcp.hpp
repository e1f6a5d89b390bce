/// @file
/// Connecting async QPs over TCP without blocking the io_context: the same versioned
/// endpoint exchange as rdmaxx/ctrl/tcp.hpp (so an async side and a blocking side
/// connect to each other), through Asio's sockets and resolver (whose getaddrinfo runs
/// off the io_context's thread, as do the QPs' connects: towards a RoCE GID the peer
/// announced, RTR waits for its MAC, up to a second: rdmaxx/async/blocking.hpp).
/// Coroutines, since setup is not a hot path:
///
/// @code
/// auto link = co_await rdmaxx::async::connect(io.get_executor(), "10.0.0.1", 7471, qps, {});
/// // ... post receives, then:
/// co_await rdmaxx::async::confirm_ready(link->socket, timeout);
/// @endcode
///
/// Every step is bounded by ExchangeOptions::timeout; every byte from the peer is
/// checked by the endpoint codec (a malformed or hostile peer is an Error of kind
/// protocol, a silent one of kind timeout), and nothing here throws.
///
/// @threadsafety As the io_context (rdmaxx/async/completions.hpp). The QPs given to
/// connect() and accept() connect on a helper thread: nothing else may use them until
/// the call returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <rdmaxx/async/queue_pair.hpp>
#include <rdmaxx/ctrl/endpoint_codec.hpp>

namespace rdmaxx::async {

/// How connect() and accept() exchange endpoints and connect the QPs.
struct ExchangeOptions {
    /// the whole step: resolve, connect, exchange (accept(): from the client's arrival)
    std::chrono::milliseconds timeout{10'000};
    QpConnectOptions connect{};                ///< how RC/UC QPs connect (MTU, timeouts, retries)
    std::span<const std::byte> metadata{};     ///< sent with the endpoints (at most 1 MiB)
};

/// A TCP connection whose QPs are connected, and what the peer sent with them.
struct Exchanged {
    asio::ip::tcp::socket socket; ///< the connection, still open (confirm_ready() goes over it)
    EndpointMessage peer;         ///< the peer's endpoint message: its QPs and metadata
};

/// Resolves `host`, connects, exchanges endpoints and connects each of `qps` to its
/// counterpart (RC/UC: connect; UD: activate). The peer must offer as many QPs of the
/// same types.
/// @errors Resolving `host` (ENOENT), connecting (its errno); a peer that closes
/// mid-exchange, sends a malformed message or offers other QPs (protocol); nothing in
/// ExchangeOptions::timeout (timeout); connecting a QP (rdmaxx::QueuePair::connect's).
/// @misuse A null or moved-from QP; no QP or more than 256, metadata above 1 MiB
/// (endpoint_codec::encode).
asio::awaitable<Result<Exchanged>> connect(asio::any_io_executor executor, std::string host, std::uint16_t port,
                                           std::span<QueuePair* const> qps, ExchangeOptions options = {},
                                           std::source_location where = std::source_location::current());

/// The next client of `acceptor`, its endpoints exchanged and `qps` connected to them.
/// A client that stays silent, sends garbage or offers other QPs is an Error (the
/// caller goes on to the next: nothing else waits on it). The wait for a client has no
/// bound; ExchangeOptions::timeout bounds the exchange with it.
/// @errors Accepting (its errno); a client that stays silent (timeout), closes
/// mid-exchange, sends garbage or offers other QPs (protocol); connecting a QP.
/// @misuse A null or moved-from QP; no QP or more than 256, metadata above 1 MiB
/// (endpoint_codec::encode).
asio::awaitable<Result<Exchanged>> accept(asio::ip::tcp::acceptor& acceptor, std::span<QueuePair* const> qps,
                                          ExchangeOptions options = {},
                                          std::source_location where = std::source_location::current());

/// One byte each way once this side's receives are posted (TcpStream::ready_byte, as
/// the blocking side sends it): afterwards a SEND from either side finds a receive.
/// @errors Nothing from the peer within `timeout` (timeout); a peer that closed or
/// sent another byte (protocol); the socket's failure (its errno).
asio::awaitable<Result<void>> confirm_ready(asio::ip::tcp::socket& socket, std::chrono::milliseconds timeout);

} // namespace rdmaxx::async
