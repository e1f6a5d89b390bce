#include <rdmaxx/mlx5dv/dc.hpp>

#include <algorithm>
#include <random>

#include <fmt/format.h>

#include <rdmaxx/wrap/handle.hpp>

#include "unsupported.hpp"

#if RDMAXX_HAVE_MLX5DV
#include <infiniband/mlx5dv.h>
#endif

// Only creation and the DC address of a WR need mlx5dv; the state transitions and the
// rest of posting are plain verbs (unreachable without mlx5dv: no DC QP exists there).

namespace rdmaxx::mlx5 {
namespace {

#if RDMAXX_HAVE_MLX5DV
// A DC QP as mlx5dv_create_qp(3) made it, with the port and GID it starts from.
struct DcQp {
    ibv_qp* qp;
    PortAttributes port;
    GidEntry gid;
};

// mlx5dv_create_qp(3): qp_type IBV_QPT_DRIVER in `pd`, `cq` for sends and receives,
// the DC type in `dc`; `init` carries what differs (SRQ, caps, send ops). A device
// that is not an mlx5 device is told first, before anything is created.
Result<DcQp> create_dc_qp(const rdmaxx::detail::DeviceState& device, ibv_pd* pd, ibv_cq* cq, std::uint8_t port,
                          std::optional<std::uint32_t> gid_index, ibv_qp_init_attr_ex init,
                          const mlx5dv_dc_init_attr& dc, const char* what) {
    if (!mlx5dv_is_supported(device.context->device))
        return std::unexpected(unsupported::not_mlx5("mlx5dv_create_qp", device.name));
    auto attributes = rdmaxx::detail::query_port(device, port);
    if (!attributes)
        return std::unexpected(std::move(attributes.error()));
    auto gid = rdmaxx::detail::choose_gid(device, port, gid_index);
    if (!gid)
        return std::unexpected(std::move(gid.error()));
    init.qp_type = IBV_QPT_DRIVER;
    init.send_cq = cq;
    init.recv_cq = cq;
    init.comp_mask |= IBV_QP_INIT_ATTR_PD;
    init.pd = pd;
    mlx5dv_qp_init_attr dv{};
    dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
    dv.dc_init_attr = dc;
    ibv_qp* qp = mlx5dv_create_qp(device.context, &init, &dv);
    if (!qp)
        return std::unexpected(Error::from_last_errno("mlx5dv_create_qp", "{} on {}", what, device.name));
    return DcQp{.qp = qp, .port = *attributes, .gid = *gid};
}

std::uint64_t random_key() {
    std::random_device random;
    return std::uint64_t{random()} << 32 | random();
}
#endif

// One ibv_modify_qp step; `state` follows on success.
Result<void> step(ibv_qp* qp, ibv_qp_attr& attr, int mask, QpState& state, const char* what) {
    if (const int rc = ibv_modify_qp(qp, &attr, mask); rc != 0)
        return std::unexpected(Error::from_errno(
            "ibv_modify_qp", rc,
            fmt::format("{} {:#x}: {} -> {}", what, qp->qp_num, to_string(state),
                        to_string(qp_state_from_verbs(attr.qp_state)))));
    state = qp_state_from_verbs(attr.qp_state);
    return {};
}

} // namespace

Result<DcTarget> DcTarget::create(const ProtectionDomain& pd, const DcTargetOptions& options,
                                  std::source_location where) {
    require(options.cq != nullptr && options.srq != nullptr, where, "DcTargetOptions needs a cq and an srq");
    const std::shared_ptr<ibv_pd>& pd_handle = pd.handle(where);
    const rdmaxx::detail::DeviceHandle& device = pd.device(where);
    std::shared_ptr<ibv_cq> cq = options.cq->handle(where);
    std::shared_ptr<ibv_srq> srq = options.srq->handle(where);
#if RDMAXX_HAVE_MLX5DV
    // a DCT has no queues of its own: receives come from the SRQ, and it never sends
    ibv_qp_init_attr_ex init{};
    init.srq = srq.get();
    mlx5dv_dc_init_attr dc{};
    dc.dc_type = MLX5DV_DCTYPE_DCT;
    dc.dct_access_key = options.access_key ? *options.access_key : random_key(); // value_or would draw one anyway
    auto created = create_dc_qp(*device, pd_handle.get(), cq.get(), options.port, options.gid_index, init, dc,
                                "DC target");
    if (!created)
        return std::unexpected(std::move(created.error()));

    DcTarget target;
    target.qp_ = rdmaxx::detail::adopt(created->qp, "ibv_destroy_qp", &ibv_destroy_qp, pd_handle, std::move(cq),
                                       std::move(srq));
    target.options_ = options;
    target.options_.cq = nullptr;
    target.options_.srq = nullptr;
    target.access_key_ = dc.dct_access_key;
    target.port_ = created->port;
    target.gid_ = created->gid;
    return target;
#else
    (void)pd_handle, (void)device;
    return std::unexpected(unsupported::no_mlx5dv("mlx5::DcTarget::create"));
#endif
}

Result<void> DcTarget::activate(std::source_location where) {
    ibv_qp* qp = get(where);
    require(state_ == QpState::reset, where, "DcTarget::activate() in state {}, not RESET", to_string(state_));
    require(options_.min_rnr_timer <= 31, where, "min_rnr_timer {} above 31", options_.min_rnr_timer);
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = options_.pkey_index;
    init.port_num = options_.port;
    init.qp_access_flags = static_cast<unsigned>(options_.remote_access);
    if (auto ok = step(qp, init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, state_,
                       "DC target");
        !ok) {
        // the mlx5 driver refuses remote atomics on a DCT of a device without DC atomics
        if (ok.error().is_errno(EOPNOTSUPP) && has(options_.remote_access, Access::remote_atomic))
            return std::unexpected(Error::unsupported(
                "ibv_modify_qp", "the device has no DC atomics: leave remote_atomic out of remote_access"));
        return ok;
    }
    // The AV is this DCT's own address (the GID it answers from, traffic class, hop
    // limit); the path MTU bounds its READ responses.
    ibv_qp_attr rtr{};
    rtr.qp_state = IBV_QPS_RTR;
    rtr.path_mtu = static_cast<ibv_mtu>(port_.active_mtu);
    rtr.min_rnr_timer = options_.min_rnr_timer;
    rtr.ah_attr.port_num = options_.port;
    if (port_.link_layer != LinkLayer::infiniband) {
        rtr.ah_attr.is_global = 1;
        rtr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_.index);
        rtr.ah_attr.grh.traffic_class = options_.traffic_class;
        rtr.ah_attr.grh.hop_limit = options_.hop_limit;
    }
    return step(qp, rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER, state_, "DC target");
}

