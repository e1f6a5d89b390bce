// Out-of-band TCP for connection setup: a listener, a stream with bounded reads and
// writes, and the endpoint exchange that brings queue pairs of two processes to RTS.
// Every call takes a timeout; a dead, silent or lying peer is an Error, never a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <string_view>

#include <rdmaxx/ctrl/endpoint_codec.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

using Clock = std::chrono::steady_clock;

class TcpStream : detail::MoveOnly {
public:
    // Connects to host:port (a name or a numeric address) within `timeout`.
    static Result<TcpStream> connect(std::string_view host, std::uint16_t port, std::chrono::milliseconds timeout);
    // Takes ownership of a connected socket made elsewhere (Asio's socket.release(), say).
    static TcpStream adopt(int fd, std::string peer) noexcept { return TcpStream(fd, std::move(peer)); }

    TcpStream(TcpStream&& other) noexcept;
    TcpStream& operator=(TcpStream&& other) noexcept;
    ~TcpStream();

    // All of `bytes`, or an Error (peer gone, deadline passed).
    Result<void> write_all(std::span<const std::byte> bytes, Clock::time_point deadline);
    // Exactly `bytes.size()` bytes, or an Error; a peer that closes first is an Error
    // saying how many bytes came.
    Result<void> read_exact(std::span<std::byte> bytes, Clock::time_point deadline);

    // One endpoint message each way: ours out, the peer's in, checked (codec).
    Result<EndpointMessage> exchange(const EndpointMessage& mine, std::chrono::milliseconds timeout);
    // One byte each way (ready_byte) once both sides are ready (receives posted):
    // after it, a SEND from either side finds a receive. No sleeps anywhere.
    Result<void> confirm_ready(std::chrono::milliseconds timeout);
    static constexpr std::byte ready_byte{'R'};

    int fd() const noexcept { return fd_; }
    // "host:port" of the peer, for messages.
    const std::string& peer() const noexcept { return peer_; }

private:
    TcpStream(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
    friend class TcpListener;
    int fd_ = -1;
    std::string peer_;
};

class TcpListener : detail::MoveOnly {
public:
    // Listens on host:port; port 0 picks a free port (see port()). An empty host or
    // "*" listens on every address.
    static Result<TcpListener> listen(std::string_view host, std::uint16_t port, int backlog = 64);

    TcpListener(TcpListener&& other) noexcept;
    TcpListener& operator=(TcpListener&& other) noexcept;
    ~TcpListener();

    std::uint16_t port() const noexcept { return port_; }
    int fd() const noexcept { return fd_; }
    // The next client, within `timeout`.
    Result<TcpStream> accept(std::chrono::milliseconds timeout);

private:
    TcpListener(int fd, std::uint16_t port) : fd_(fd), port_(port) {}
    int fd_ = -1;
    std::uint16_t port_ = 0;
};

// Exchanges endpoints over `stream` and connects each of `qps` to its counterpart
// (RC/UC: connect(peer); UD: activate()). The peer must offer as many QPs, of the
// same types, else an Error. Returns the peer's message (its metadata). Then post
// the receives and call stream.confirm_ready().
Result<EndpointMessage> connect_over_tcp(TcpStream& stream, std::span<QueuePair* const> qps,
                                         std::span<const std::byte> metadata, const QpConnectOptions& options,
                                         std::chrono::milliseconds timeout,
                                         std::source_location where = std::source_location::current());

} // namespace rdmaxx
