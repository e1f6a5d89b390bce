#include <rdmaxx/wrap/mr.hpp>

#include "registration.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <utility>

#include <endian.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rdmaxx/wrap/handle.hpp>
#include <rdmaxx/wrap/log.hpp>
#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx {
namespace {

Result<std::shared_ptr<ibv_mr>> register_with(const std::shared_ptr<ibv_pd>& pd, std::span<std::byte> memory,
                                              Access access, std::shared_ptr<void> owned) {
    ibv_mr* mr = ibv_reg_mr(pd.get(), memory.data(), memory.size(), static_cast<int>(access));
    if (!mr)
        return std::unexpected(Error::from_last_errno("ibv_reg_mr", "{} bytes, access {}", memory.size(), access));
    // `owned` (the allocation, if any) is a kept parent: freed after ibv_dereg_mr
    return detail::adopt(mr, "ibv_dereg_mr", &ibv_dereg_mr, pd, std::move(owned));
}

} // namespace

std::string to_string(Access access) {
    std::string text;
    const std::pair<Access, const char*> names[] = {
        {Access::local_write, "local_write"},     {Access::remote_write, "remote_write"},
        {Access::remote_read, "remote_read"},     {Access::remote_atomic, "remote_atomic"},
        {Access::mw_bind, "mw_bind"},             {Access::zero_based, "zero_based"},
        {Access::on_demand, "on_demand"},         {Access::relaxed_ordering, "relaxed_ordering"},
    };
    for (const auto& [flag, name] : names)
        if (has(access, flag))
            fmt::format_to(std::back_inserter(text), "{}{}", text.empty() ? "" : "|", name);
    return text.empty() ? "none" : text;
}

RemoteMemory::Wire RemoteMemory::serialize() const noexcept {
    Wire wire;
    wire::put(wire.data(), addr, 8);
    wire::put(wire.data() + 8, length, 8);
    wire::put(wire.data() + 16, rkey, 4);
    return wire;
}

Result<RemoteMemory> RemoteMemory::parse(std::span<const std::byte> bytes) {
    if (bytes.size() != wire_size)
        return std::unexpected(Error::protocol(
            "RemoteMemory::parse", fmt::format("{} bytes, a remote region takes {}", bytes.size(), wire_size)));
    RemoteMemory remote{.addr = wire::get(bytes.data(), 8),
                        .length = wire::get(bytes.data() + 8, 8),
                        .rkey = static_cast<std::uint32_t>(wire::get(bytes.data() + 16, 4))};
    if (remote.length > std::numeric_limits<std::uint64_t>::max() - remote.addr)
        return std::unexpected(Error::protocol(
            "RemoteMemory::parse", fmt::format("region {:#x} +{} wraps around the address space", remote.addr,
                                               remote.length)));
    return remote;
}

Result<MemoryRegion> MemoryRegion::register_memory(const ProtectionDomain& pd, std::span<std::byte> memory,
                                                   Access access, std::source_location where) {
    require(!memory.empty(), where, "register_memory of an empty span");
    auto mr = register_with(pd.handle(where), memory, access, nullptr);
    if (!mr)
        return std::unexpected(std::move(mr.error()));
    ibv_mr* registration = mr->get();
    return MemoryRegion(std::move(*mr), registration, memory.data(), memory.size(), access);
}

namespace {

// The default huge page size (/proc/meminfo's Hugepagesize), 2 MiB when unknown.
std::size_t huge_page_size() {
    static const std::size_t size = [] {
        std::ifstream meminfo("/proc/meminfo");
        for (std::string key; meminfo >> key;) {
            std::size_t kib = 0;
            if (key == "Hugepagesize:" && meminfo >> kib && kib != 0)
                return kib * 1024;
            meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
        }
        return std::size_t{2} << 20;
    }();
    return size;
}

// An anonymous mapping of `length` bytes whose start is a multiple of `alignment`,
// unmapped when the last owner lets go. `flags` adds MAP_HUGETLB. `length` and
// `alignment` are multiples of the mapping's page size.
Result<std::shared_ptr<void>> map_aligned(std::size_t length, std::size_t alignment, int flags) {
    // a mapping starts on its own page size: beyond it, map more and trim
    const std::size_t natural =
        (flags & MAP_HUGETLB) ? huge_page_size() : static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t slack = alignment > natural ? alignment : 0;
    void* raw = ::mmap(nullptr, length + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (raw == MAP_FAILED)
        return std::unexpected(Error::from_last_errno("mmap", "{} bytes{}", length,
                                                      (flags & MAP_HUGETLB) ? " of hugetlbfs pages" : ""));
    auto* start = static_cast<std::byte*>(raw);
    if (slack != 0) {
        auto* aligned = reinterpret_cast<std::byte*>(
            (reinterpret_cast<std::uintptr_t>(start) + alignment - 1) / alignment * alignment);
        if (aligned != start)
            ::munmap(start, static_cast<std::size_t>(aligned - start));
        if (const std::size_t tail = static_cast<std::size_t>(start + length + slack - (aligned + length)); tail != 0)
            ::munmap(aligned + length, tail);
        start = aligned;
    }
    return std::shared_ptr<void>(start, [length](void* p) { ::munmap(p, length); });
}

// Memory for allocate(): aligned_alloc, or huge pages as `options` ask.
Result<std::shared_ptr<void>> allocate_memory(std::size_t& rounded, std::size_t alignment,
                                              const AllocateOptions& options) {
    // no object is larger (and the roundings below would wrap): a size that came from
    // a peer (a requested region) may be anything
    if (rounded > static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()))
        return std::unexpected(Error::from_errno("allocate", ENOMEM, fmt::format("{} bytes", rounded)));
    if (options.huge_pages == HugePages::no) {
        // aligned_alloc wants a size that is a multiple of the alignment
        rounded = (rounded + alignment - 1) / alignment * alignment;
        std::shared_ptr<void> memory(std::aligned_alloc(alignment, rounded), &std::free);
        if (!memory)
            return std::unexpected(Error::from_errno("aligned_alloc", ENOMEM, fmt::format("{} bytes", rounded)));
        return memory;
    }
    const std::size_t page = huge_page_size();
    rounded = (rounded + page - 1) / page * page;
    auto huge = map_aligned(rounded, std::max(page, alignment), MAP_HUGETLB);
    if (huge || options.huge_pages == HugePages::require)
        return huge;
    static std::once_flag said;
    std::call_once(said, [&] {
        logger()->info("no hugetlbfs pages ({}): allocations that prefer huge pages use normal pages, "
                       "backed by transparent huge pages where the kernel can",
                       huge.error());
    });
    auto normal = map_aligned(rounded, std::max(page, alignment), 0);
    if (normal)
        ::madvise(normal->get(), rounded, MADV_HUGEPAGE); // a hint: its failure changes nothing
    return normal;
}

} // namespace

