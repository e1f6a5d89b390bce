#include <rdmaxx/ctrl/tcp.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <rdmaxx/wrap/deadline.hpp>

#include "resolve.hpp"

namespace rdmaxx {
namespace {

// Waits until `fd` is ready for `events` or the deadline passes.
Result<void> wait_fd(int fd, short events, Clock::time_point deadline, const char* call, const std::string& peer) {
    for (;;) {
        pollfd pfd{.fd = fd, .events = events, .revents = 0};
        const int n = ::poll(&pfd, 1, poll_timeout_until(deadline));
        if (n > 0)
            return {};
        if (n == 0) {
            if (Clock::now() >= deadline)
                return std::unexpected(Error::timeout(call, fmt::format("peer {} did not answer in time", peer)));
            continue; // poll's longest wait (INT_MAX ms) ended before the deadline
        }
        if (errno != EINTR)
            return std::unexpected(Error::from_last_errno("poll", "{}", peer));
    }
}

bool set_nonblocking(int fd) {
    const int flags = fcntl(fd, F_GETFL);
    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

} // namespace

Result<TcpStream> TcpStream::connect(std::string_view host, std::uint16_t port, std::chrono::milliseconds timeout) {
    const auto deadline = deadline_after(timeout);
    const std::string peer = fmt::format("{}:{}", host, port);
    auto addresses = detail::resolve_host(host, port, AF_UNSPEC, false, deadline);
    if (!addresses)
        return std::unexpected(std::move(addresses.error()));
    Error last = Error::from_errno("connect", EHOSTUNREACH, peer);
    for (const detail::SocketAddress& a : *addresses) {
        TcpStream stream(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0), peer);
        if (stream.fd_ < 0 || !set_nonblocking(stream.fd_))
            return std::unexpected(Error::from_last_errno("socket", "{}", peer));
        if (::connect(stream.fd_, a.get(), a.length) != 0) {
            if (errno != EINPROGRESS) {
                last = Error::from_last_errno("connect", "{}", peer);
                continue;
            }
            if (auto ready = wait_fd(stream.fd_, POLLOUT, deadline, "connect", peer); !ready)
                return std::unexpected(std::move(ready.error()));
            int error = 0;
            socklen_t len = sizeof error;
            if (::getsockopt(stream.fd_, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
                last = Error::from_errno("connect", error != 0 ? error : errno, peer);
                continue;
            }
        }
        const int one = 1;
        ::setsockopt(stream.fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return stream;
    }
    return std::unexpected(std::move(last));
}

TcpStream::TcpStream(TcpStream&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), peer_(std::move(other.peer_)) {}

TcpStream& TcpStream::operator=(TcpStream&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0)
            ::close(fd_);
        fd_ = std::exchange(other.fd_, -1);
        peer_ = std::move(other.peer_);
    }
    return *this;
}

TcpStream::~TcpStream() {
    if (fd_ >= 0)
        ::close(fd_);
}

Result<void> TcpStream::write_all(std::span<const std::byte> bytes, Clock::time_point deadline) {
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
        if (n > 0) {
            done += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (auto ready = wait_fd(fd_, POLLOUT, deadline, "send", peer_); !ready)
                return ready;
            continue;
        }
        return std::unexpected(Error::from_last_errno("send", "{}", peer_));
    }
    return {};
}

Result<void> TcpStream::read_exact(std::span<std::byte> bytes, Clock::time_point deadline) {
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::recv(fd_, bytes.data() + done, bytes.size() - done, 0);
        if (n > 0) {
            done += static_cast<std::size_t>(n);
            continue;
        }
        if (n == 0)
            return std::unexpected(Error::from_errno(
                "recv", ECONNRESET,
                fmt::format("peer {} closed the connection after {} of {} bytes", peer_, done, bytes.size())));
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (auto ready = wait_fd(fd_, POLLIN, deadline, "recv", peer_); !ready)
                return ready;
            continue;
        }
        return std::unexpected(Error::from_last_errno("recv", "{}", peer_));
    }
    return {};
}

Result<EndpointMessage> TcpStream::exchange(const EndpointMessage& mine, std::chrono::milliseconds timeout,
                                            std::source_location where) {
    const auto deadline = deadline_after(timeout);
    if (auto sent = write_all(endpoint_codec::encode(mine, where), deadline); !sent)
        return std::unexpected(std::move(sent.error()));
    std::vector<std::byte> message(endpoint_codec::header_size);
    if (auto got = read_exact(message, deadline); !got)
        return std::unexpected(std::move(got.error()));
    auto body = endpoint_codec::body_length(std::span(message).first<endpoint_codec::header_size>());
    if (!body)
        return std::unexpected(std::move(body.error()));
    message.resize(endpoint_codec::header_size + *body);
    if (auto got = read_exact(std::span(message).subspan(endpoint_codec::header_size), deadline); !got)
        return std::unexpected(std::move(got.error()));
    return endpoint_codec::decode(message);
}

Result<void> TcpStream::confirm_ready(std::chrono::milliseconds timeout) {
    const auto deadline = deadline_after(timeout);
    if (auto sent = write_all(std::span(&ready_byte, 1), deadline); !sent)
        return sent;
    std::byte answer{};
    if (auto got = read_exact(std::span(&answer, 1), deadline); !got)
        return got;
    if (answer != ready_byte)
        return std::unexpected(Error::protocol("confirm_ready", fmt::format("peer {} sent {:#x}, not the ready byte",
                                                                            peer_, static_cast<unsigned>(answer))));
    return {};
}

