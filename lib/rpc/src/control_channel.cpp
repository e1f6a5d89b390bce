#include "control_channel.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string_view>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <asio/connect.hpp>
#include <asio/ip/address.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <fmt/format.h>

#include <rdmaxx/async/deadline.hpp>
#include <rdmaxx/async/error_code.hpp>

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::rpc::detail {

using asio::ip::tcp;
using async::bounded;
using async::no_throw;
using namespace asio::experimental::awaitable_operators;

namespace {

// An RDMA CM control connection: small messages, few of them (a session's handful,
// never more than four unread), no memory lent either way.
ConnectionOptions cm_options(std::chrono::milliseconds timeout) {
    ConnectionOptions o;
    o.transport = Transport::rdma_cm;
    o.max_message = cm_max_message;
    o.receive_depth = 4;
    o.max_send_wr = 2;
    o.timeout = timeout;
    o.quota_bytes = 0;
    o.access_ceiling = Access::none;
    o.lending = Lending::registration; // nothing is lent: no memory window probe per connection
    return o;
}

// The time left to `deadline` as a call's bound (a deadline passed: the least one); no
// deadline: a long bound the caller renews.
std::chrono::milliseconds left(Deadline deadline) {
    if (deadline == no_deadline)
        return std::chrono::hours(1);
    const auto now = std::chrono::steady_clock::now();
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline > now ? deadline - now : Deadline::duration{}));
}

// The channel's reads and writes name themselves so (their Error's call).
constexpr const char* channel_call = "rpc control connection";

// What a TCP operation's `ec` says, as an Error of `call` whose detail begins with
// `doing`: timed_out (a deadline passed) a timeout, operation_aborted (closed)
// cancelled, eof the peer's close (ECONNRESET, as lib/ctrl and lib/async name it), else
// the errno.
Error tcp_error(std::error_code ec, const char* call, std::string_view doing) {
    if (ec == asio::error::timed_out)
        return Error::timeout(call, fmt::format("{}: no answer in time", doing));
    if (ec == asio::error::operation_aborted)
        return Error::cancelled(call, std::string(doing));
    if (ec == asio::error::eof)
        return Error::from_errno(call, ECONNRESET, fmt::format("{}: the peer closed the connection", doing));
    return Error::from_errno(call, async::errno_of(ec), fmt::format("{}: {}", doing, ec.message()));
}

Error closed(std::string_view doing) { return Error::cancelled(channel_call, fmt::format("{}: closed", doing)); }

// `op`, unless `closed` is cancelled first or `open` is false once it ends (the channel
// or listener closed): nullopt then. Whoever calls keeps `closed` and `open` alive.
template <class T>
asio::awaitable<std::optional<T>> unless_closed(asio::awaitable<T> op, asio::steady_timer& closed, const bool& open) {
    auto woken = co_await (std::move(op) || closed.async_wait(no_throw));
    if (woken.index() == 1 || !open)
        co_return std::nullopt;
    co_return std::optional<T>(std::move(std::get<0>(woken)));
}

// A TCP operation by `deadline` (none: unbounded).
template <class Value>
asio::awaitable<std::pair<std::error_code, Value>> by(asio::awaitable<std::tuple<std::error_code, Value>> op,
                                                      Deadline deadline, tcp::socket& socket) {
    if (deadline == no_deadline) {
        auto [ec, value] = co_await std::move(op);
        co_return std::pair{ec, std::move(value)};
    }
    asio::steady_timer timer(socket.get_executor(), deadline);
    co_return co_await bounded(std::move(op), timer);
}

} // namespace

Error setup_error(const Error& e, const char* call, std::string_view doing) {
    return Error(e.kind(), call, e.code(), fmt::format("{}: {}", doing, e.message()));
}

// ---------------------------------------------------------------------------------
// ControlChannel

// RDMA CM: the connection, the registered memory a write sends from (its own, not the
// connection's pool, whose first use registers an arena of megabytes; declared so that
// the region goes first, then the connection, then the memory), and what the last
// message brought that no read has taken yet.
struct CmLink {
    std::array<std::byte, cm_max_message> send_memory{};
    std::optional<async::Connection> connection;
    std::optional<MemoryRegion> send_region;
    std::array<std::byte, cm_max_message> received{};
    std::size_t received_bytes = 0;
    std::size_t taken = 0;
};

