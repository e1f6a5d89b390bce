#include <rdmaxx/wrap/pool.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <utility>
#include <vector>

#include "registration.hpp"

namespace rdmaxx::detail {

// The pool's state, counted by the MemoryPool and every region it gave out (not
// atomically: a pool is used from one thread at a time): a region gives its block
// back here, and the last of them frees the arenas.
class PoolCore {
public:
    static constexpr unsigned classes = std::countr_zero(MemoryPool::max_block / MemoryPool::min_block) + 1;
    static constexpr std::uint32_t large = 0xff; // a block with an arena of its own
    static constexpr std::size_t run_bytes = std::size_t{256} << 10;

    PoolCore(std::shared_ptr<ibv_pd> pd, PoolOptions options, Access arena_access)
        : pd_(std::move(pd)), options_(options), arena_access_(arena_access) {}

    bool binds_windows() const noexcept { return has(arena_access_, Access::mw_bind); }
    PoolStats stats() const noexcept { return stats_; }

    Result<MemoryRegion> allocate(std::size_t size, Access access, bool zeroed, std::source_location where) {
        PoolCore& pool = *this;
        if (size > MemoryPool::max_block) {
            auto arena = pool.register_arena(size, zeroed, where);
            if (!arena)
                return std::unexpected(std::move(arena.error()));
            ++pool.stats_.regions;
            ++refs_;
            ibv_mr* registration = arena->get();
            auto* data = static_cast<std::byte*>(registration->addr);
            return MemoryRegion(std::move(*arena), registration, data, size, access, this, large);
        }
        const unsigned c = size <= MemoryPool::min_block
                               ? 0
                               : static_cast<unsigned>(std::bit_width(size - 1) - std::countr_zero(MemoryPool::min_block));
        std::vector<Block>& free = pool.free_[c];
        if (free.empty())
            if (auto ok = pool.carve(c, where); !ok)
                return std::unexpected(std::move(ok.error()));
        const Block block = free.back();
        free.pop_back();
        ++pool.stats_.regions;
        ++refs_;
        if (zeroed)
            std::memset(block.data, 0, size);
        return MemoryRegion(nullptr, pool.arenas_[block.arena].mr.get(), block.data, size, access, this,
                            block.arena << 8 | c);
    }

    // A region's block, back; may be the last reference.
    void release(std::byte* data, std::uint32_t block) noexcept {
        --stats_.regions;
        const std::uint32_t c = block & 0xff;
        if (c != large) // a large block's arena goes with its region
            free_[c].push_back({data, block >> 8});
        drop();
    }

    void drop() noexcept {
        if (--refs_ == 0)
            delete this;
    }

private:
    struct Block {
        std::byte* data;
        std::uint32_t arena;
    };
    struct Arena {
        std::shared_ptr<ibv_mr> mr;
        std::size_t used = 0; // bytes carved into runs, from the start
    };

    // `zeroed`: only normal pages need it (fresh mappings are zero already).
    Result<std::shared_ptr<ibv_mr>> register_arena(std::size_t bytes, bool zeroed, std::source_location where) {
        auto mr = allocate_registered(pd_, bytes, arena_access_,
                                      {.zeroed = zeroed, .alignment = run_bytes, .huge_pages = options_.huge_pages},
                                      where);
        if (mr)
            ++stats_.registrations;
        return mr;
    }

    // A run of class `c` blocks onto its free list, from the newest arena or a new one.
    Result<void> carve(unsigned c, std::source_location where) {
        const std::size_t block = MemoryPool::min_block << c;
        const std::size_t run = std::max(block, run_bytes);
        if (arenas_.empty() || arenas_.back().mr->length - arenas_.back().used < run) {
            auto mr = register_arena(options_.arena_bytes, false, where); // blocks are zeroed as handed out
            if (!mr)
                return std::unexpected(std::move(mr.error()));
            stats_.registered_bytes += (*mr)->length;
            arenas_.push_back({std::move(*mr)});
        }
        Arena& arena = arenas_.back();
        auto* start = static_cast<std::byte*>(arena.mr->addr) + arena.used;
        arena.used += run;
        const auto index = static_cast<std::uint32_t>(arenas_.size() - 1);
        std::vector<Block>& free = free_[c];
        for (std::size_t offset = run; offset != 0; offset -= block) // lowest address on top
            free.push_back({start + offset - block, index});
        return {};
    }

    std::shared_ptr<ibv_pd> pd_;
    PoolOptions options_;
    Access arena_access_;
    std::vector<Arena> arenas_;
    std::array<std::vector<Block>, classes> free_;
    PoolStats stats_;
    std::size_t refs_ = 1; // the MemoryPool's
};

void PoolDrop::operator()(PoolCore* core) const noexcept { core->drop(); }

} // namespace rdmaxx::detail

namespace rdmaxx {

// Here, where PoolCore is complete (MemoryRegion's other members are in mr.cpp).
void MemoryRegion::give_back() noexcept {
    if (pool_)
        std::exchange(pool_, nullptr)->release(data_, block_);
}

Result<MemoryPool> MemoryPool::create(const ProtectionDomain& pd, PoolOptions options, std::source_location where) {
    require(options.arena_bytes >= max_block, where, "a pool's arena_bytes {} is below its largest block, {}",
            options.arena_bytes, max_block);
    const bool windows = pd.device(where)->attributes.type2_windows;
    const Access access = windows ? Access::local_write | Access::mw_bind : Access::local_write;
    return MemoryPool(new detail::PoolCore(pd.handle(where), options, access));
}

Result<MemoryRegion> MemoryPool::allocate(std::size_t size, Access access, bool zeroed, std::source_location where) {
    require(size > 0, where, "allocate of 0 bytes");
    return detail::live(core_, "MemoryPool", where)->allocate(size, access, zeroed, where);
}

bool MemoryPool::binds_windows(std::source_location where) const {
    return detail::live(core_, "MemoryPool", where)->binds_windows();
}

PoolStats MemoryPool::stats(std::source_location where) const { return detail::live(core_, "MemoryPool", where)->stats(); }

} // namespace rdmaxx