DcEndpoint DcTarget::endpoint(std::source_location where) const {
    const ibv_qp* qp = get(where);
    require(state_ == QpState::rtr, where, "DcTarget::endpoint() in state {}: the DCT number exists from RTR on",
            to_string(state_));
    return {.dctn = qp->qp_num, .dc_key = access_key_, .gid = gid_.gid, .lid = port_.lid, .mtu = port_.active_mtu};
}


Result<DcInitiator> DcInitiator::create(const ProtectionDomain& pd, const DcInitiatorOptions& options,
                                        std::source_location where) {
    require(options.cq != nullptr, where, "DcInitiatorOptions needs a cq");
    const std::shared_ptr<ibv_pd>& pd_handle = pd.handle(where);
    const rdmaxx::detail::DeviceHandle& device = pd.device(where);
    std::shared_ptr<ibv_cq> cq = options.cq->handle(where);
#if RDMAXX_HAVE_MLX5DV
    // a send queue only; the ibv_wr_* API (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) is the
    // only way to set a WR's DC address (mlx5dv_wr_post(3))
    ibv_qp_init_attr_ex init{};
    init.cap = {.max_send_wr = options.max_send_wr,
                .max_recv_wr = 0,
                .max_send_sge = options.max_send_sge,
                .max_recv_sge = 0,
                .max_inline_data = options.max_inline_data};
    init.sq_sig_all = options.signal_all ? 1 : 0;
    init.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    const bool atomics = device->attributes.atomics;
    init.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ;
    if (atomics)
        init.send_ops_flags |= IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    mlx5dv_dc_init_attr dc{};
    dc.dc_type = MLX5DV_DCTYPE_DCI;
    auto created = create_dc_qp(*device, pd_handle.get(), cq.get(), options.port, options.gid_index, init, dc,
                                "DC initiator");
    if (!created)
        return std::unexpected(std::move(created.error()));

    DcInitiator initiator;
    initiator.pd_ = pd_handle;
    initiator.extended_ = ibv_qp_to_qp_ex(created->qp);
    initiator.qp_ = rdmaxx::detail::adopt(created->qp, "ibv_destroy_qp", &ibv_destroy_qp, pd_handle, std::move(cq));
    initiator.options_ = options;
    initiator.options_.cq = nullptr;
    initiator.port_ = created->port;
    initiator.gid_ = created->gid;
    initiator.atomics_ = atomics;
    initiator.device_max_rd_atomic_ =
        static_cast<std::uint8_t>(std::clamp(device->attributes.raw.max_qp_init_rd_atom, 0, 255));
    return initiator;
#else
    (void)pd_handle, (void)device;
    return std::unexpected(unsupported::no_mlx5dv("mlx5::DcInitiator::create"));
#endif
}

