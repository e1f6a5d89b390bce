// Connecting async QPs over TCP without blocking the io_context: the same versioned
// endpoint exchange as rdmaxx/ctrl/tcp.hpp (so an async side and a blocking side
// connect to each other), through Asio's sockets and resolver (whose getaddrinfo runs
// off the io_context's thread). Coroutines, since setup is not a hot path:
//
//   auto link = co_await rdmaxx::async::connect(io.get_executor(), "10.0.0.1", 7471, qps, {});
//   // ... post receives, then:
//   co_await rdmaxx::async::confirm_ready(link->socket, timeout);
//
// Every step is bounded by ExchangeOptions::timeout; every byte from the peer is
// checked by the endpoint codec (a malformed or hostile peer is an Error of kind
// protocol, a silent one of kind timeout), and nothing here throws.
//
// Thread safety: as the io_context (rdmaxx/async/completions.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <rdmaxx/async/queue_pair.hpp>
#include <rdmaxx/ctrl/endpoint_codec.hpp>

namespace rdmaxx::async {

struct ExchangeOptions {
    std::chrono::milliseconds timeout{10'000}; // the whole step: resolve, connect, exchange
    QpConnectOptions connect{};
    std::span<const std::byte> metadata{};     // sent with the endpoints (at most 1 MiB)
};

// A TCP connection whose QPs are connected, and what the peer sent with them.
struct Exchanged {
    asio::ip::tcp::socket socket;
    EndpointMessage peer;
};

// Resolves `host`, connects, exchanges endpoints and connects each of `qps` to its
// counterpart (RC/UC: connect; UD: activate). The peer must offer as many QPs of the
// same types. Programming error: a null or moved-from QP.
asio::awaitable<Result<Exchanged>> connect(asio::any_io_executor executor, std::string host, std::uint16_t port,
                                           std::span<QueuePair* const> qps, ExchangeOptions options = {});

// The next client of `acceptor`, its endpoints exchanged and `qps` connected to them.
// A client that stays silent, sends garbage or offers other QPs is an Error (the
// caller goes on to the next: nothing else waits on it).
asio::awaitable<Result<Exchanged>> accept(asio::ip::tcp::acceptor& acceptor, std::span<QueuePair* const> qps,
                                          ExchangeOptions options = {});

// One byte each way once this side's receives are posted (TcpStream::ready_byte, as
// the blocking side sends it): afterwards a SEND from either side finds a receive.
asio::awaitable<Result<void>> confirm_ready(asio::ip::tcp::socket& socket, std::chrono::milliseconds timeout);

} // namespace rdmaxx::async
