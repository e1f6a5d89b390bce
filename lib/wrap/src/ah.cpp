#include <rdmaxx/wrap/ah.hpp>

#include <rdmaxx/wrap/handle.hpp>
#include "path.hpp"

namespace rdmaxx {

Result<AddressHandle> AddressHandle::create(const QueuePair& via, const Endpoint& peer,
                                            const QpConnectOptions& options, std::source_location where) {
    const std::shared_ptr<ibv_pd>& pd = via.pd(where);
    require(via.type() == QpType::ud, where, "an address handle for a {} QP: only UD sends use one",
            to_string(via.type()));
    return create(pd, peer, via.gid(), via.port(), via.link_layer(), options, where);
}

Result<AddressHandle> AddressHandle::create(const std::shared_ptr<ibv_pd>& pd, const Endpoint& peer,
                                            const GidEntry& local, std::uint8_t port, LinkLayer layer,
                                            const QpConnectOptions& options, std::source_location where) {
    require(pd != nullptr, where, "an address handle in a null PD");
    if (auto ok = detail::check_address(peer, layer); !ok)
        return std::unexpected(std::move(ok.error()));
    if (layer != LinkLayer::infiniband) // the GRH's source
        if (auto ok = detail::check_gid_index(local.index, "ibv_create_ah"); !ok)
            return std::unexpected(std::move(ok.error()));
    ibv_ah_attr attr = detail::address_vector(peer, local, port, layer, options);
    ibv_ah* ah = ibv_create_ah(pd.get(), &attr);
    if (!ah)
        return std::unexpected(Error::from_last_errno("ibv_create_ah", "{}", peer.gid));
    return AddressHandle(detail::adopt(ah, "ibv_destroy_ah", &ibv_destroy_ah, pd));
}


} // namespace rdmaxx