Result<void> DcInitiator::activate(const QpConnectOptions& options, std::source_location where) {
    ibv_qp* qp = get(where);
    require(state_ == QpState::reset, where, "DcInitiator::activate() in state {}, not RESET", to_string(state_));
    require(options.ack_timeout <= 31, where, "ack_timeout {} above 31", options.ack_timeout);
    require(options.retry_cnt <= 7 && options.rnr_retry <= 7, where, "retry_cnt {} / rnr_retry {} above 7",
            options.retry_cnt, options.rnr_retry);
    const Mtu mtu = options.path_mtu.value_or(port_.active_mtu);
    if (mtu == Mtu::unknown || mtu > port_.active_mtu)
        return std::unexpected(Error::from_errno("DcInitiator::activate", EINVAL,
                                                 fmt::format("path MTU {} above the port's active MTU {}",
                                                             to_string(mtu), to_string(port_.active_mtu))));
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = options_.pkey_index;
    init.port_num = options_.port;
    if (auto ok = step(qp, init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT, state_, "DC initiator"); !ok)
        return ok;
    // no destination QPN, PSN or AV: every WR names its DCT
    ibv_qp_attr rtr{};
    rtr.qp_state = IBV_QPS_RTR;
    rtr.path_mtu = static_cast<ibv_mtu>(mtu);
    if (auto ok = step(qp, rtr, IBV_QP_STATE | IBV_QP_PATH_MTU, state_, "DC initiator"); !ok)
        return ok;
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    rts.timeout = options.ack_timeout;
    rts.retry_cnt = options.retry_cnt;
    rts.rnr_retry = options.rnr_retry;
    rts.sq_psn = 0; // DC keeps sequence numbers per connection it makes, not per QP
    rts.max_rd_atomic = options.max_rd_atomic.value_or(device_max_rd_atomic_);
    if (auto ok = step(qp, rts,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC,
                       state_, "DC initiator");
        !ok)
        return ok;
    path_mtu_ = mtu;
    return {};
}

Result<DcDestination> DcInitiator::destination(const DcEndpoint& peer, const QpConnectOptions& options,
                                               std::source_location where) const {
    get(where);
    require(state_ == QpState::rts, where, "DcInitiator::destination() in state {}, not RTS", to_string(state_));
    if (peer.mtu < path_mtu_)
        return std::unexpected(Error::from_errno(
            "DcInitiator::destination", EINVAL,
            fmt::format("DCT {:#x} has MTU {}, below this initiator's path MTU {}", peer.dctn, to_string(peer.mtu),
                        to_string(path_mtu_))));
    const Endpoint address{.qpn = peer.dctn, .psn = 0, .gid = peer.gid, .lid = peer.lid, .mtu = peer.mtu};
    auto ah = AddressHandle::create(pd_, address, gid_, options_.port, port_.link_layer, options, where);
    if (!ah)
        return std::unexpected(std::move(ah.error()));
    return DcDestination(std::move(*ah), peer);
}

