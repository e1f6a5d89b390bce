// What a lib/ctrl Connection's client offers in its handshake (over TCP, or as an RDMA
// CM request's private data), made up by a test: a liar's limits, a stranger's GID.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <rdmaxx/ctrl/endpoint_codec.hpp>
#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::test {

// One RC QP (number 1, at `gid`) and the limits `max_message` and `depth` (receives).
inline std::vector<std::byte> connection_offer(std::uint32_t max_message, std::uint32_t depth, const Gid& gid = {}) {
    std::vector<std::byte> limits(8);
    wire::put(limits.data(), max_message, 4);
    wire::put(limits.data() + 4, depth, 4);
    return endpoint_codec::encode(
        {.qps = {{.endpoint = {.qpn = 1, .psn = 1, .gid = gid, .lid = 0, .mtu = Mtu::b1024}}}, .metadata = limits});
}

} // namespace rdmaxx::test
