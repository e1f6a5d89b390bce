#include <rdmaxx/wrap/srq.hpp>

#include <fmt/format.h>

#include <rdmaxx/wrap/handle.hpp>

namespace rdmaxx {

Result<SharedReceiveQueue> SharedReceiveQueue::create(const ProtectionDomain& pd, SrqOptions options,
                                                      std::source_location where) {
    const std::shared_ptr<ibv_pd>& pd_handle = pd.handle(where);
    require(options.max_wr > 0 && options.max_sge > 0, where, "a shared receive queue with max_wr {}, max_sge {}",
            options.max_wr, options.max_sge);
    const ibv_device_attr& limits = pd.device(where)->attributes.raw;
    if (options.max_wr > static_cast<std::uint32_t>(limits.max_srq_wr) ||
        options.max_sge > static_cast<std::uint32_t>(limits.max_srq_sge))
        return std::unexpected(Error::from_errno(
            "ibv_create_srq", EINVAL,
            fmt::format("max_wr {} / max_sge {} above the device's max_srq_wr {} / max_srq_sge {}", options.max_wr,
                        options.max_sge, limits.max_srq_wr, limits.max_srq_sge)));
    ibv_srq_init_attr init{.srq_context = nullptr,
                           .attr = {.max_wr = options.max_wr, .max_sge = options.max_sge, .srq_limit = options.limit}};
    ibv_srq* srq = ibv_create_srq(pd_handle.get(), &init);
    if (!srq)
        return std::unexpected(Error::from_last_errno("ibv_create_srq"));
    // ibv_create_srq writes the sizes it granted back into init.attr
    return SharedReceiveQueue(detail::adopt(srq, "ibv_destroy_srq", &ibv_destroy_srq, pd_handle), init.attr.max_wr,
                              init.attr.max_sge);
}


const std::shared_ptr<ibv_srq>& SharedReceiveQueue::handle(std::source_location where) const {
    return detail::live(srq_, "SharedReceiveQueue", where);
}

} // namespace rdmaxx