struct ControlChannel::State {
    explicit State(tcp::socket socket)
        : link(std::move(socket)), closed(std::get<tcp::socket>(link).get_executor(), Deadline::max()) {}
    explicit State(Executor executor) : link(std::in_place_type<CmLink>), closed(executor, Deadline::max()) {}
    std::variant<tcp::socket, CmLink> link;
    asio::steady_timer closed; // never expires; close() cancels it, waking RDMA CM's waits
    bool open = true;
};

namespace {

using State = ControlChannel::State;

// The bytes of one message after another; a message's bytes beyond the read wait for
// the next read. A wait without a deadline is renewed.
asio::awaitable<Result<void>> read_cm(std::shared_ptr<State> state, std::span<std::byte> into, Deadline deadline) {
    CmLink& cm = std::get<CmLink>(state->link);
    std::size_t filled = 0;
    while (filled < into.size()) {
        if (cm.taken < cm.received_bytes) {
            const std::size_t n = std::min(into.size() - filled, cm.received_bytes - cm.taken);
            std::memcpy(into.data() + filled, cm.received.data() + cm.taken, n);
            cm.taken += n;
            filled += n;
            continue;
        }
        auto got = co_await unless_closed(cm.connection->receive(cm.received, left(deadline)), state->closed,
                                          state->open);
        if (!got)
            co_return std::unexpected(closed("reading"));
        if (!*got) {
            if (got->error().is_timeout() && deadline == no_deadline)
                continue;
            co_return std::unexpected(std::move(got->error()));
        }
        cm.received_bytes = (*got)->size;
        cm.taken = 0;
    }
    co_return Result<void>{};
}

// Messages of at most cm_max_message bytes, each delivered before the next goes.
asio::awaitable<Result<void>> write_cm(std::shared_ptr<State> state, std::span<const std::byte> bytes,
                                       Deadline deadline) {
    CmLink& cm = std::get<CmLink>(state->link);
    for (std::size_t at = 0; at < bytes.size();) {
        const std::size_t n = std::min<std::size_t>(cm_max_message, bytes.size() - at);
        std::memcpy(cm.send_memory.data(), bytes.data() + at, n);
        for (;;) {
            auto sent = co_await unless_closed(cm.connection->send(cm.send_region->slice(0, n), left(deadline)),
                                               state->closed, state->open);
            if (!sent)
                co_return std::unexpected(closed("writing"));
            if (*sent)
                break;
            if (sent->error().is_timeout() && deadline == no_deadline)
                continue; // no room for an hour: the peer does not take its messages, yet lives
            co_return std::unexpected(std::move(sent->error()));
        }
        at += n;
    }
    co_return Result<void>{};
}

asio::awaitable<Result<void>> read_on(std::shared_ptr<State> state, std::span<std::byte> into, Deadline deadline) {
    if (!state->open)
        co_return std::unexpected(closed("reading"));
    if (std::holds_alternative<CmLink>(state->link))
        co_return co_await read_cm(state, into, deadline);
    auto& socket = std::get<tcp::socket>(state->link);
    auto [ec, n] = co_await by(asio::async_read(socket, asio::buffer(into.data(), into.size()), no_throw), deadline,
                               socket);
    if (ec)
        co_return std::unexpected(tcp_error(ec, channel_call, "reading"));
    co_return Result<void>{};
}

asio::awaitable<Result<void>> write_on(std::shared_ptr<State> state, std::span<const std::byte> bytes,
                                       Deadline deadline) {
    if (!state->open)
        co_return std::unexpected(closed("writing"));
    if (std::holds_alternative<CmLink>(state->link))
        co_return co_await write_cm(state, bytes, deadline);
    auto& socket = std::get<tcp::socket>(state->link);
    auto [ec, n] = co_await by(asio::async_write(socket, asio::buffer(bytes.data(), bytes.size()), no_throw),
                               deadline, socket);
    if (ec)
        co_return std::unexpected(tcp_error(ec, channel_call, "writing"));
    co_return Result<void>{};
}

} // namespace

