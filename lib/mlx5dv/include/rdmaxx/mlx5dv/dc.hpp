/// @file
/// The mlx5 Dynamically Connected transport: one DC initiator (DCI) reaches any number
/// of DC targets (DCTs), each work request naming its target, with no per-peer QP.
///
/// Follows rdma-core's man pages: mlx5dv_create_qp(3) for creation (qp_type
/// IBV_QPT_DRIVER, MLX5DV_QP_INIT_ATTR_MASK_DC), ibv_wr_post(3) and mlx5dv_wr_post(3)
/// for posting (ibv_wr_start, a builder, ibv_wr_set_sge, mlx5dv_wr_set_dc_addr,
/// ibv_wr_complete). The attribute masks of the state transitions are the ones the
/// mlx5 kernel driver requires (and rdma-core's pyverbs Mlx5QP uses):
/// @code{.unparsed}
///   DCT  RESET->INIT  STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
///        INIT->RTR    STATE | AV | PATH_MTU | MIN_RNR_TIMER      (a DCT never sends)
///   DCI  RESET->INIT  STATE | PKEY_INDEX | PORT
///        INIT->RTR    STATE | PATH_MTU                           (no remote QPN or PSN)
///        RTR->RTS     STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC
/// @endcode
///
/// The same declarations in every build: without mlx5dv every call is an Error of kind
/// unsupported ("no mlx5dv support"), on a device that is not an mlx5 device one that
/// says so. Every object holds its parents (PD, CQ, SRQ, address handle) alive.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/mlx5dv/dc_endpoint.hpp>
#include <rdmaxx/wrap/ah.hpp>
#include <rdmaxx/wrap/cq.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pd.hpp>
#include <rdmaxx/wrap/qp.hpp>
#include <rdmaxx/wrap/srq.hpp>

