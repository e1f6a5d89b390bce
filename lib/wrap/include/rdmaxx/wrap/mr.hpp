/// @file
/// Memory regions, bounds-checked slices of them, and the descriptor a peer needs to
/// access one remotely.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <source_location>
#include <span>

#include <infiniband/verbs.h>

#include <fmt/format.h>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/pd.hpp>

namespace rdmaxx {

/// Access rights of a memory region (and of a QP's remote access): the `IBV_ACCESS_*`
/// flags. remote_write and remote_atomic need local_write too. Rights combine with |
/// and &, and format with fmt as to_string() writes them.
enum class Access : unsigned {
    none = 0,                                       ///< no right
    local_write = IBV_ACCESS_LOCAL_WRITE,           ///< the NIC may write it (receives, READs)
    remote_write = IBV_ACCESS_REMOTE_WRITE,         ///< a peer may RDMA WRITE it
    remote_read = IBV_ACCESS_REMOTE_READ,           ///< a peer may RDMA READ it
    remote_atomic = IBV_ACCESS_REMOTE_ATOMIC,       ///< a peer may update it atomically
    mw_bind = IBV_ACCESS_MW_BIND,                   ///< memory windows may be bound to it
    zero_based = IBV_ACCESS_ZERO_BASED,             ///< addressed by offset from its start
    on_demand = IBV_ACCESS_ON_DEMAND,               ///< on-demand paging (nothing pinned)
    relaxed_ordering = IBV_ACCESS_RELAXED_ORDERING, ///< the NIC may relax the order of its writes
};
/// The rights in either set.
constexpr Access operator|(Access a, Access b) noexcept {
    return static_cast<Access>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
/// The rights in both sets.
constexpr Access operator&(Access a, Access b) noexcept {
    return static_cast<Access>(static_cast<unsigned>(a) & static_cast<unsigned>(b));
}
/// True when every right in `wanted` is in `set`.
constexpr bool has(Access set, Access wanted) noexcept { return (set & wanted) == wanted; }
/// The rights by name: "local_write|remote_read", or "none".
std::string to_string(Access access);

/// Local write plus every remote right: what a region shared with a peer usually needs.
inline constexpr Access access_all =
    Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;
/// Every remote right: what a memory window may carry.
inline constexpr Access access_remote = Access::remote_write | Access::remote_read | Access::remote_atomic;

/// A view of bytes inside a registered memory region: what a work request's
/// scatter/gather entry names. It does not own the region; like std::span, it must
/// not outlive it.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe to read concurrently (every
/// member but assignment is const).
class LocalSlice {
public:
    /// A slice of `length` bytes at `data`, in a region whose local key is `lkey`;
    /// unchecked (MemoryRegion::slice makes checked ones).
    LocalSlice(std::byte* data, std::uint32_t length, std::uint32_t lkey) noexcept
        : data_(data), length_(length), lkey_(lkey) {}

    std::byte* data() const noexcept { return data_; } ///< The first byte.
    std::uint32_t size() const noexcept { return length_; } ///< Its length in bytes.
    std::uint32_t lkey() const noexcept { return lkey_; } ///< Its region's local key.
    std::span<std::byte> bytes() const noexcept { return {data_, length_}; } ///< Its bytes.
    /// As a work request's scatter/gather entry.
    ibv_sge sge() const noexcept {
        return {.addr = reinterpret_cast<std::uintptr_t>(data_), .length = length_, .lkey = lkey_};
    }

    /// The `length` bytes from `offset` of this slice.
    ///
    /// @misuse `offset + length` past the end of this slice.
    LocalSlice slice(std::size_t offset, std::size_t length,
                     std::source_location where = std::source_location::current()) const {
        require(offset <= length_ && length <= length_ - offset, where,
                "slice [{}, +{}) out of range of a {}-byte local slice", offset, length, length_);
        return {data_ + offset, static_cast<std::uint32_t>(length), lkey_};
    }

private:
    std::byte* data_;
    std::uint32_t length_;
    std::uint32_t lkey_;
};

/// What a peer needs to READ, WRITE or atomically update a region: a plain, copyable
/// value with its own bounds-checked slices, and a fixed 20-byte wire form
/// (address, length, rkey; big-endian).
///
/// @threadsafety Distinct objects: safe. Shared objects: safe to read concurrently.
struct RemoteMemory {
    std::uint64_t addr = 0;   ///< The first byte, in the owner's address space.
    std::uint64_t length = 0; ///< Its length in bytes.
    std::uint32_t rkey = 0;   ///< The key that admits the peer.

    static constexpr std::size_t wire_size = 20;   ///< Bytes of the wire form.
    using Wire = std::array<std::byte, wire_size>; ///< The wire form.

    /// The `length` bytes from `offset` of this region.
    ///
    /// @misuse `offset + length` past the end of this descriptor.
    RemoteMemory slice(std::uint64_t offset, std::uint64_t length,
                       std::source_location where = std::source_location::current()) const {
        require(offset <= this->length && length <= this->length - offset, where,
                "slice [{}, +{}) out of range of a {}-byte remote region", offset, length, this->length);
        return {addr + offset, length, rkey};
    }

    /// The wire form: address, length, rkey; big-endian.
    Wire serialize() const noexcept;
    /// Reads the wire form from untrusted bytes: anything but exactly `wire_size` bytes,
    /// or a region whose end overflows the address space, is a protocol Error.
    ///
    /// @errors Not `wire_size` bytes, or a region that wraps around (kind protocol).
    static Result<RemoteMemory> parse(std::span<const std::byte> bytes);

    /// Same address, length and key.
    friend bool operator==(const RemoteMemory&, const RemoteMemory&) = default;
};

/// Huge pages for an allocation: fewer TLB misses on the host and fewer translation
/// entries on the NIC for large buffers.
enum class HugePages : std::uint8_t {
    no,      ///< normal pages (aligned_alloc)
    prefer,  ///< hugetlbfs pages when some are reserved (vm.nr_hugepages), else normal
             ///< pages the kernel may back with transparent huge pages (the fallback
             ///< is logged once per process)
    require, ///< hugetlbfs pages, or an Error (ENOMEM: none reserved)
};

/// How MemoryRegion::allocate gets its memory.
struct AllocateOptions {
    bool zeroed = true;        ///< false skips the memset of large buffers
    std::size_t alignment = 0; ///< 0 = the page size (with huge pages: the huge page size)
    /// Huge pages or not; with them, the size is rounded up to whole huge pages.
    HugePages huge_pages = HugePages::no;
};

namespace detail {
class PoolCore;
} // namespace detail

/// Registered memory the caller owns: its own registration (register_memory,
/// allocate), or a block of a MemoryPool's registered arena (MemoryPool::allocate),
/// which goes back to its pool when the region is destroyed.
///
/// A pooled region shares its arena's registration, which admits local access and
/// memory window binding only: its rkey would reach the whole arena, so rkey() and
/// remote() are programming errors on it. Hand it to a peer through a memory window
/// bound to exactly its bytes (post_bind in rdmaxx/data/post.hpp; Connection lends
/// it so), and access() is the remote rights such a window may carry.
///
/// @threadsafety Distinct objects: safe, but regions of one MemoryPool are destroyed (or
/// assigned to) only by the thread that uses the pool. Shared objects: the const members
/// may be called concurrently.
class MemoryRegion {
public:
    /// Registers caller-owned memory; it must outlive the region.
    ///
    /// @errors ibv_reg_mr fails (the locked-memory limit, RLIMIT_MEMLOCK; rights the
    /// device refuses; out of resources).
    /// @misuse A moved-from ProtectionDomain, or empty memory.
    static Result<MemoryRegion> register_memory(const ProtectionDomain& pd, std::span<std::byte> memory,
                                                Access access,
                                                std::source_location where = std::source_location::current());
    /// Allocates `size` bytes (page-aligned, zeroed unless told otherwise) and registers
    /// them; the memory is freed after the region is deregistered, never before.
    ///
    /// @errors aligned_alloc fails (ENOMEM; so does a size above PTRDIFF_MAX); mmap fails (HugePages::require with no
    /// hugetlbfs pages reserved: ENOMEM); ibv_reg_mr fails, as for register_memory.
    /// @misuse A moved-from ProtectionDomain, size 0, an alignment that is not a power
    /// of two.
    static Result<MemoryRegion> allocate(const ProtectionDomain& pd, std::size_t size, Access access,
                                         AllocateOptions options = {},
                                         std::source_location where = std::source_location::current());

    /// Takes over `other`'s registration or pooled block; `other` is left moved-from.
    MemoryRegion(MemoryRegion&& other) noexcept;
    /// Lets go of this region (as the destructor does), then takes over `other`'s.
    MemoryRegion& operator=(MemoryRegion&& other) noexcept;
    MemoryRegion(const MemoryRegion&) = delete;
    MemoryRegion& operator=(const MemoryRegion&) = delete;
    /// Deregisters its own registration, or gives a pooled block back to its pool.
    ~MemoryRegion();

    /// The first byte.
    ///
    /// @misuse A moved-from region.
    std::byte* data(std::source_location where = std::source_location::current()) const {
        get(where); // a moved-from region aborts
        return data_;
    }
    /// Its length in bytes, as asked for (a pooled block may be larger); 0 when moved-from.
    std::size_t size() const noexcept { return size_; }
    /// Its bytes.
    ///
    /// @misuse A moved-from region.
    std::span<std::byte> bytes(std::source_location where = std::source_location::current()) const {
        return {data(where), size_};
    }
    /// The local key, for scatter/gather entries.
    ///
    /// @misuse A moved-from region.
    std::uint32_t lkey(std::source_location where = std::source_location::current()) const;
    /// The remote key a peer presents.
    ///
    /// @misuse A pooled region (see above), a moved-from one.
    std::uint32_t rkey(std::source_location where = std::source_location::current()) const;
    /// The rights it was registered with; of a pooled region, the remote rights a window
    /// on it may carry.
    Access access() const noexcept { return access_; }
    /// Whether it is a block of a MemoryPool's arena.
    bool pooled() const noexcept { return pool_ != nullptr; }

    /// The `length` bytes from `offset`, as a slice.
    ///
    /// @misuse `offset + length` past the end of the region, or a length above
    /// 4 GiB - 1 (a scatter/gather entry's limit); a moved-from region.
    LocalSlice slice(std::size_t offset, std::size_t length,
                     std::source_location where = std::source_location::current()) const;
    /// The whole region as one slice.
    ///
    /// @misuse As slice(): a region above 4 GiB - 1, a moved-from region.
    LocalSlice all(std::source_location where = std::source_location::current()) const;
    /// The descriptor to hand to a peer.
    ///
    /// @misuse A pooled region, a moved-from one.
    RemoteMemory remote(std::source_location where = std::source_location::current()) const;

    /// The registration (a pooled region's: its arena's, larger than the region).
    ///
    /// @misuse A moved-from region.
    ibv_mr* get(std::source_location where = std::source_location::current()) const {
        return detail::live(raw_, "MemoryRegion", where);
    }

private:
    friend class detail::PoolCore;
    MemoryRegion(std::shared_ptr<ibv_mr> own, ibv_mr* registration, std::byte* data, std::size_t size, Access access,
                 detail::PoolCore* pool = nullptr, std::uint32_t block = 0) noexcept
        : own_(std::move(own)), raw_(registration), data_(data), size_(size), access_(access), pool_(pool),
          block_(block) {}
    void give_back() noexcept;

    // A registration of its own (keeps the PD alive and, if allocated, the memory);
    // empty for a block of a shared arena, which its pool keeps.
    std::shared_ptr<ibv_mr> own_;
    ibv_mr* raw_ = nullptr; // the registration: own_'s or the arena's
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    Access access_ = Access::none;
    // A pooled block goes back there; the pool lives while it has blocks out (no
    // atomic count: a pool is used from one thread at a time).
    detail::PoolCore* pool_ = nullptr;
    std::uint32_t block_ = 0; // which block, in the pool's terms
};

} // namespace rdmaxx

/// @cond
// Access rights format as their names ("local_write|remote_read").
template <>
struct fmt::formatter<rdmaxx::Access> : fmt::formatter<std::string_view> {
    auto format(rdmaxx::Access access, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(rdmaxx::to_string(access), ctx);
    }
};
/// @endcond