TcpStream TcpStream::adopt(int fd, std::string peer, std::source_location where) {
    require(fd >= 0 && set_nonblocking(fd), where, "TcpStream::adopt of fd {}: not an open file descriptor", fd);
    return TcpStream(fd, std::move(peer));
}

Result<TcpListener> TcpListener::listen(std::string_view host, std::uint16_t port, int backlog) {
    auto addresses = detail::resolve_host(host, port, AF_UNSPEC, true, Clock::now() + detail::listen_lookup_bound);
    if (!addresses)
        return std::unexpected(std::move(addresses.error()));
    Error last = Error::from_errno("bind", EADDRNOTAVAIL, fmt::format("{}:{}", host, port));
    for (const detail::SocketAddress& a : *addresses) {
        TcpListener listener(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
        if (listener.fd_ < 0 || !set_nonblocking(listener.fd_))
            return std::unexpected(Error::from_last_errno("socket"));
        const int one = 1;
        ::setsockopt(listener.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(listener.fd_, a.get(), a.length) != 0) {
            last = Error::from_last_errno("bind", "{}:{}", host, port);
            continue;
        }
        if (::listen(listener.fd_, backlog) != 0) {
            last = Error::from_last_errno("listen", "{}:{}", host, port);
            continue;
        }
        sockaddr_storage bound{};
        socklen_t len = sizeof bound;
        ::getsockname(listener.fd_, reinterpret_cast<sockaddr*>(&bound), &len);
        listener.port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
        return listener;
    }
    return std::unexpected(std::move(last));
}

TcpListener::TcpListener(TcpListener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

TcpListener& TcpListener::operator=(TcpListener&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0)
            ::close(fd_);
        fd_ = std::exchange(other.fd_, -1);
        port_ = other.port_;
    }
    return *this;
}

TcpListener::~TcpListener() {
    if (fd_ >= 0)
        ::close(fd_);
}

Result<TcpStream> TcpListener::accept(std::chrono::milliseconds timeout) {
    const auto deadline = deadline_after(timeout);
    for (;;) {
        sockaddr_storage from{};
        socklen_t len = sizeof from;
        const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            char host[NI_MAXHOST] = "?", service[NI_MAXSERV] = "?";
            ::getnameinfo(reinterpret_cast<sockaddr*>(&from), len, host, sizeof host, service, sizeof service,
                          NI_NUMERICHOST | NI_NUMERICSERV);
            const int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return TcpStream(fd, fmt::format("{}:{}", host, service));
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return std::unexpected(Error::from_last_errno("accept"));
        if (auto ready = wait_fd(fd_, POLLIN, deadline, "accept", "any client"); !ready)
            return std::unexpected(std::move(ready.error()));
    }
}

std::chrono::milliseconds AcceptBackoff::failed(int error) noexcept {
    using std::chrono::milliseconds;
    if (error != EMFILE && error != ENFILE && error != ENOBUFS && error != ENOMEM)
        return milliseconds(0);
    rest_ = std::clamp<milliseconds>(2 * rest_, milliseconds(10), milliseconds(1000));
    return rest_;
}

Result<EndpointMessage> connect_over_tcp(TcpStream& stream, std::span<QueuePair* const> qps,
                                         std::span<const std::byte> metadata, const QpConnectOptions& options,
                                         std::chrono::milliseconds timeout, std::source_location where) {
    EndpointMessage mine;
    for (QueuePair* qp : qps) {
        require(qp != nullptr, where, "a null QueuePair in connect_over_tcp");
        mine.qps.push_back({.endpoint = qp->endpoint(), .type = qp->type()});
    }
    mine.metadata.assign(metadata.begin(), metadata.end());
    auto peer = stream.exchange(mine, timeout, where);
    if (!peer)
        return peer;
    if (peer->qps.size() != qps.size())
        return std::unexpected(Error::protocol(
            "connect_over_tcp", fmt::format("peer {} offers {} QPs, we have {}", stream.peer(), peer->qps.size(),
                                            qps.size())));
    for (std::size_t i = 0; i < qps.size(); ++i) {
        if (peer->qps[i].type != qps[i]->type())
            return std::unexpected(Error::protocol(
                "connect_over_tcp", fmt::format("QP {}: peer's is {}, ours is {}", i, to_string(peer->qps[i].type),
                                                to_string(qps[i]->type()))));
        auto connected = qps[i]->type() == QpType::ud ? qps[i]->activate(where)
                                                      : qps[i]->connect(peer->qps[i].endpoint, options, where);
        if (!connected)
            return std::unexpected(std::move(connected.error()));
    }
    return peer;
}

std::string peer_host(std::string_view numeric_address_port) {
    std::string_view numeric = numeric_address_port.substr(0, numeric_address_port.rfind(':'));
    const std::string address(numeric.substr(0, numeric.find('%'))); // a link-local address's interface
    in_addr v4{};
    if (::inet_pton(AF_INET, address.c_str(), &v4) == 1)
        return address;
    in6_addr v6{};
    if (::inet_pton(AF_INET6, address.c_str(), &v6) != 1)
        return {};
    char text[INET6_ADDRSTRLEN] = "";
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
        std::memcpy(&v4, &v6.s6_addr[12], sizeof v4);
        return ::inet_ntop(AF_INET, &v4, text, sizeof text);
    }
    std::fill(std::begin(v6.s6_addr) + 8, std::end(v6.s6_addr), std::uint8_t{0});
    return std::string(::inet_ntop(AF_INET6, &v6, text, sizeof text)) + "/64";
}

} // namespace rdmaxx