namespace rdmaxx::mlx5 {

/// How DcTarget::create makes a DCT.
struct DcTargetOptions {
    const CompletionQueue* cq = nullptr;      ///< required: where the DCT's completions go
    const SharedReceiveQueue* srq = nullptr;  ///< required: a DCT receives only through an SRQ
    std::optional<std::uint64_t> access_key{}; ///< default: random; initiators must present it
    /// What initiators may do to this PD's memory through the DCT.
    Access remote_access = Access::remote_write | Access::remote_read | Access::remote_atomic;
    std::uint8_t port = 1;                    ///< the port it answers on
    std::optional<std::uint32_t> gid_index{}; ///< default: Context::choose_gid
    std::uint16_t pkey_index = 0;             ///< its P_Key table index
    std::uint8_t min_rnr_timer = 12;          ///< 0.64 ms; at most 31
    std::uint8_t traffic_class = 0;           ///< of its address (not on InfiniBand)
    std::uint8_t hop_limit = 64;              ///< of its address (not on InfiniBand)
};

/// A DC target: the receiving end, reached by any DCI that knows its endpoint().
/// Move-only; it keeps its PD, CQ and SRQ alive.
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class DcTarget : detail::MoveOnly {
public:
    /// A DCT in RESET, with its access key (options.access_key, or a random one).
    /// @errors A device that is not an mlx5 device, or a build without mlx5dv
    /// (unsupported); the port's or GID's query; mlx5dv_create_qp's failure (its errno).
    /// @misuse A moved-from PD, CQ or SRQ; a missing CQ or SRQ.
    static Result<DcTarget> create(const ProtectionDomain& pd, const DcTargetOptions& options,
                                   std::source_location where = std::source_location::current());

    /// RESET -> INIT -> RTR, its last state. The mlx5 provider assigns the DCT number
    /// in the move to RTR, so endpoint() is valid only afterwards.
    /// @errors ibv_modify_qp's refusal of a step (its errno); remote atomics on a
    /// device without DC atomics are an Error of kind unsupported.
    /// @misuse A moved-from DcTarget; not in RESET, min_rnr_timer above 31.
    Result<void> activate(std::source_location where = std::source_location::current());

    /// What to send to initiators.
    /// @misuse A moved-from DcTarget; before activate() succeeded.
    DcEndpoint endpoint(std::source_location where = std::source_location::current()) const;
    /// RESET, then what activate() reached (RTR once it succeeded).
    QpState state() const noexcept { return state_; }
    /// The verbs QP. @misuse A moved-from DcTarget.
    ibv_qp* get(std::source_location where = std::source_location::current()) const {
        return rdmaxx::detail::live(qp_, "DcTarget", where).get();
    }

private:
    DcTarget() = default;
    std::shared_ptr<ibv_qp> qp_; // keeps PD, CQ and SRQ alive
    DcTargetOptions options_{};  // without cq and srq: qp_ holds them
    std::uint64_t access_key_ = 0;
    GidEntry gid_{};
    PortAttributes port_{};
    QpState state_ = QpState::reset;
};

/// How DcInitiator::create makes a DCI.
struct DcInitiatorOptions {
    const CompletionQueue* cq = nullptr; ///< required: send completions (a DCI receives nothing)
    std::uint32_t max_send_wr = 128;     ///< send queue entries
    std::uint32_t max_send_sge = 1;      ///< scatter/gather entries per WR (a post uses one)
    std::uint32_t max_inline_data = 0;   ///< inline bytes per WR asked of the device
    bool signal_all = false;              ///< every WR completes with a CQE
    std::uint8_t port = 1;                ///< the port it sends from
    std::optional<std::uint32_t> gid_index{}; ///< default: Context::choose_gid
    std::uint16_t pkey_index = 0;         ///< its P_Key table index
};

/// A DCT as one DCI addresses it: an address handle, the DCT number and its key.
/// Made by DcInitiator::destination; usable by any DCI of the same PD.
/// Move-only; it keeps its PD alive.
/// @threadsafety Distinct objects: safe. Shared objects: safe (its calls only read it;
/// DCIs on several threads may post to one destination).
class DcDestination : detail::MoveOnly {
public:
    /// The DCT it reaches.
    const DcEndpoint& endpoint() const noexcept { return peer_; }
    /// The address handle towards the DCT.
    /// @misuse A moved-from DcDestination.
    ibv_ah* address_handle(std::source_location where = std::source_location::current()) const {
        return ah_.get(where);
    }

private:
    friend class DcInitiator;
    DcDestination(AddressHandle ah, const DcEndpoint& peer) : ah_(std::move(ah)), peer_(peer) {}
    AddressHandle ah_; // keeps the PD alive
    DcEndpoint peer_;
};

/// Per work request: its id in the completion, and whether it makes one.
struct DcPost {
    std::uint64_t wr_id = 0; ///< the completion's wr_id
    bool signaled = true;    ///< whether it completes with a CQE (always, with signal_all)
};

/// A DC initiator: sends RDMA WRITE, READ and atomics to any DCT, one WR at a time.
/// Move-only; it keeps its PD and CQ alive.
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class DcInitiator : detail::MoveOnly {
public:
    /// A DCI in RESET, with a send queue only.
    /// @errors A device that is not an mlx5 device, or a build without mlx5dv
    /// (unsupported); the port's or GID's query; mlx5dv_create_qp's failure (its errno).
    /// @misuse A moved-from PD or CQ, a missing CQ.
    static Result<DcInitiator> create(const ProtectionDomain& pd, const DcInitiatorOptions& options,
                                      std::source_location where = std::source_location::current());

    /// RESET -> INIT -> RTR -> RTS, towards no one in particular. From `options` it uses
    /// path_mtu (default: the port's active MTU; every destination's MTU must be at
    /// least this), ack_timeout, retry_cnt, rnr_retry and max_rd_atomic.
    /// @errors A path_mtu above the port's active MTU (EINVAL); ibv_modify_qp's refusal
    /// of a step (its errno).
    /// @misuse A moved-from DCI; not in RESET, ack_timeout above 31, retry counts
    /// above 7.
    Result<void> activate(const QpConnectOptions& options = {},
                          std::source_location where = std::source_location::current());

    /// An address handle towards `peer` (checked like QueuePair::connect's peer: an
    /// Error). `options` supplies service level, traffic class and hop limit. A peer
    /// whose MTU is below this DCI's path MTU is an Error.
    /// @errors A peer MTU below the path MTU (EINVAL); a peer address the port cannot
    /// reach, or AddressHandle::create's failure.
    /// @misuse A moved-from DCI; before activate() succeeded.
    Result<DcDestination> destination(const DcEndpoint& peer, const QpConnectOptions& options = {},
                                      std::source_location where = std::source_location::current()) const;

    /// @name Posts
    /// One WR each, posted at once (ibv_wr_start to ibv_wr_complete). They share their
    /// runtime errors: ibv_wr_complete's refusal (its errno, a full send queue say).
    /// What the DCT or the network does to the WR comes in its completion.
    /// @{

    /// RDMA WRITE of `local` to the start of `remote` at `to`.
    /// @errors ibv_wr_complete's refusal (its errno), as for every post.
    /// @misuse Here and in every post: a moved-from DCI or destination, a DCI not in
    /// RTS, a destination made in another PD, a remote region shorter than `local`.
    Result<void> write(const DcDestination& to, const LocalSlice& local, const RemoteMemory& remote,
                       DcPost post = {}, std::source_location where = std::source_location::current());
    /// RDMA READ of the start of `remote` at `to` into `local`.
    /// @errors ibv_wr_complete's refusal (its errno), as for every post.
    /// @misuse As write().
    Result<void> read(const DcDestination& to, const LocalSlice& local, const RemoteMemory& remote,
                      DcPost post = {}, std::source_location where = std::source_location::current());
    /// 64-bit atomics on the first 8 bytes of `remote`; the old value lands in `local`.
    /// fetch_add adds `add`.
    /// @errors A device without atomics is an Error of kind unsupported; otherwise
    /// ibv_wr_complete's refusal (its errno), as for every post.
    /// @misuse As write(), and (also): `local` not 8 bytes, `remote` shorter than 8
    /// bytes or not 8-byte aligned.
    Result<void> fetch_add(const DcDestination& to, const LocalSlice& local, const RemoteMemory& remote,
                           std::uint64_t add, DcPost post = {},
                           std::source_location where = std::source_location::current());
    /// The 64-bit compare-and-swap: `swap` replaces the remote word if it equals
    /// `compare`; the old value lands in `local`.
    /// @errors As fetch_add().
    /// @misuse As fetch_add().
    Result<void> compare_swap(const DcDestination& to, const LocalSlice& local, const RemoteMemory& remote,
                              std::uint64_t compare, std::uint64_t swap, DcPost post = {},
                              std::source_location where = std::source_location::current());

    /// @}

    /// RESET, then what activate() reached (RTS once it succeeded).
    QpState state() const noexcept { return state_; }
    /// The path MTU activate() set (unknown before).
    Mtu path_mtu() const noexcept { return path_mtu_; }
    /// The verbs QP. @misuse A moved-from DCI.
    ibv_qp* get(std::source_location where = std::source_location::current()) const {
        return rdmaxx::detail::live(qp_, "DcInitiator", where).get();
    }

private:
    DcInitiator() = default;
    // Every public post: one WR of `opcode` (ibv_wr_opcode) from ibv_wr_start to
    // ibv_wr_complete. `compare_add` and `swap` are the atomic operands.
    Result<void> post(const DcDestination& to, ibv_wr_opcode opcode, const LocalSlice& local,
                      const RemoteMemory& remote, std::uint64_t compare_add, std::uint64_t swap, DcPost post,
                      std::source_location where);
    std::shared_ptr<ibv_pd> pd_;
    std::shared_ptr<ibv_qp> qp_; // keeps PD and CQ alive
    ibv_qp_ex* extended_ = nullptr; // owned by qp_
    DcInitiatorOptions options_{}; // without cq: qp_ holds it
    GidEntry gid_{};
    PortAttributes port_{};
    bool atomics_ = false;
    std::uint8_t device_max_rd_atomic_ = 0; // max_rd_atomic's default
    Mtu path_mtu_ = Mtu::unknown;
    QpState state_ = QpState::reset;
};

} // namespace rdmaxx::mlx5