Result<std::shared_ptr<ibv_mr>> detail::allocate_registered(const std::shared_ptr<ibv_pd>& pd, std::size_t size,
                                                            Access access, const AllocateOptions& options,
                                                            std::source_location where) {
    require(size > 0, where, "allocate of 0 bytes");
    const std::size_t alignment =
        options.alignment != 0 ? options.alignment : static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    require(std::has_single_bit(alignment), where, "alignment {} is not a power of two", alignment);
    std::size_t rounded = size;
    auto memory = allocate_memory(rounded, alignment, options);
    if (!memory)
        return std::unexpected(std::move(memory.error()));
    std::span<std::byte> bytes(static_cast<std::byte*>(memory->get()), size);
    // fresh mappings are zero already
    if (options.zeroed && options.huge_pages == HugePages::no)
        std::memset(bytes.data(), 0, bytes.size());
    return register_with(pd, bytes, access, std::move(*memory));
}

Result<MemoryRegion> MemoryRegion::allocate(const ProtectionDomain& pd, std::size_t size, Access access,
                                            AllocateOptions options, std::source_location where) {
    auto mr = detail::allocate_registered(pd.handle(where), size, access, options, where);
    if (!mr)
        return std::unexpected(std::move(mr.error()));
    ibv_mr* registration = mr->get();
    return MemoryRegion(std::move(*mr), registration, static_cast<std::byte*>(registration->addr), size, access);
}

MemoryRegion::MemoryRegion(MemoryRegion&& other) noexcept
    : own_(std::move(other.own_)), raw_(std::exchange(other.raw_, nullptr)), data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)), access_(other.access_), pool_(std::exchange(other.pool_, nullptr)),
      block_(other.block_) {}

MemoryRegion& MemoryRegion::operator=(MemoryRegion&& other) noexcept {
    if (this != &other) {
        give_back();
        own_ = std::move(other.own_);
        raw_ = std::exchange(other.raw_, nullptr);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        access_ = other.access_;
        pool_ = std::exchange(other.pool_, nullptr);
        block_ = other.block_;
    }
    return *this;
}

MemoryRegion::~MemoryRegion() { give_back(); }

std::uint32_t MemoryRegion::lkey(std::source_location where) const { return get(where)->lkey; }

std::uint32_t MemoryRegion::rkey(std::source_location where) const {
    require(!pooled(), where,
            "rkey of a pooled region: it would reach its whole arena; lend it through a memory window");
    return get(where)->rkey;
}

LocalSlice MemoryRegion::slice(std::size_t offset, std::size_t length, std::source_location where) const {
    get(where); // a moved-from region says so, not "out of range"
    require(offset <= size_ && length <= size_ - offset, where,
            "slice [{}, +{}) out of range of a {}-byte memory region", offset, length, size_);
    require(length <= std::numeric_limits<std::uint32_t>::max(), where,
            "slice of {} bytes: a scatter/gather entry holds at most 4 GiB - 1", length);
    return {data(where) + offset, static_cast<std::uint32_t>(length), lkey(where)};
}

LocalSlice MemoryRegion::all(std::source_location where) const { return slice(0, size_, where); }

RemoteMemory MemoryRegion::remote(std::source_location where) const {
    return {.addr = reinterpret_cast<std::uintptr_t>(data(where)), .length = size_, .rkey = rkey(where)};
}

} // namespace rdmaxx
