// Name resolution with a deadline, for TCP and RDMA CM alike. getaddrinfo(3) blocks
// for as long as the resolver's timeouts and attempts say (a DNS server that does not
// answer holds it for tens of seconds); a numeric host needs no lookup at all.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

#include <sys/socket.h>

#include <rdmaxx/ctrl/tcp.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::detail {

// One address of a host, as the bytes of its sockaddr.
struct SocketAddress {
    int family = AF_UNSPEC;
    sockaddr_storage storage{};
    socklen_t length = 0;

    const sockaddr* get() const noexcept { return reinterpret_cast<const sockaddr*>(&storage); }
};

// host:port's stream addresses of `family` (AF_UNSPEC: IPv4 and IPv6), in the
// resolver's order. `passive`: for bind(); an empty host or "*" is every address. A
// lookup still running at `deadline` is an Error of kind timeout (the lookup is
// abandoned; it cleans up after itself when it ends).
// How long a listener's own name lookup may take (listen() has no timeout).
inline constexpr std::chrono::seconds listen_lookup_bound{5};

Result<std::vector<SocketAddress>> resolve_host(std::string_view host, std::uint16_t port, int family, bool passive,
                                                Clock::time_point deadline);

} // namespace rdmaxx::detail