Result<void> DcInitiator::write(const DcDestination& to, const LocalSlice& local, const RemoteMemory& remote,
                                DcPost post, std::source_location where) {
    return this->post(to, IBV_WR_RDMA_WRITE, local, remote, 0, 0, post, where);
}

Result<void> DcInitiator::read(const DcDestination& to, const LocalSlice& local, const RemoteMemory& remote,
                               DcPost post, std::source_location where) {
    return this->post(to, IBV_WR_RDMA_READ, local, remote, 0, 0, post, where);
}

Result<void> DcInitiator::fetch_add(const DcDestination& to, const LocalSlice& local, const RemoteMemory& remote,
                                    std::uint64_t add, DcPost post, std::source_location where) {
    return this->post(to, IBV_WR_ATOMIC_FETCH_AND_ADD, local, remote, add, 0, post, where);
}

Result<void> DcInitiator::compare_swap(const DcDestination& to, const LocalSlice& local, const RemoteMemory& remote,
                                       std::uint64_t compare, std::uint64_t swap, DcPost post,
                                       std::source_location where) {
    return this->post(to, IBV_WR_ATOMIC_CMP_AND_SWP, local, remote, compare, swap, post, where);
}

Result<void> DcInitiator::post(const DcDestination& to, ibv_wr_opcode opcode, const LocalSlice& local,
                               const RemoteMemory& remote, std::uint64_t compare_add, std::uint64_t swap,
                               DcPost post, std::source_location where) {
    get(where);
    require(state_ == QpState::rts, where, "posting on a DC initiator in state {}, not RTS", to_string(state_));
    const bool atomic = opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
    if (atomic)
        require(local.size() == 8 && remote.length >= 8 && remote.addr % 8 == 0, where,
                "an atomic needs an 8-byte local slice (got {}) and an 8-byte aligned remote word (got {:#x} +{})",
                local.size(), remote.addr, remote.length);
    else
        require(remote.length >= local.size(), where, "{} bytes to or from a {}-byte remote region", local.size(),
                remote.length);
    ibv_ah* ah = to.address_handle(where);
    require(ah->pd == pd_.get(), where, "a DcDestination made in another PD than this DC initiator's");
#if RDMAXX_HAVE_MLX5DV
    if (atomic && !atomics_)
        return std::unexpected(Error::unsupported("ibv_wr_atomic", "the device executes no atomics"));
    // ibv_wr_post(3) and mlx5dv_wr_post(3): start, one builder, its SGE, the DC address, complete
    ibv_wr_start(extended_);
    extended_->wr_id = post.wr_id;
    extended_->wr_flags = post.signaled ? IBV_SEND_SIGNALED : 0;
    switch (opcode) {
    case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(extended_, remote.rkey, remote.addr); break;
    case IBV_WR_RDMA_READ: ibv_wr_rdma_read(extended_, remote.rkey, remote.addr); break;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wr_atomic_fetch_add(extended_, remote.rkey, remote.addr, compare_add); break;
    default: // IBV_WR_ATOMIC_CMP_AND_SWP, the only other opcode the public calls pass
        ibv_wr_atomic_cmp_swp(extended_, remote.rkey, remote.addr, compare_add, swap); break;
    }
    ibv_wr_set_sge(extended_, local.lkey(), reinterpret_cast<std::uintptr_t>(local.data()), local.size());
    mlx5dv_wr_set_dc_addr(mlx5dv_qp_ex_from_ibv_qp_ex(extended_), ah, to.endpoint().dctn, to.endpoint().dc_key);
    if (const int rc = ibv_wr_complete(extended_); rc != 0)
        return std::unexpected(Error::from_errno("ibv_wr_complete", rc, fmt::format("DC initiator {:#x} to DCT {:#x}",
                                                                                   extended_->qp_base.qp_num,
                                                                                   to.endpoint().dctn)));
    return {};
#else
    (void)ah, (void)compare_add, (void)swap, (void)post;
    return std::unexpected(unsupported::no_mlx5dv("mlx5::DcInitiator::post"));
#endif
}


} // namespace rdmaxx::mlx5
