/// @file
/// Memory windows (type 2): MemoryWindow.
#pragma once

#include <cstdint>
#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/pd.hpp>

namespace rdmaxx {

/// Memory windows (type 2): an rkey bound by a work request to exactly the bytes of one
/// registered region, with remote rights of its own, and invalidated without touching
/// the registration. The key works only through the QP that bound it. Binding and
/// invalidating are posts (post_bind, post_invalidate in rdmaxx/data/post.hpp);
/// destroying the window (ibv_dealloc_mw) invalidates it at once.
///
/// Invalidate or destroy a window before the region it is bound to. A region with its
/// own registration destroyed first cannot be deregistered (the device refuses): its
/// registration and memory are leaked, still reachable by the key (logged as an error).
/// A pooled region destroyed first gives its block back to the pool while the key still
/// reaches it: a misuse the library cannot see (lib/ctrl's lending keeps this order).
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe; a window is bound and
/// invalidated through one QP's posts.
class MemoryWindow : detail::MoveOnly {
public:
    /// An unbound type 2 window. An Error on a device without them
    /// (DeviceAttributes::type2_windows).
    ///
    /// @errors ibv_alloc_mw fails (no type 2 windows on the device, out of resources).
    /// @misuse A moved-from PD.
    static Result<MemoryWindow> allocate(const ProtectionDomain& pd,
                                         std::source_location where = std::source_location::current());

    /// The key of the last bind posted (its low 8 bits change with every bind, so a
    /// key handed out before is refused once the window is bound again). It is kept in
    /// the verbs window itself, where a posted bind sets it (SendBatch::bind): a
    /// provider names the window in the next bind's WR by it (Soft-RoCE refuses a bind
    /// naming an older key, so a window kept elsewhere bound once only).
    ///
    /// @misuse A moved-from window.
    std::uint32_t rkey(std::source_location where = std::source_location::current()) const;

    /// The verbs window, for calls rdmaxx does not wrap.
    ///
    /// @misuse A moved-from window.
    ibv_mw* get(std::source_location where = std::source_location::current()) const {
        return detail::live(mw_, "MemoryWindow", where).get();
    }

private:
    explicit MemoryWindow(std::shared_ptr<ibv_mw> mw) : mw_(std::move(mw)) {}
    std::shared_ptr<ibv_mw> mw_; // keeps the PD alive
};

} // namespace rdmaxx
