/// @file
/// A protection domain: the scope in which memory regions, queue pairs, SRQs and
/// address handles may be used together.
#pragma once

#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx {

/// A protection domain: the scope in which memory regions, queue pairs, SRQs and
/// address handles may be used together. It keeps its device open.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe, but for moving to or
/// from one: every other member is const and changes nothing.
class ProtectionDomain : detail::MoveOnly {
public:
    /// A new PD on the device of `context` (ibv_alloc_pd).
    ///
    /// @errors ibv_alloc_pd fails (out of resources).
    /// @misuse A moved-from Context.
    static Result<ProtectionDomain> create(const Context& context,
                                           std::source_location where = std::source_location::current());

    /// The verbs PD, for calls rdmaxx does not wrap.
    ///
    /// @misuse A moved-from ProtectionDomain.
    ibv_pd* get(std::source_location where = std::source_location::current()) const {
        return detail::live(pd_, "ProtectionDomain", where).get();
    }
    /// The counted PD, for layers that create objects in it: a holder keeps it (and its
    /// device) alive.
    ///
    /// @misuse A moved-from ProtectionDomain.
    const std::shared_ptr<ibv_pd>& handle(std::source_location where = std::source_location::current()) const;
    /// The counted state of its device (limits, name), as Context::handle.
    ///
    /// @misuse A moved-from ProtectionDomain.
    const detail::DeviceHandle& device(std::source_location where = std::source_location::current()) const;

private:
    ProtectionDomain(detail::DeviceHandle device, std::shared_ptr<ibv_pd> pd)
        : device_(std::move(device)), pd_(std::move(pd)) {}
    detail::DeviceHandle device_;
    std::shared_ptr<ibv_pd> pd_; // keeps the device open
};

} // namespace rdmaxx