ControlChannel::ControlChannel(tcp::socket socket) : state_(std::make_shared<State>(std::move(socket))) {
    // each message is written whole and then awaited: Nagle's wait for the peer's
    // (delayed) ACK would hold a message written behind another for tens of ms
    std::error_code ignored;
    std::get<tcp::socket>(state_->link).set_option(tcp::no_delay(true), ignored);
}

void ControlChannel::watch_peer(std::chrono::milliseconds silence) noexcept {
    auto* socket = std::get_if<tcp::socket>(&state_->link);
    if (socket == nullptr)
        return;
    const auto seconds = [](std::chrono::milliseconds span) {
        return static_cast<int>(std::clamp<std::int64_t>(span.count() / 1000, 1, 32767));
    };
    const int fd = socket->native_handle();
    const int on = 1, idle = seconds(silence / 3), interval = seconds(silence / 6), probes = 4;
    const auto user_timeout = static_cast<unsigned>(std::clamp<std::int64_t>(silence.count(), 1, INT32_MAX));
    // best effort: a socket that refuses them still works, as before
    (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

bool ControlChannel::over_tcp() const noexcept { return std::holds_alternative<tcp::socket>(state_->link); }

std::string ControlChannel::peer_host() const {
    if (const auto* socket = std::get_if<tcp::socket>(&state_->link)) {
        asio::error_code ec;
        const auto endpoint = socket->remote_endpoint(ec);
        if (ec)
            return {};
        return rdmaxx::peer_host(fmt::format("{}:{}", endpoint.address().to_string(), endpoint.port()));
    }
    if (const CmLink& cm = std::get<CmLink>(state_->link); cm.connection)
        return rdmaxx::peer_host(cm.connection->peer_address()); // numeric "address:port": a listener's client
    return {};
}

Result<ControlChannel> ControlChannel::over(Executor executor, async::Connection connection) {
    auto state = std::make_shared<State>(executor);
    CmLink& cm = std::get<CmLink>(state->link);
    auto region = connection.register_local_mr(cm.send_memory, Access::none);
    if (!region)
        return std::unexpected(std::move(region.error()));
    cm.connection.emplace(std::move(connection));
    cm.send_region.emplace(std::move(*region));
    return ControlChannel(std::move(state));
}

asio::awaitable<Result<ControlChannel>> ControlChannel::connect(Executor executor, Transport transport,
                                                                std::string host, std::uint16_t port,
                                                                Deadline deadline, const char* call,
                                                                std::weak_ptr<State> sibling) {
    const std::string peer = fmt::format("{}:{}", host, port);
    if (transport == Transport::rdma_cm) {
        const std::shared_ptr<State> shared = sibling.lock();
        Result<async::Connection> connection = std::unexpected(Error::cancelled(call)); // (g++ 12: no co_await in ?:)
        if (shared)
            connection =
                co_await std::get<CmLink>(shared->link).connection->connect_another(host, port, left(deadline));
        // no sibling, or the address is reached through another device than the sibling's
        if (!shared || (!connection && connection.error().is_errno(EXDEV))) {
            const ConnectionOptions own = cm_options(left(deadline));
            connection = co_await async::Connection::connect(executor, std::move(host), port, own);
        }
        if (!connection)
            co_return std::unexpected(
                setup_error(connection.error(), call, fmt::format("connecting to {} over RDMA CM", peer)));
        co_return over(executor, std::move(*connection));
    }
    tcp::resolver resolver(executor);
    tcp::socket socket(executor);
    asio::steady_timer timer(executor, deadline);
    auto [rec, addresses] = co_await bounded(resolver.async_resolve(host, std::to_string(port), no_throw), timer);
    if (rec)
        co_return std::unexpected(tcp_error(rec, call, fmt::format("resolving {}", peer)));
    if (auto [ec, at] = co_await bounded(asio::async_connect(socket, addresses, no_throw), timer); ec)
        co_return std::unexpected(tcp_error(ec, call, fmt::format("connecting to {}", peer)));
    co_return ControlChannel(std::move(socket));
}

asio::awaitable<Result<void>> ControlChannel::read(std::span<std::byte> into, Deadline deadline) {
    return read_on(state_, into, deadline);
}

asio::awaitable<Result<void>> ControlChannel::write(std::span<const std::byte> bytes, Deadline deadline) {
    return write_on(state_, bytes, deadline);
}

std::weak_ptr<ControlChannel::State> ControlChannel::as_sibling() const {
    return std::holds_alternative<CmLink>(state_->link) ? std::weak_ptr<State>(state_) : std::weak_ptr<State>();
}

void ControlChannel::close() noexcept {
    state_->open = false;
    if (auto* socket = std::get_if<tcp::socket>(&state_->link)) {
        std::error_code ignored;
        socket->close(ignored);
    }
    state_->closed.cancel(); // an RDMA CM read or write in flight ends (ours: nothing posted, or the connection goes)
}

// ---------------------------------------------------------------------------------
// ControlListener

ControlListener::ControlListener(ControlChannel::Executor executor, tcp::acceptor acceptor)
    : executor_(executor), link_(std::move(acceptor)), closed_(executor, Deadline::max()) {}

ControlListener::ControlListener(ControlChannel::Executor executor, async::Listener listener)
    : executor_(executor), link_(std::move(listener)), closed_(executor, Deadline::max()) {}

Result<std::shared_ptr<ControlListener>> ControlListener::listen(ControlChannel::Executor executor,
                                                                 Transport transport, const std::string& address,
                                                                 std::uint16_t port,
                                                                 std::chrono::milliseconds setup_timeout) {
    constexpr const char* call = "rpc::Endpoint::create";
    if (transport == Transport::rdma_cm) {
        auto listener = async::Listener::listen(executor, address, port, cm_options(setup_timeout));
        if (!listener)
            return std::unexpected(std::move(listener.error()));
        return std::make_shared<ControlListener>(executor, std::move(*listener));
    }
    std::error_code ec;
    const auto ip = asio::ip::make_address(address, ec);
    if (ec)
        return std::unexpected(
            Error::from_errno(call, EINVAL, fmt::format("listen address {}: {}", address, ec.message())));
    tcp::acceptor acceptor(executor);
    const tcp::endpoint at(ip, port);
    if (acceptor.open(at.protocol(), ec); !ec)
        if (acceptor.set_option(asio::socket_base::reuse_address(true), ec); !ec)
            if (acceptor.bind(at, ec); !ec)
                acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
        return std::unexpected(
            Error::from_errno(call, async::errno_of(ec), fmt::format("listening on {}:{}", address, port)));
    return std::make_shared<ControlListener>(executor, std::move(acceptor));
}

asio::awaitable<Result<ControlChannel>> ControlListener::accept() {
    constexpr const char* call = "rpc::Endpoint's listener";
    const auto closed_now = [] { return Error::cancelled(call, "the listener closed"); };
    if (!open_)
        co_return std::unexpected(closed_now());
    if (auto* acceptor = std::get_if<tcp::acceptor>(&link_)) {
        auto [ec, socket] = co_await acceptor->async_accept(no_throw);
        if (!open_)
            co_return std::unexpected(closed_now());
        if (!ec) {
            backoff_.succeeded();
            co_return ControlChannel(std::move(socket));
        }
        // rather than spin, till the setups in progress end (tcp.hpp)
        if (const auto rest = backoff_.failed(async::errno_of(ec)); rest.count() > 0) {
            asio::steady_timer paused(executor_, rest);
            (void)co_await unless_closed(paused.async_wait(no_throw), closed_, open_);
        }
        co_return std::unexpected(tcp_error(ec, call, "accepting"));
    }
    auto& listener = std::get<async::Listener>(link_);
    for (;;) {
        auto connection = co_await unless_closed(listener.accept(std::chrono::hours(1)), closed_, open_);
        if (!connection)
            co_return std::unexpected(closed_now());
        if (!*connection && connection->error().is_timeout())
            continue;
        if (!*connection)
            co_return std::unexpected(std::move(connection->error()));
        co_return ControlChannel::over(executor_, std::move(**connection));
    }
}

void ControlListener::close() noexcept {
    open_ = false;
    if (auto* acceptor = std::get_if<tcp::acceptor>(&link_)) {
        std::error_code ignored;
        acceptor->close(ignored);
    }
    closed_.cancel();
}

} // namespace rdmaxx::rpc::detail
