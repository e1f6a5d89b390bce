#include <rdmaxx/wrap/mw.hpp>

#include <rdmaxx/wrap/handle.hpp>

namespace rdmaxx {

Result<MemoryWindow> MemoryWindow::allocate(const ProtectionDomain& pd, std::source_location where) {
    const std::shared_ptr<ibv_pd>& pd_handle = pd.handle(where);
    ibv_mw* mw = ibv_alloc_mw(pd_handle.get(), IBV_MW_TYPE_2);
    if (!mw)
        return std::unexpected(Error::from_last_errno("ibv_alloc_mw", "a type 2 window on {}", pd.device(where)->name));
    return MemoryWindow(detail::adopt(mw, "ibv_dealloc_mw", &ibv_dealloc_mw, pd_handle));
}

std::uint32_t MemoryWindow::rkey(std::source_location where) const { return get(where)->rkey; }

} // namespace rdmaxx
