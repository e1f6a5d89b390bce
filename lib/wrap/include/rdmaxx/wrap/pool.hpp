/// @file
/// A pool of registered memory: MemoryPool, regions carved from large registered arenas.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <source_location>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pd.hpp>

namespace rdmaxx {

/// How a MemoryPool grows.
struct PoolOptions {
    std::size_t arena_bytes = 8 << 20;        ///< registered at a time as the pool grows
    HugePages huge_pages = HugePages::prefer; ///< for its arenas
};

/// What the pool holds.
struct PoolStats {
    std::uint64_t registrations = 0;    ///< ibv_reg_mr calls the pool made, ever
    std::uint64_t registered_bytes = 0; ///< in shared arenas (not those of regions above 4 MiB)
    std::uint64_t regions = 0;          ///< regions given out and not yet back
};

namespace detail {
// Lets go of a pool's state (it lives on while regions from it are out).
struct PoolDrop {
    void operator()(PoolCore* core) const noexcept;
};
} // namespace detail

/// A pool of registered memory: regions carved from large registered arenas, so that
/// allocating one costs no ibv_reg_mr (no kernel call, no page pinning) once the pool
/// has grown to the program's working set.
///
/// Size classes are powers of two from 64 B to 4 MiB; a request takes a block of the
/// smallest class that holds it, aligned to the class size up to 256 KiB (page-aligned
/// from 4 KiB up). The arenas (PoolOptions::arena_bytes each, huge pages when some are
/// reserved) are registered as the pool grows and kept until the pool and every region
/// from it are gone: the footprint is the high-water mark, as in eRPC's allocator. A
/// request above 4 MiB gets an arena of its own, registered for it and deregistered
/// when the region goes.
///
/// Arenas are registered for local access and memory window binding only: a pooled
/// region's bytes reach a peer through a window bound to exactly them (MemoryRegion
/// says more), never through the arena's rkey. On a device without type 2 memory
/// windows the arenas are registered for local access only, and a region to share is
/// registered on its own (Connection does that when it lends one).
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe. A pool and the regions
/// it gave are used, and destroyed, from one thread at a time: a pool per thread, as
/// eRPC has. An allocation is a vector pop; an uncontended mutex around it added 20-40 %
/// in the VM (bench/results/memory.md), and a contended one would serialise the threads
/// it was meant to serve.
class MemoryPool : detail::MoveOnly {
public:
    static constexpr std::size_t min_block = 64; ///< The smallest size class, in bytes.
    /// The largest size class, in bytes; a larger request gets an arena of its own.
    static constexpr std::size_t max_block = std::size_t{4} << 20;

    /// An empty pool in `pd`: nothing is registered before the first allocate().
    ///
    /// @errors None: it registers nothing.
    /// @misuse A moved-from ProtectionDomain, arena_bytes below max_block.
    static Result<MemoryPool> create(const ProtectionDomain& pd, PoolOptions options = {},
                                     std::source_location where = std::source_location::current());

    /// A region of `size` bytes, zeroed unless `zeroed` is false; `access` is the remote
    /// rights a window on it may carry (MemoryRegion::access()). An Error only when the
    /// pool must grow and cannot (mmap, ibv_reg_mr).
    ///
    /// @errors The pool must grow and mmap fails (out of memory, or a size above
    /// PTRDIFF_MAX: ENOMEM; HugePages::require with
    /// no hugetlbfs pages reserved) or ibv_reg_mr fails (the locked-memory limit).
    /// @misuse Size 0, a moved-from pool.
    Result<MemoryRegion> allocate(std::size_t size, Access access = access_all, bool zeroed = true,
                                  std::source_location where = std::source_location::current());

    /// Whether its regions can be lent through memory windows (the device has type 2
    /// windows and the arenas are registered for binding them).
    ///
    /// @misuse A moved-from pool.
    bool binds_windows(std::source_location where = std::source_location::current()) const;
    /// What the pool holds now.
    ///
    /// @misuse A moved-from pool.
    PoolStats stats(std::source_location where = std::source_location::current()) const;

private:
    explicit MemoryPool(detail::PoolCore* core) noexcept : core_(core) {}
    std::unique_ptr<detail::PoolCore, detail::PoolDrop> core_; // counted by every region given out, too
};

} // namespace rdmaxx
