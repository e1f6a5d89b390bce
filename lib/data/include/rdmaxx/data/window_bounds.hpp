/// @file
/// Whether a device keeps a memory window's peer inside the window's bytes.
///
/// The verbs say an access outside a window's range fails; Soft-RoCE in Linux 6.1
/// checks only the range of the region under the window (rxe_resp.c), so there a
/// window on one block of a registered arena admits the whole arena. Rights and
/// invalidation are enforced either way. Code that relies on a window's bounds (lending
/// one block of a shared registration) asks this first.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/pd.hpp>

namespace rdmaxx {

/// Whether the device of `context` refuses an access outside a memory window's bytes.
/// Tries it: two RC QPs on `port` connected to each other in `pd`, a window bound to
/// the middle of a region, and one WRITE one byte past the window's end, which must
/// fail with a remote access error. True when it did, false when the WRITE landed
/// (the byte is in the probe's own scratch memory). An Error when the device has no
/// type 2 windows, or anything else fails or takes longer than `timeout`. Costs two QPs,
/// a CQ and a few posts: ask once per device (Connection does, and remembers).
/// @errors ibv_alloc_mw fails (no type 2 windows); creating or connecting the QPs, the
/// CQ or the region fails; the bind or the WRITE ends with another status; `timeout`
/// passes (kind timeout).
/// @misuse a moved-from context or PD.
Result<bool> window_bounds_enforced(const Context& context, const ProtectionDomain& pd, std::uint8_t port = 1,
                                    std::optional<std::uint32_t> gid_index = {},
                                    std::chrono::milliseconds timeout = std::chrono::seconds(5));

} // namespace rdmaxx
