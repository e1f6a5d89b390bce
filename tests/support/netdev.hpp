// A device test's hold on the network interface under an RDMA device: its name, and
// its MTU changed for a scope (rxe derives its port's active MTU from the netdev's).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <net/if.h>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <rdmaxx/wrap/context.hpp>

#include "check.hpp"

namespace rdmaxx::test {

// The interface of `context`'s port-1 GID (rxe's netdev).
inline std::string netdev_of(const Context& context) {
    const GidEntry gid = must(context.choose_gid());
    char name[IF_NAMESIZE] = {};
    REQUIRE(if_indextoname(gid.netdev_ifindex, name) != nullptr);
    return name;
}

// A netdev MTU for the scope's duration: the one it had is set again at its end.
class LinkMtu {
public:
    LinkMtu(std::string interface, int mtu) : interface_(std::move(interface)) {
        std::ifstream in("/sys/class/net/" + interface_ + "/mtu");
        REQUIRE((in >> was_));
        set(mtu);
    }
    LinkMtu(const LinkMtu&) = delete;
    LinkMtu& operator=(const LinkMtu&) = delete;
    ~LinkMtu() {
        const std::string command = fmt::format("ip link set dev {} mtu {}", interface_, was_);
        if (std::system(command.c_str()) != 0)
            std::fprintf(stderr, "could not set the MTU of %s back to %d\n", interface_.c_str(), was_);
    }
    void set(int mtu) const {
        const std::string command = fmt::format("ip link set dev {} mtu {}", interface_, mtu);
        REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command);
    }

private:
    std::string interface_;
    int was_ = 0;
};

} // namespace rdmaxx::test
