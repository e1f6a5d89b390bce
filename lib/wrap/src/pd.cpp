#include <rdmaxx/wrap/pd.hpp>

#include <rdmaxx/wrap/handle.hpp>

namespace rdmaxx {

Result<ProtectionDomain> ProtectionDomain::create(const Context& context, std::source_location where) {
    const detail::DeviceHandle& device = context.handle(where);
    ibv_pd* pd = ibv_alloc_pd(device->context);
    if (!pd)
        return std::unexpected(Error::from_last_errno("ibv_alloc_pd", "{}", device->name));
    return ProtectionDomain(device, detail::adopt(pd, "ibv_dealloc_pd", &ibv_dealloc_pd, device));
}


const std::shared_ptr<ibv_pd>& ProtectionDomain::handle(std::source_location where) const {
    return detail::live(pd_, "ProtectionDomain", where);
}

const detail::DeviceHandle& ProtectionDomain::device(std::source_location where) const {
    return detail::live(device_, "ProtectionDomain", where);
}

} // namespace rdmaxx
