// How a QP or an address handle reaches a peer: shared by qp.cpp, ah.cpp and context.cpp.
#pragma once

#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx::detail {

// A peer description comes from the network: anything that cannot be right is an
// Error (EINVAL) naming the field, before the device sees it. check_peer: all a
// connected QP uses (QPN, PSN, MTU, address); check_address: the address alone (an
// address handle's).
Result<void> check_peer(const Endpoint& peer, LinkLayer layer);
Result<void> check_address(const Endpoint& peer, LinkLayer layer);

// A local GID index a QP or an address handle can name: ibv_ah_attr's sgid_index holds
// 8 bits, so an index above max_usable_gid_index would silently be its low byte, another
// GID. EINVAL reported as `operation`'s. Defined in context.cpp, beside choose_gid.
Result<void> check_gid_index(std::uint32_t index, const char* operation);

// The address vector towards `peer` from `local` on `port`.
ibv_ah_attr address_vector(const Endpoint& peer, const GidEntry& local, std::uint8_t port, LinkLayer layer,
                           const QpConnectOptions& options);

} // namespace rdmaxx::detail
