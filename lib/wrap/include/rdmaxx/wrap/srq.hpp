/// @file
/// A shared receive queue: one pool of receive buffers for many QPs.
#pragma once

#include <cstdint>
#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/pd.hpp>

namespace rdmaxx {

/// How to create a SharedReceiveQueue.
struct SrqOptions {
    std::uint32_t max_wr = 1024; ///< receive WRs it holds, at least
    std::uint32_t max_sge = 1;   ///< scatter/gather entries per receive WR, at least
    /// IBV_EVENT_SRQ_LIMIT_REACHED when fewer receives than this remain (armed once, as
    /// ibv_modify_srq(3) arms it; re-arm with ibv_modify_srq on get()); 0 = none
    std::uint32_t limit = 0;
};

/// A shared receive queue: one pool of receive buffers for many QPs
/// (QpOptions::srq). It keeps its PD alive.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe, but for moving to or
/// from one: every other member is const and changes nothing.
class SharedReceiveQueue : detail::MoveOnly {
public:
    /// A new SRQ in `pd`. Sizes above the device's max_srq_wr / max_srq_sge are an Error.
    ///
    /// @errors Sizes above max_srq_wr / max_srq_sge, which are 0 on a device without
    /// SRQs (EINVAL); ibv_create_srq fails (out of resources); ibv_modify_srq refuses the
    /// limit (above max_wr: EINVAL).
    /// @misuse A moved-from ProtectionDomain, max_wr or max_sge 0.
    static Result<SharedReceiveQueue> create(const ProtectionDomain& pd, SrqOptions options = {},
                                             std::source_location where = std::source_location::current());

    /// The real number of receive WRs (at least the requested max_wr).
    std::uint32_t max_wr() const noexcept { return max_wr_; }
    /// The real scatter/gather entries per receive WR (at least the requested max_sge).
    std::uint32_t max_sge() const noexcept { return max_sge_; }

    /// The verbs SRQ, for calls rdmaxx does not wrap.
    ///
    /// @misuse A moved-from SharedReceiveQueue.
    ibv_srq* get(std::source_location where = std::source_location::current()) const {
        return detail::live(srq_, "SharedReceiveQueue", where).get();
    }
    /// The counted SRQ, for layers that create QPs of their own: a holder keeps it (and
    /// its PD) alive.
    ///
    /// @misuse A moved-from SharedReceiveQueue.
    const std::shared_ptr<ibv_srq>& handle(std::source_location where = std::source_location::current()) const;

private:
    SharedReceiveQueue(std::shared_ptr<ibv_srq> srq, std::uint32_t max_wr, std::uint32_t max_sge)
        : srq_(std::move(srq)), max_wr_(max_wr), max_sge_(max_sge) {}
    std::shared_ptr<ibv_srq> srq_; // keeps the PD alive
    std::uint32_t max_wr_;
    std::uint32_t max_sge_;
};

} // namespace rdmaxx
