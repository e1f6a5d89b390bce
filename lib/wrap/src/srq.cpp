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
    // srq_limit is ignored by ibv_create_srq (ibv_create_srq(3)): the limit is armed below
    ibv_srq_init_attr init{};
    init.attr.max_wr = options.max_wr;
    init.attr.max_sge = options.max_sge;
    ibv_srq* raw = ibv_create_srq(pd_handle.get(), &init);
    if (!raw)
        return std::unexpected(Error::from_last_errno("ibv_create_srq"));
    auto srq = detail::adopt(raw, "ibv_destroy_srq", &ibv_destroy_srq, pd_handle);
    if (options.limit != 0) {
        ibv_srq_attr limit{};
        limit.srq_limit = options.limit;
        if (const int rc = ibv_modify_srq(raw, &limit, IBV_SRQ_LIMIT); rc != 0)
            return std::unexpected(Error::from_errno("ibv_modify_srq", rc, fmt::format("arming the limit {}", options.limit)));
    }
    // ibv_create_srq writes the sizes it granted back into init.attr
    return SharedReceiveQueue(std::move(srq), init.attr.max_wr, init.attr.max_sge);
}


const std::shared_ptr<ibv_srq>& SharedReceiveQueue::handle(std::source_location where) const {
    return detail::live(srq_, "SharedReceiveQueue", where);
}

} // namespace rdmaxx
