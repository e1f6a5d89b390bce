// A TCP client of a chosen source address: a client from another host, as a listener
// sees it (pair.sh's RDMAXX_PAIR_B_ADDR2 beside RDMAXX_PAIR_B_ADDR).
#pragma once

#include <cstdint>
#include <utility>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <rdmaxx/ctrl/tcp.hpp>

namespace rdmaxx::test {

// A TCP connection to host:port (IPv4) from `source`, an address of this machine.
inline TcpStream connect_from(const char* source, const char* host, std::uint16_t port) {
    struct Owned { // closed if a REQUIRE below ends the test
        int fd;
        ~Owned() {
            if (fd >= 0)
                ::close(fd);
        }
    } owned{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
    const int fd = owned.fd;
    REQUIRE(fd >= 0);
    sockaddr_in from{}, to{};
    from.sin_family = to.sin_family = AF_INET;
    to.sin_port = htons(port);
    REQUIRE(::inet_pton(AF_INET, source, &from.sin_addr) == 1);
    REQUIRE(::inet_pton(AF_INET, host, &to.sin_addr) == 1);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
    return TcpStream::adopt(std::exchange(owned.fd, -1), fmt::format("{}:{}", host, port));
}

} // namespace rdmaxx::test
