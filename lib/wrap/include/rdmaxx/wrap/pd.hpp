// A protection domain: the scope in which memory regions, queue pairs, SRQs and
// address handles may be used together.
#pragma once

#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx {

class ProtectionDomain : detail::MoveOnly {
public:
    // Programming error: a moved-from Context.
    static Result<ProtectionDomain> create(const Context& context,
                                           std::source_location where = std::source_location::current());

    // Programming error, here and below: a moved-from ProtectionDomain.
    ibv_pd* get(std::source_location where = std::source_location::current()) const {
        return detail::live(pd_, "ProtectionDomain", where).get();
    }
    const std::shared_ptr<ibv_pd>& handle(std::source_location where = std::source_location::current()) const;
    const detail::DeviceHandle& device(std::source_location where = std::source_location::current()) const;

private:
    ProtectionDomain(detail::DeviceHandle device, std::shared_ptr<ibv_pd> pd)
        : device_(std::move(device)), pd_(std::move(pd)) {}
    detail::DeviceHandle device_;
    std::shared_ptr<ibv_pd> pd_; // keeps the device open
};

} // namespace rdmaxx
