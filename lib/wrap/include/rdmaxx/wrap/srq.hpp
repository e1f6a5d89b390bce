// A shared receive queue: one pool of receive buffers for many QPs.
#pragma once

#include <cstdint>
#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/pd.hpp>

namespace rdmaxx {

struct SrqOptions {
    std::uint32_t max_wr = 1024;
    std::uint32_t max_sge = 1;
    std::uint32_t limit = 0; // IBV_EVENT_SRQ_LIMIT_REACHED threshold; 0 = none
};

class SharedReceiveQueue : detail::MoveOnly {
public:
    // Sizes above the device's max_srq_wr / max_srq_sge are an Error.
    // Programming error: a moved-from ProtectionDomain, max_wr or max_sge 0.
    static Result<SharedReceiveQueue> create(const ProtectionDomain& pd, SrqOptions options = {},
                                             std::source_location where = std::source_location::current());

    // The real sizes (at least the requested ones).
    std::uint32_t max_wr() const noexcept { return max_wr_; }
    std::uint32_t max_sge() const noexcept { return max_sge_; }

    ibv_srq* get(std::source_location where = std::source_location::current()) const {

        return detail::live(srq_, "SharedReceiveQueue", where).get();

    }
    const std::shared_ptr<ibv_srq>& handle(std::source_location where = std::source_location::current()) const;

private:
    SharedReceiveQueue(std::shared_ptr<ibv_srq> srq, std::uint32_t max_wr, std::uint32_t max_sge)
        : srq_(std::move(srq)), max_wr_(max_wr), max_sge_(max_sge) {}
    std::shared_ptr<ibv_srq> srq_; // keeps the PD alive
    std::uint32_t max_wr_;
    std::uint32_t max_sge_;
};

} // namespace rdmaxx
