// Memory regions, bounds-checked slices of them, and the descriptor a peer needs to
// access one remotely.
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

// Access rights of a memory region (and of a QP's remote access).
enum class Access : unsigned {
    none = 0,
    local_write = IBV_ACCESS_LOCAL_WRITE,
    remote_write = IBV_ACCESS_REMOTE_WRITE,
    remote_read = IBV_ACCESS_REMOTE_READ,
    remote_atomic = IBV_ACCESS_REMOTE_ATOMIC,
    mw_bind = IBV_ACCESS_MW_BIND,
    zero_based = IBV_ACCESS_ZERO_BASED,
    on_demand = IBV_ACCESS_ON_DEMAND,
    relaxed_ordering = IBV_ACCESS_RELAXED_ORDERING,
};
constexpr Access operator|(Access a, Access b) noexcept {
    return static_cast<Access>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
constexpr Access operator&(Access a, Access b) noexcept {
    return static_cast<Access>(static_cast<unsigned>(a) & static_cast<unsigned>(b));
}
// True when every right in `wanted` is in `set`.
constexpr bool has(Access set, Access wanted) noexcept { return (set & wanted) == wanted; }
// Local write plus every remote right: what a region shared with a peer usually needs.
// "local_write|remote_read", or "none".
std::string to_string(Access access);

inline constexpr Access access_all =
    Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;
// Every remote right: what a memory window may carry.
inline constexpr Access access_remote = Access::remote_write | Access::remote_read | Access::remote_atomic;

// A view of bytes inside a registered memory region: what a work request's
// scatter/gather entry names. It does not own the region; like std::span, it must
// not outlive it.
class LocalSlice {
public:
    LocalSlice(std::byte* data, std::uint32_t length, std::uint32_t lkey) noexcept
        : data_(data), length_(length), lkey_(lkey) {}

    std::byte* data() const noexcept { return data_; }
    std::uint32_t size() const noexcept { return length_; }
    std::uint32_t lkey() const noexcept { return lkey_; }
    std::span<std::byte> bytes() const noexcept { return {data_, length_}; }
    ibv_sge sge() const noexcept {
        return {.addr = reinterpret_cast<std::uintptr_t>(data_), .length = length_, .lkey = lkey_};
    }

    // Programming error: `offset + length` past the end of this slice.
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

// What a peer needs to READ, WRITE or atomically update a region: a plain, copyable
// value with its own bounds-checked slices, and a fixed 20-byte wire form
// (address, length, rkey; big-endian).
struct RemoteMemory {
    std::uint64_t addr = 0;
    std::uint64_t length = 0;
    std::uint32_t rkey = 0;

    static constexpr std::size_t wire_size = 20;
    using Wire = std::array<std::byte, wire_size>;

    // Programming error: `offset + length` past the end of this descriptor.
    RemoteMemory slice(std::uint64_t offset, std::uint64_t length,
                       std::source_location where = std::source_location::current()) const {
        require(offset <= this->length && length <= this->length - offset, where,
                "slice [{}, +{}) out of range of a {}-byte remote region", offset, length, this->length);
        return {addr + offset, length, rkey};
    }

    Wire serialize() const noexcept;
    // Untrusted bytes: anything but exactly `wire_size` bytes, or a region whose end
    // overflows the address space, is a protocol Error.
    static Result<RemoteMemory> parse(std::span<const std::byte> bytes);

    friend bool operator==(const RemoteMemory&, const RemoteMemory&) = default;
};

// Huge pages for an allocation: fewer TLB misses on the host and fewer translation
// entries on the NIC for large buffers.
enum class HugePages : std::uint8_t {
    no,      // normal pages (aligned_alloc)
    prefer,  // hugetlbfs pages when some are reserved (vm.nr_hugepages), else normal
             // pages the kernel may back with transparent huge pages (the fallback
             // is logged once per process)
    require, // hugetlbfs pages, or an Error (ENOMEM: none reserved)
};

struct AllocateOptions {
    bool zeroed = true;          // false skips the memset of large buffers
    std::size_t alignment = 0;   // 0 = the page size (with huge pages: the huge page size)
    HugePages huge_pages = HugePages::no; // the size is rounded up to whole huge pages
};

namespace detail {
class PoolCore;
} // namespace detail

// Registered memory the caller owns: its own registration (register_memory,
// allocate), or a block of a MemoryPool's registered arena (MemoryPool::allocate),
// which goes back to its pool when the region is destroyed.
//
// A pooled region shares its arena's registration, which admits local access and
// memory window binding only: its rkey would reach the whole arena, so rkey() and
// remote() are programming errors on it. Hand it to a peer through a memory window
// bound to exactly its bytes (post_bind in rdmaxx/data/post.hpp; Connection lends
// it so), and access() is the remote rights such a window may carry.
class MemoryRegion {
public:
    // Registers caller-owned memory; it must outlive the region.
    // Programming error: a moved-from ProtectionDomain, or empty memory.
    static Result<MemoryRegion> register_memory(const ProtectionDomain& pd, std::span<std::byte> memory,
                                                Access access,
                                                std::source_location where = std::source_location::current());
    // Allocates `size` bytes (page-aligned, zeroed unless told otherwise) and registers
    // them; the memory is freed after the region is deregistered, never before.
    // Programming error: a moved-from ProtectionDomain, size 0, an alignment that is
    // not a power of two.
    static Result<MemoryRegion> allocate(const ProtectionDomain& pd, std::size_t size, Access access,
                                         AllocateOptions options = {},
                                         std::source_location where = std::source_location::current());

    MemoryRegion(MemoryRegion&& other) noexcept;
    MemoryRegion& operator=(MemoryRegion&& other) noexcept;
    MemoryRegion(const MemoryRegion&) = delete;
    MemoryRegion& operator=(const MemoryRegion&) = delete;
    ~MemoryRegion();

    // Accessors on a moved-from region are programming errors.
    std::byte* data(std::source_location where = std::source_location::current()) const;
    std::size_t size() const noexcept { return size_; }
    std::span<std::byte> bytes(std::source_location where = std::source_location::current()) const;
    std::uint32_t lkey(std::source_location where = std::source_location::current()) const;
    // Programming error on a pooled region (see above).
    std::uint32_t rkey(std::source_location where = std::source_location::current()) const;
    Access access() const noexcept { return access_; }
    bool pooled() const noexcept { return pool_ != nullptr; }

    // Programming error: `offset + length` past the end of the region, or a length
    // above 4 GiB - 1 (a scatter/gather entry's limit).
    LocalSlice slice(std::size_t offset, std::size_t length,
                     std::source_location where = std::source_location::current()) const;
    // The whole region as one slice (same limit).
    LocalSlice all(std::source_location where = std::source_location::current()) const;
    // The descriptor to hand to a peer. Programming error on a pooled region.
    RemoteMemory remote(std::source_location where = std::source_location::current()) const;

    // The registration (a pooled region's: its arena's, larger than the region).
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

// Access rights format as their names ("local_write|remote_read").
template <>
struct fmt::formatter<rdmaxx::Access> : fmt::formatter<std::string_view> {
    auto format(rdmaxx::Access access, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(rdmaxx::to_string(access), ctx);
    }
};
