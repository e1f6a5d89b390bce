// How a QP or an address handle reaches a peer: shared by qp.cpp and ah.cpp.
#pragma once

#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx::detail {

// A peer description comes from the network: anything that cannot be right is an
// Error (EINVAL) naming the field, before the device sees it. check_peer: all a
// connected QP uses (QPN, PSN, MTU, address); check_address: the address alone (an
// address handle's).
Result<void> check_peer(const Endpoint& peer, LinkLayer layer);
Result<void> check_address(const Endpoint& peer, LinkLayer layer);

// The address vector towards `peer` from `local` on `port`.
ibv_ah_attr address_vector(const Endpoint& peer, const GidEntry& local, std::uint8_t port, LinkLayer layer,
                           const QpConnectOptions& options);

} // namespace rdmaxx::detail
