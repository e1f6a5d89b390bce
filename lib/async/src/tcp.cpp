#include <rdmaxx/async/tcp.hpp>
#include <rdmaxx/async/blocking.hpp>
#include <rdmaxx/async/deadline.hpp>
#include <rdmaxx/async/error_code.hpp>
#include "exchange.hpp"
#include <rdmaxx/ctrl/tcp.hpp>

#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <asio/connect.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <fmt/format.h>

namespace rdmaxx::async {

namespace {

using asio::ip::tcp;

// An Asio failure of `call` as rdmaxx's Error: a deadline is a timeout, a peer that
// closed or reset mid-message a protocol error, anything else its errno.
Error error_of(std::error_code ec, const char* call, std::string_view doing, const std::string& peer) {
    if (ec == asio::error::timed_out)
        return Error::timeout(call, fmt::format("{} {}: no answer in time", doing, peer));
    if (ec == asio::error::eof || ec == asio::error::connection_reset)
        return Error::protocol(call, fmt::format("{} {}: the peer closed the connection", doing, peer));
    return Error::from_errno(call, errno_of(ec), fmt::format("{} {}: {}", doing, peer, ec.message()));
}

std::string describe(const tcp::socket& socket) {
    std::error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    return ec ? std::string("peer") : fmt::format("{}:{}", peer.address().to_string(), peer.port());
}

// Our endpoints out, the peer's in (checked by the codec), then each QP connected.
asio::awaitable<Result<EndpointMessage>> exchange(tcp::socket& socket, asio::steady_timer& timer,
                                                  std::vector<rdmaxx::QueuePair*> qps, const ExchangeOptions& options,
                                                  const char* call, std::source_location where) {
    const std::string peer = describe(socket);
    EndpointMessage mine;
    for (rdmaxx::QueuePair* qp : qps)
        mine.qps.push_back({.endpoint = qp->endpoint(), .type = qp->type()});
    mine.metadata.assign(options.metadata.begin(), options.metadata.end());
    const std::vector<std::byte> out = endpoint_codec::encode(mine, where);
    if (auto [ec, n] = co_await bounded(asio::async_write(socket, asio::buffer(out), no_throw), timer); ec)
        co_return std::unexpected(error_of(ec, call, "sending our endpoints to", peer));

    std::vector<std::byte> in(endpoint_codec::header_size);
    if (auto [ec, n] = co_await bounded(asio::async_read(socket, asio::buffer(in), no_throw), timer); ec)
        co_return std::unexpected(error_of(ec, call, "reading the endpoints of", peer));
    auto body = endpoint_codec::body_length(std::span<const std::byte, endpoint_codec::header_size>(in));
    if (!body)
        co_return std::unexpected(std::move(body.error()));
    in.resize(endpoint_codec::header_size + *body);
    if (auto [ec, n] = co_await bounded(
            asio::async_read(socket, asio::buffer(in.data() + endpoint_codec::header_size, *body), no_throw), timer);
        ec)
        co_return std::unexpected(error_of(ec, call, "reading the endpoints of", peer));
    auto theirs = endpoint_codec::decode(in);
    if (!theirs)
        co_return std::unexpected(std::move(theirs.error()));

    if (theirs->qps.size() != qps.size())
        co_return std::unexpected(Error::protocol(
            call, fmt::format("peer {} offers {} QPs, we have {}", peer, theirs->qps.size(), qps.size())));
    for (std::size_t i = 0; i < qps.size(); ++i)
        if (theirs->qps[i].type != qps[i]->type())
            co_return std::unexpected(Error::protocol(call, fmt::format("QP {}: peer {}'s is {}, ours is {}", i, peer,
                                                                        to_string(theirs->qps[i].type),
                                                                        to_string(qps[i]->type()))));
    // towards the peer's word: RTR resolves its GID's MAC, up to a second's wait
    // (blocking.hpp); the QPs are the caller's, untouched by anything else meanwhile
    auto connect_all = [&]() -> Result<void> {
        for (std::size_t i = 0; i < qps.size(); ++i) {
            rdmaxx::QueuePair& qp = *qps[i];
            auto up = qp.type() == QpType::ud ? qp.activate(where)
                                              : qp.connect(theirs->qps[i].endpoint, options.connect, where);
            if (!up)
                return up;
        }
        return {};
    };
    auto connected = co_await run_blocking(connect_all, call);
    if (!connected)
        co_return std::unexpected(std::move(connected.error()));
    co_return std::move(*theirs);
}

std::vector<rdmaxx::QueuePair*> verbs_qps(std::span<QueuePair* const> qps, std::source_location where) {
    std::vector<rdmaxx::QueuePair*> raw;
    for (QueuePair* qp : qps) {
        require(qp != nullptr, where, "a null async::QueuePair to connect");
        raw.push_back(&qp->get(where));
    }
    return raw;
}

} // namespace

std::string detail::peer_name(const asio::ip::tcp::socket& socket) { return describe(socket); }

asio::awaitable<Result<Exchanged>> connect(asio::any_io_executor executor, std::string host, std::uint16_t port,
                                           std::span<QueuePair* const> qps, ExchangeOptions options,
                                           std::source_location where) {
    return detail::connect_verbs(std::move(executor), std::move(host), port, verbs_qps(qps, where), options, where);
}

asio::awaitable<Result<Exchanged>> detail::connect_verbs(asio::any_io_executor executor, std::string host,
                                                         std::uint16_t port, std::vector<rdmaxx::QueuePair*> qps,
                                                         ExchangeOptions options, std::source_location where) {
    asio::steady_timer timer(executor, options.timeout);
    const std::string target = fmt::format("{}:{}", host, port);
    tcp::resolver resolver(executor);
    auto [rec, addresses] = co_await bounded(resolver.async_resolve(host, std::to_string(port), no_throw), timer);
    if (rec)
        co_return std::unexpected(rec == asio::error::timed_out
                                      ? error_of(rec, "getaddrinfo", "resolving", target)
                                      : Error::from_errno("getaddrinfo", ENOENT, fmt::format("{}: {}", target, rec.message())));
    tcp::socket socket(executor);
    if (auto [ec, endpoint] = co_await bounded(asio::async_connect(socket, addresses, no_throw), timer); ec)
        co_return std::unexpected(error_of(ec, "connect", "connecting to", target));
    std::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto peer = co_await exchange(socket, timer, std::move(qps), options, "async::connect", where);
    if (!peer)
        co_return std::unexpected(std::move(peer.error()));
    co_return Exchanged{std::move(socket), std::move(*peer)};
}

asio::awaitable<Result<Exchanged>> accept(tcp::acceptor& acceptor, std::span<QueuePair* const> qps,
                                          ExchangeOptions options, std::source_location where) {
    auto [ec, socket] = co_await acceptor.async_accept(no_throw);
    if (ec)
        co_return std::unexpected(error_of(ec, "accept", "accepting on", "the listener"));
    asio::steady_timer timer(acceptor.get_executor(), options.timeout);
    std::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto peer = co_await exchange(socket, timer, verbs_qps(qps, where), options, "async::accept", where);
    if (!peer)
        co_return std::unexpected(std::move(peer.error()));
    co_return Exchanged{std::move(socket), std::move(*peer)};
}

asio::awaitable<Result<void>> confirm_ready(tcp::socket& socket, std::chrono::milliseconds timeout) {
    asio::steady_timer timer(socket.get_executor(), timeout);
    const std::string peer = describe(socket);
    std::byte byte = TcpStream::ready_byte;
    if (auto [ec, n] = co_await bounded(asio::async_write(socket, asio::buffer(&byte, 1), no_throw), timer); ec)
        co_return std::unexpected(error_of(ec, "confirm_ready", "telling", peer));
    if (auto [ec, n] = co_await bounded(asio::async_read(socket, asio::buffer(&byte, 1), no_throw), timer); ec)
        co_return std::unexpected(error_of(ec, "confirm_ready", "waiting for", peer));
    if (byte != TcpStream::ready_byte)
        co_return std::unexpected(Error::protocol(
            "confirm_ready", fmt::format("peer {} sent {:#x}, not the ready byte", peer, static_cast<unsigned>(byte))));
    co_return Result<void>{};
}

} // namespace rdmaxx::async
