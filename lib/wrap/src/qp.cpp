#include <rdmaxx/wrap/qp.hpp>

#include <algorithm>
#include <random>

#include <fmt/format.h>

#include <rdmaxx/wrap/handle.hpp>
#include "path.hpp"

namespace rdmaxx {

std::string_view to_string(QpType type) noexcept {
    switch (type) {
    case QpType::rc: return "RC";
    case QpType::uc: return "UC";
    case QpType::ud: return "UD";
    }
    return "unknown";
}

std::string_view to_string(QpState state) noexcept {
    switch (state) {
    case QpState::reset: return "RESET";
    case QpState::init: return "INIT";
    case QpState::rtr: return "RTR";
    case QpState::rts: return "RTS";
    case QpState::sqd: return "SQD";
    case QpState::sqe: return "SQE";
    case QpState::error: return "ERR";
    case QpState::unknown: break;
    }
    return "unknown";
}

QpState qp_state_from_verbs(int state) noexcept {
    return state >= IBV_QPS_RESET && state <= IBV_QPS_ERR ? static_cast<QpState>(state) : QpState::unknown;
}

namespace detail {

Result<void> check_address(const Endpoint& peer, LinkLayer layer) {
    if (layer == LinkLayer::infiniband && peer.lid == 0)
        return std::unexpected(Error::from_errno("check_address", EINVAL, "peer LID 0 on InfiniBand"));
    if (layer != LinkLayer::infiniband && peer.gid.is_zero())
        return std::unexpected(Error::from_errno("check_address", EINVAL, "peer GID is zero on RoCE"));
    return {};
}

Result<void> check_peer(const Endpoint& peer, LinkLayer layer) {
    const auto bad = [](std::string what) {
        return std::unexpected(Error::from_errno("check_peer", EINVAL, std::move(what)));
    };
    if (peer.qpn > 0xffffff)
        return bad(fmt::format("peer QPN {:#x} is wider than 24 bits", peer.qpn));
    if (peer.psn > 0xffffff)
        return bad(fmt::format("peer PSN {:#x} is wider than 24 bits", peer.psn));
    if (peer.mtu == Mtu::unknown)
        return bad("peer MTU is unknown");
    return check_address(peer, layer);
}

ibv_ah_attr address_vector(const Endpoint& peer, const GidEntry& local, std::uint8_t port, LinkLayer layer,
                           const QpConnectOptions& options) {
    ibv_ah_attr ah{};
    ah.dlid = peer.lid;
    ah.sl = options.service_level;
    ah.port_num = port;
    // RoCE always routes by GID; InfiniBand inside one subnet routes by LID
    if (layer != LinkLayer::infiniband) {
        ah.is_global = 1;
        ah.grh.dgid = peer.gid.to_verbs();
        ah.grh.sgid_index = static_cast<std::uint8_t>(local.index);
        ah.grh.hop_limit = options.hop_limit;
        ah.grh.traffic_class = options.traffic_class;
    }
    return ah;
}

} // namespace detail

namespace {

std::uint32_t random_psn() {
    static thread_local std::mt19937 engine{std::random_device{}()};
    return engine() & 0xffffff;
}

Result<void> check_caps(const QpCaps& caps, bool with_srq, const ibv_device_attr& limits) {
    struct Cap {
        const char* name;
        std::uint32_t value;
        int limit;
        bool applies;
    };
    const Cap checked[] = {{"max_send_wr", caps.max_send_wr, limits.max_qp_wr, true},
                           {"max_send_sge", caps.max_send_sge, limits.max_sge, true},
                           {"max_recv_wr", caps.max_recv_wr, limits.max_qp_wr, !with_srq},
                           {"max_recv_sge", caps.max_recv_sge, limits.max_sge, !with_srq}};
    for (const Cap& cap : checked)
        if (cap.applies && cap.value > static_cast<std::uint32_t>(cap.limit))
            return std::unexpected(Error::from_errno(
                "ibv_create_qp", EINVAL, fmt::format("{} {} above the device's limit {}", cap.name, cap.value, cap.limit)));
    return {};
}

// Every operation the data layer posts on a QP of this type (an ibv_wr_* entry of an
// operation not asked for here is a null pointer in some providers: Soft-RoCE's).
std::uint64_t send_ops(QpType type, const DeviceAttributes& device) {
    std::uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    if (type != QpType::ud)
        ops |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
    if (type == QpType::rc) {
        ops |= IBV_QP_EX_WITH_RDMA_READ;
        if (device.atomics)
            ops |= IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
        if (device.type2_windows)
            ops |= IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
    }
    return ops;
}

ibv_qp_type to_verbs(QpType type) {
    switch (type) {
    case QpType::uc: return IBV_QPT_UC;
    case QpType::ud: return IBV_QPT_UD;
    case QpType::rc: break;
    }
    return IBV_QPT_RC;
}

} // namespace

Result<QueuePair> QueuePair::create(const ProtectionDomain& pd, const QpOptions& options,
                                    std::source_location where) {
    require(options.send_cq != nullptr && options.recv_cq != nullptr, where,
            "QpOptions needs both send_cq and recv_cq");
    const std::shared_ptr<ibv_pd>& pd_handle = pd.handle(where);
    const detail::DeviceHandle& device = pd.device(where);
    std::shared_ptr<ibv_cq> send_cq = options.send_cq->handle(where);
    std::shared_ptr<ibv_cq> recv_cq = options.recv_cq->handle(where);
    std::shared_ptr<ibv_srq> srq = options.srq ? options.srq->handle(where) : nullptr;

    if (auto ok = check_caps(options.caps, srq != nullptr, device->attributes.raw); !ok)
        return std::unexpected(std::move(ok.error()));
    auto port = detail::query_port(*device, options.port);
    if (!port)
        return std::unexpected(std::move(port.error()));
    auto gid = detail::choose_gid(*device, options.port, options.gid_index);
    if (!gid)
        return std::unexpected(std::move(gid.error()));

    ibv_qp_init_attr_ex init{};
    init.send_cq = send_cq.get();
    init.recv_cq = recv_cq.get();
    init.srq = srq.get();
    init.cap = {.max_send_wr = options.caps.max_send_wr,
                .max_recv_wr = srq ? 0 : options.caps.max_recv_wr,
                .max_send_sge = options.caps.max_send_sge,
                .max_recv_sge = srq ? 0 : options.caps.max_recv_sge,
                .max_inline_data = options.caps.max_inline_data};
    init.qp_type = to_verbs(options.type);
    init.sq_sig_all = options.signal_all ? 1 : 0;
    init.comp_mask = IBV_QP_INIT_ATTR_PD;
    init.pd = pd_handle.get();
    ibv_qp* raw = nullptr;
    bool with_send_ops = false;
    if (options.post_api == PostApi::extended) {
        ibv_qp_init_attr_ex extended = init;
        extended.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        extended.send_ops_flags = send_ops(options.type, device->attributes);
        raw = ibv_create_qp_ex(device->context, &extended);
        if (!raw)
            return std::unexpected(Error::from_last_errno(
                "ibv_create_qp_ex", "{} QP with the extended post API", options.type));
        with_send_ops = true;
        init.cap = extended.cap;
    } else {
        raw = ibv_create_qp_ex(device->context, &init);
    }
    if (!raw)
        return std::unexpected(Error::from_last_errno(
            "ibv_create_qp", "{} QP: send {} WRs x {} SGEs, recv {} x {}, inline {}", options.type,
            init.cap.max_send_wr, init.cap.max_send_sge, init.cap.max_recv_wr, init.cap.max_recv_sge,
            init.cap.max_inline_data));

    QueuePair qp;
    qp.device_ = device;
    qp.pd_ = pd_handle;
    // only a QP created with send_ops_flags has working ibv_wr_* entries
    qp.extended_ = detail::OwnedElsewhere<ibv_qp_ex>(with_send_ops ? ibv_qp_to_qp_ex(raw) : nullptr);
    qp.qp_ = detail::adopt(raw, "ibv_destroy_qp", &ibv_destroy_qp, pd_handle, std::move(send_cq),
                           std::move(recv_cq), std::move(srq));
    // ibv_create_qp writes the capabilities it granted back into init.cap
    qp.caps_ = {.max_send_wr = init.cap.max_send_wr,
                .max_recv_wr = init.cap.max_recv_wr,
                .max_send_sge = init.cap.max_send_sge,
                .max_recv_sge = init.cap.max_recv_sge,
                .max_inline_data = init.cap.max_inline_data};
    qp.local_ = {.qpn = raw->qp_num, .psn = random_psn(), .gid = gid->gid, .lid = port->lid, .mtu = port->active_mtu};
    qp.gid_ = *gid;
    qp.type_ = options.type;
    qp.port_ = options.port;
    qp.pkey_index_ = options.pkey_index;
    qp.qkey_ = options.qkey;
    qp.remote_access_ = options.type == QpType::uc ? options.remote_access & Access::remote_write
                                                   : options.remote_access;
    qp.link_layer_ = port->link_layer;
    qp.has_srq_ = options.srq != nullptr;
    qp.signals_all_ = options.signal_all;
    return qp;
}

Result<void> QueuePair::transition(ibv_qp_attr& attr, int mask, const char* step) {
    if (const int rc = ibv_modify_qp(qp_.get(), &attr, mask); rc != 0)
        return std::unexpected(Error::from_errno(
            "ibv_modify_qp", rc,
            fmt::format("{} QP {:#x}: {} -> {}", to_string(type_), local_.qpn, to_string(state_), step)));
    state_ = qp_state_from_verbs(attr.qp_state);
    return {};
}

Result<void> QueuePair::to_init(std::source_location where) {
    get(where);
    require(state_ == QpState::reset, where, "to_init() on a QP in state {}, not RESET", to_string(state_));
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = pkey_index_;
    attr.port_num = port_;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (type_ == QpType::ud) {
        attr.qkey = qkey_;
        mask |= IBV_QP_QKEY;
    } else {
        attr.qp_access_flags = static_cast<unsigned>(remote_access_);
        mask |= IBV_QP_ACCESS_FLAGS;
    }
    return transition(attr, mask, "INIT");
}

Result<void> QueuePair::to_rtr(const Endpoint& peer, const QpConnectOptions& options, std::source_location where) {
    get(where);
    require(type_ != QpType::ud, where, "to_rtr(peer) on a UD QP: use activate()");
    require(state_ == QpState::init, where, "to_rtr() on a QP in state {}, not INIT", to_string(state_));
    require(options.min_rnr_timer <= 31, where, "min_rnr_timer {} above 31", options.min_rnr_timer);
    if (auto ok = detail::check_peer(peer, link_layer_); !ok)
        return ok;
    const Mtu mtu = options.path_mtu.value_or(std::min(local_.mtu, peer.mtu));
    if (mtu == Mtu::unknown || mtu > local_.mtu)
        return std::unexpected(Error::from_errno(
            "to_rtr", EINVAL,
            fmt::format("path MTU {} above the port's active MTU {}", to_string(mtu), to_string(local_.mtu))));

    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(mtu);
    attr.dest_qp_num = peer.qpn;
    attr.rq_psn = peer.psn;
    attr.ah_attr = detail::address_vector(peer, gid_, port_, link_layer_, options);
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (type_ == QpType::rc) {
        const int device_max = device_->attributes.raw.max_qp_rd_atom;
        attr.max_dest_rd_atomic = options.max_dest_rd_atomic.value_or(static_cast<std::uint8_t>(std::min(device_max, 255)));
        attr.min_rnr_timer = options.min_rnr_timer;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    return transition(attr, mask, "RTR");
}

Result<void> QueuePair::to_rts(const QpConnectOptions& options, std::source_location where) {
    get(where);
    require(state_ == QpState::rtr, where, "to_rts() on a QP in state {}, not RTR", to_string(state_));
    require(options.ack_timeout <= 31, where, "ack_timeout {} above 31", options.ack_timeout);
    require(options.retry_cnt <= 7 && options.rnr_retry <= 7, where, "retry_cnt {} / rnr_retry {} above 7",
            options.retry_cnt, options.rnr_retry);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = local_.psn;
    int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (type_ == QpType::rc) {
        const int device_max = device_->attributes.raw.max_qp_init_rd_atom;
        attr.timeout = options.ack_timeout;
        attr.retry_cnt = options.retry_cnt;
        attr.rnr_retry = options.rnr_retry;
        attr.max_rd_atomic = options.max_rd_atomic.value_or(static_cast<std::uint8_t>(std::min(device_max, 255)));
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    return transition(attr, mask, "RTS");
}

Result<void> QueuePair::connect(const Endpoint& peer, const QpConnectOptions& options, std::source_location where) {
    get(where);
    require(type_ != QpType::ud, where, "connect() on a UD QP: use activate()");
    require(state_ == QpState::reset, where, "connect() on a QP in state {}, not RESET", to_string(state_));
    // a bad peer is refused before the device is touched (a failed step later is
    // undone: back_to_reset_if_failed)
    if (auto ok = detail::check_peer(peer, link_layer_); !ok)
        return ok;
    auto connected = to_init(where);
    if (connected)
        connected = to_rtr(peer, options, where);
    if (connected)
        connected = to_rts(options, where);
    return back_to_reset_if_failed(std::move(connected), where);
}

// A failed connect() or activate() leaves the QP in RESET, where it may be tried again
// (the step it failed in is in the Error). A QP the device will not reset either is
// reported with both failures.
Result<void> QueuePair::back_to_reset_if_failed(Result<void> done, std::source_location where) {
    if (done || state_ == QpState::reset)
        return done;
    if (auto reset_done = reset(where); !reset_done)
        return std::unexpected(Error(done.error().kind(), done.error().call(), done.error().code(),
                                     fmt::format("{}; then back to RESET failed: {}", done.error().detail(),
                                                 reset_done.error().message())));
    return done;
}

Result<void> QueuePair::activate(std::source_location where) {
    get(where);
    require(type_ == QpType::ud, where, "activate() on a {} QP: use connect(peer)", to_string(type_));
    require(state_ == QpState::reset, where, "activate() on a QP in state {}, not RESET", to_string(state_));
    auto active = to_init(where);
    if (active) {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_RTR;
        active = transition(attr, IBV_QP_STATE, "RTR");
    }
    if (active)
        active = to_rts({}, where);
    return back_to_reset_if_failed(std::move(active), where);
}

Result<void> QueuePair::to_error(std::source_location where) {
    get(where);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    return transition(attr, IBV_QP_STATE, "ERR");
}

Result<void> QueuePair::reset(std::source_location where) {
    get(where);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RESET;
    return transition(attr, IBV_QP_STATE, "RESET");
}

Result<void> QueuePair::modify(ibv_qp_attr& attr, int mask, std::source_location where) {
    get(where);
    if (const int rc = ibv_modify_qp(qp_.get(), &attr, mask); rc != 0)
        return std::unexpected(Error::from_errno("ibv_modify_qp", rc, fmt::format("mask {:#x}", mask)));
    if (mask & IBV_QP_STATE)
        state_ = qp_state_from_verbs(attr.qp_state);
    return {};
}

Result<QpState> QueuePair::query_state(std::source_location where) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (const int rc = ibv_query_qp(get(where), &attr, IBV_QP_STATE, &init); rc != 0)
        return std::unexpected(Error::from_errno("ibv_query_qp", rc));
    state_ = qp_state_from_verbs(attr.qp_state);
    return state_;
}


const std::shared_ptr<ibv_pd>& QueuePair::pd(std::source_location where) const {
    return detail::live(pd_, "QueuePair", where);
}

} // namespace rdmaxx
