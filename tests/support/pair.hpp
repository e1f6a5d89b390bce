// Fixtures for tests between two devices over a wire: scripts/vm/pair.sh makes rxeA
// and rxeB (RDMAXX_PAIR_* name them); elsewhere such tests are skipped.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <rdmaxx/wrap/device.hpp>

namespace rdmaxx::test {

inline const char* env(const char* name) {
    const char* value = std::getenv(name);
    return value ? value : "";
}

inline bool have_pair() { return *env("RDMAXX_PAIR_A_DEV") && *env("RDMAXX_PAIR_B_DEV"); }

// The index of rxeA's and rxeB's IPv4 RoCE v2 GID.
inline std::uint32_t pair_gid_index() { return static_cast<std::uint32_t>(std::atoi(env("RDMAXX_PAIR_GID_INDEX"))); }

// 198.51.100.77 as a RoCE v2 GID: an address in the wire's subnet that nobody answers
// for. Towards it an address handle, or an RC QP's move to RTR, waits for an ARP
// answer (rxe: a second) and fails.
inline Gid stranger_gid() {
    Gid gid{};
    gid.bytes[10] = gid.bytes[11] = 0xff;
    gid.bytes[12] = 198;
    gid.bytes[13] = 51;
    gid.bytes[14] = 100;
    gid.bytes[15] = 77;
    return gid;
}

// A netem rule on an interface for the scope's duration: removed even when a check fails.
class Netem {
public:
    Netem(const char* interface, const std::string& rule) : interface_(interface) {
        const std::string command = fmt::format("tc qdisc add dev {} root netem {}", interface_, rule);
        REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command);
    }
    Netem(const Netem&) = delete;
    Netem& operator=(const Netem&) = delete;
    ~Netem() {
        const std::string command = fmt::format("tc qdisc del dev {} root", interface_);
        if (std::system(command.c_str()) != 0)
            std::fprintf(stderr, "could not remove the netem rule on %s\n", interface_.c_str());
    }

private:
    std::string interface_;
};

} // namespace rdmaxx::test
