/// @file
/// An address handle: where a UD send (or an mlx5 DC initiator's work request) goes.
#pragma once

#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

/// An address handle: where a UD send (or an mlx5 DC initiator's work request) goes.
/// It keeps its PD alive.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe, but for moving to or
/// from one: get() is const and changes nothing.
class AddressHandle : detail::MoveOnly {
public:
    /// An address handle towards `peer` for sends on the UD QP `via` (its PD, port and
    /// GID). Of `peer` only the address is used and checked (a GID on RoCE, a LID on
    /// InfiniBand): its QPN goes with each send, and its PSN and MTU mean nothing to
    /// UD. `options` supplies service level, traffic class and hop limit. On RoCE it
    /// waits for the GID's MAC address, as QueuePair::connect does (up to a second).
    ///
    /// @errors An address that cannot be right (a zero GID on RoCE, LID 0 on
    /// InfiniBand: EINVAL); ibv_create_ah fails (no route to the GID, out of resources).
    /// @misuse `via` is not UD or is moved-from.
    static Result<AddressHandle> create(const QueuePair& via, const Endpoint& peer,
                                        const QpConnectOptions& options = {},
                                        std::source_location where = std::source_location::current());
    /// The same for a sender that is not a wrap QueuePair (an mlx5 DC initiator): the
    /// path starts at `local` (a GID of `port`, whose link layer is `layer`) in the PD
    /// `pd` (a ProtectionDomain's or QueuePair's handle). Of `peer` only the address
    /// (GID, LID) is used.
    ///
    /// @errors As the first overload; on RoCE, `local` at an index above
    /// max_usable_gid_index (EINVAL).
    /// @misuse A null `pd`.
    static Result<AddressHandle> create(const std::shared_ptr<ibv_pd>& pd, const Endpoint& peer, const GidEntry& local,
                                        std::uint8_t port, LinkLayer layer, const QpConnectOptions& options = {},
                                        std::source_location where = std::source_location::current());

    /// The verbs address handle, for a UD work request (`wr.ud.ah`).
    ///
    /// @misuse A moved-from AddressHandle.
    ibv_ah* get(std::source_location where = std::source_location::current()) const {

        return detail::live(ah_, "AddressHandle", where).get();

    }

private:
    explicit AddressHandle(std::shared_ptr<ibv_ah> ah) : ah_(std::move(ah)) {}
    std::shared_ptr<ibv_ah> ah_; // keeps the PD alive
};

} // namespace rdmaxx
