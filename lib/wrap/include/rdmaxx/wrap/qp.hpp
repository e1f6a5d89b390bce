/// @file
/// Queue pairs (RC, UC, UD) and their state machine RESET -> INIT -> RTR -> RTS.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/cq.hpp>
#include <rdmaxx/wrap/device.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/handle.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pd.hpp>
#include <rdmaxx/wrap/srq.hpp>

namespace rdmaxx {

/// A QP's transport: reliable connected, unreliable connected or unreliable datagram.
/// Formats with fmt as to_string() writes it.
enum class QpType : std::uint8_t { rc, uc, ud };
/// A QP's state, as `ibv_qp_state` (`error` is ERR; `unknown`, a value this header does
/// not know). Formats with fmt as to_string() writes it.
enum class QpState : std::uint8_t { reset, init, rtr, rts, sqd, sqe, error, unknown };
std::string_view to_string(QpType type) noexcept;   ///< "RC", "UC" or "UD".
std::string_view to_string(QpState state) noexcept; ///< "RESET", "INIT", ..., "ERR" or "unknown".
/// The QpState of a verbs `ibv_qp_state`; `unknown` for a value this header does not know.
QpState qp_state_from_verbs(int state) noexcept;

/// How send WRs reach the device. `classic` is ibv_post_send with WR chains;
/// `extended` is the ibv_wr_* API on an ibv_qp_ex (ibv_wr_post(3)), which rdmaxx
/// reaches by replaying its built WRs out of line: on rxe, 88 instructions per
/// single-SGE post above the raw ibv_wr_* calls against classic's 47 above raw
/// ibv_post_send (bench/post-cost.sh). So `automatic` is classic until the extended
/// path is as direct. rxe (rdma-core 44) also miscounts multi-SGE and inline-list
/// lengths on the extended API: `extended` there is correct only for one SGE.
enum class PostApi : std::uint8_t { automatic, classic, extended };

/// The sizes of a QP's queues: asked for in QpOptions, granted in QueuePair::caps().
struct QpCaps {
    std::uint32_t max_send_wr = 128;   ///< send WRs outstanding at once
    std::uint32_t max_recv_wr = 128;   ///< receive WRs outstanding at once; ignored with an SRQ
    std::uint32_t max_send_sge = 1;    ///< scatter/gather entries per send WR
    std::uint32_t max_recv_sge = 1;    ///< per receive WR; ignored with an SRQ
    std::uint32_t max_inline_data = 0; ///< bytes a send may carry inline
};

/// How to create a QueuePair. Two CQs of the same type: named fields, so they cannot be
/// swapped by position.
struct QpOptions {
    QpType type = QpType::rc;                 ///< RC, UC or UD
    const CompletionQueue* send_cq = nullptr; ///< send completions go there; required
    const CompletionQueue* recv_cq = nullptr; ///< receive completions go there; required
    const SharedReceiveQueue* srq = nullptr;  ///< receives come from this SRQ (optional)
    QpCaps caps{};                            ///< the queue sizes asked for
    bool signal_all = false;                  ///< every send WR completes with a CQE
    std::uint8_t port = 1;                    ///< the port, from 1
    std::optional<std::uint32_t> gid_index{}; ///< the local GID; default: Context::choose_gid
    std::uint16_t pkey_index = 0;             ///< the P_Key index
    std::uint32_t qkey = 0x11111111;          ///< the Q_Key; UD only
    /// How send WRs reach the device; extended where unsupported is an Error.
    PostApi post_api = PostApi::automatic;
    /// What the peer may do to this QP's memory (RC; UC honours remote_write only).
    Access remote_access = Access::remote_write | Access::remote_read | Access::remote_atomic;
};

/// What a peer must know to connect to a QP: exchanged out of band (TCP, RDMA CM).
struct Endpoint {
    std::uint32_t qpn = 0;  ///< the QP number: 24 bits
    std::uint32_t psn = 0;  ///< 24 bits: the first packet sequence number it sends
    Gid gid{};              ///< its port's GID; required on RoCE
    std::uint16_t lid = 0;  ///< its port's LID; required on InfiniBand
    Mtu mtu = Mtu::unknown; ///< the port's active MTU

    /// Field by field.
    friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

/// Connection attributes, with the defaults a careful engineer picks. Out-of-range
/// values (retry counts above 7, ack_timeout above 31, min_rnr_timer above 31) are
/// programming errors.
struct QpConnectOptions {
    std::optional<Mtu> path_mtu{};  ///< default: min(local active MTU, peer MTU)
    /// RC, the ACK timeout as an exponent: 4.096 us * 2^14 = 67 ms per ACK timeout.
    std::uint8_t ack_timeout = 14;
    std::uint8_t retry_cnt = 7;     ///< RC, resends after an ACK timeout
    /// RC, resends after a receiver-not-ready NAK: 7 retries forever and has frozen rxe
    /// hosts.
    std::uint8_t rnr_retry = 6;
    /// RC, how long a sender waits after this QP's receiver-not-ready NAK: 12 = 0.64 ms.
    std::uint8_t min_rnr_timer = 12;
    /// RC, READs and atomics in flight from this QP; default: device max_qp_init_rd_atom.
    std::optional<std::uint8_t> max_rd_atomic{};
    /// RC, READs and atomics in flight towards this QP; default: device max_qp_rd_atom.
    std::optional<std::uint8_t> max_dest_rd_atomic{};
    std::uint8_t service_level = 0; ///< the packets' service level
    std::uint8_t traffic_class = 0; ///< RoCE, the GRH traffic class
    std::uint8_t hop_limit = 64;    ///< RoCE, the GRH hop limit
};

/// A queue pair (RC, UC or UD), and where it is in its state machine RESET -> INIT ->
/// RTR -> RTS. It keeps its PD, CQs and SRQ alive. Posting is lib/data's
/// (rdmaxx/data/post.hpp).
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe (transitions and
/// query_state() update the cached state without a lock).
class QueuePair : detail::MoveOnly {
public:
    /// A QP in RESET with its own Endpoint (a random PSN). Caps beyond the device's
    /// limits are an Error that names the cap.
    ///
    /// @errors A cap above the device's limit (EINVAL); no GID to use on the port (as
    /// Context::choose_gid); ibv_query_port or ibv_create_qp fails (out of resources,
    /// max_inline_data too large); PostApi::extended where the device lacks it.
    /// @misuse A moved-from PD, CQ or SRQ, a missing CQ.
    static Result<QueuePair> create(const ProtectionDomain& pd, const QpOptions& options,
                                    std::source_location where = std::source_location::current());

    /// This QP's own description, to send to the peer. Its PSN is random.
    const Endpoint& endpoint() const noexcept { return local_; }
    QpType type() const noexcept { return type_; }                ///< RC, UC or UD.
    std::uint32_t qpn() const noexcept { return local_.qpn; }     ///< Its QP number.
    const GidEntry& gid() const noexcept { return gid_; }         ///< The local GID it uses.
    std::uint8_t port() const noexcept { return port_; }          ///< Its port.
    std::uint32_t qkey() const noexcept { return qkey_; }         ///< Its Q_Key (UD).
    LinkLayer link_layer() const noexcept { return link_layer_; } ///< Its port's link layer.
    /// The capabilities the device granted (at least those asked for).
    const QpCaps& caps() const noexcept { return caps_; }
    bool has_srq() const noexcept { return has_srq_; } ///< Receives come from an SRQ.
    /// Created with QpOptions::signal_all: every send WR completes with a CQE.
    bool signals_all() const noexcept { return signals_all_; }
    /// When this QP was created: device events read before it concern an older QP
    /// that had the same number.
    std::chrono::steady_clock::time_point created_at() const noexcept { return created_; }
    /// Whether the device executes atomics (IBV_ATOMIC_HCA or _GLOB).
    bool supports_atomics() const noexcept { return device_ && device_->attributes.atomics; }
    /// The extended post interface, or nullptr when this QP uses ibv_post_send.
    ibv_qp_ex* extended() const noexcept { return extended_.get(); }

    /// RC/UC: RESET -> INIT -> RTR -> RTS towards `peer`. A peer description that
    /// cannot be right (QPN or PSN above 24 bits, unknown MTU, no GID on RoCE, no LID
    /// on InfiniBand) is an Error, as is anything the device refuses.
    ///
    /// On RoCE the move to RTR resolves the GID's MAC address (ARP, neighbour
    /// discovery) and waits for it: about a second when nobody answers for the GID
    /// (then ETIMEDOUT), and as long the first time for a host that does. Where the GID
    /// came from the network, a thread that serves others calls this elsewhere
    /// (rdmaxx/async/blocking.hpp).
    ///
    /// @errors A bad peer description, before any step (EINVAL); a path MTU above the
    /// port's active MTU (EINVAL); ibv_modify_qp refuses a step. The QP is back in RESET
    /// afterwards, ready for another connect() (a device that refuses that too: both
    /// failures in the Error's detail).
    /// @misuse A UD QP, a QP not in RESET, out-of-range options (QpConnectOptions), a
    /// moved-from QP.
    Result<void> connect(const Endpoint& peer, const QpConnectOptions& options = {},
                         std::source_location where = std::source_location::current());
    /// UD: RESET -> INIT -> RTR -> RTS.
    ///
    /// @errors ibv_modify_qp refuses a step; the QP is back in RESET afterwards (as
    /// connect()).
    /// @misuse Not UD, not in RESET, a moved-from QP.
    Result<void> activate(std::source_location where = std::source_location::current());

    /// RESET -> INIT: the port, the P_Key index, and the Q_Key (UD) or the remote access
    /// (RC, UC). The single steps (to_init, to_rtr, to_rts) are for callers that
    /// interleave them with their own work.
    ///
    /// @errors ibv_modify_qp fails.
    /// @misuse Not in RESET, a moved-from QP.
    Result<void> to_init(std::source_location where = std::source_location::current());
    /// INIT -> RTR towards `peer` (RC, UC): the path, its MTU, the peer's QPN and PSN.
    ///
    /// @errors A bad peer description or a path MTU above the port's active MTU
    /// (EINVAL); ibv_modify_qp fails.
    /// @misuse A UD QP, not in INIT, min_rnr_timer above 31, a moved-from QP.
    Result<void> to_rtr(const Endpoint& peer, const QpConnectOptions& options = {},
                        std::source_location where = std::source_location::current());
    /// RTR -> RTS: the first PSN and, on RC, the ACK timeout, the retries and the READs
    /// in flight.
    ///
    /// @errors ibv_modify_qp fails.
    /// @misuse Not in RTR, ack_timeout above 31, retry_cnt or rnr_retry above 7, a
    /// moved-from QP.
    Result<void> to_rts(const QpConnectOptions& options = {},
                        std::source_location where = std::source_location::current());
    /// Any state -> ERR (outstanding WRs flush).
    ///
    /// @errors ibv_modify_qp fails.
    /// @misuse A moved-from QP.
    Result<void> to_error(std::source_location where = std::source_location::current());
    /// Any state -> RESET.
    ///
    /// @errors ibv_modify_qp fails.
    /// @misuse A moved-from QP.
    Result<void> reset(std::source_location where = std::source_location::current());
    /// Raw ibv_modify_qp for every other knob; the cached state follows attr.qp_state.
    ///
    /// @errors ibv_modify_qp fails.
    /// @misuse A moved-from QP.
    Result<void> modify(ibv_qp_attr& attr, int mask,
                        std::source_location where = std::source_location::current());

    /// The state as the device sees it now (a system call). An RC QP whose peer
    /// failed reports error here although rdmaxx last moved it to RTS.
    ///
    /// @errors ibv_query_qp fails.
    /// @misuse A moved-from QP.
    Result<QpState> query_state(std::source_location where = std::source_location::current());
    /// The state rdmaxx last set or observed, without a system call.
    QpState state() const noexcept { return state_; }

    /// The verbs QP, for calls rdmaxx does not wrap.
    ///
    /// @misuse A moved-from QP.
    ibv_qp* get(std::source_location where = std::source_location::current()) const {

        return detail::live(qp_, "QueuePair", where).get();

    }
    /// The counted PD it was created in, for objects that must share it (an
    /// AddressHandle).
    ///
    /// @misuse A moved-from QP.
    const std::shared_ptr<ibv_pd>& pd(std::source_location where = std::source_location::current()) const;

private:
    QueuePair() = default;
    Result<void> transition(ibv_qp_attr& attr, int mask, const char* step);
    Result<void> back_to_reset_if_failed(Result<void> done, std::source_location where);

    detail::DeviceHandle device_;
    std::shared_ptr<ibv_qp> qp_; // keeps PD, CQs and SRQ alive
    std::shared_ptr<ibv_pd> pd_;
    detail::OwnedElsewhere<ibv_qp_ex> extended_; // qp_'s: null once moved from, as qp_
    Endpoint local_;
    GidEntry gid_;
    QpCaps caps_;
    QpType type_ = QpType::rc;
    QpState state_ = QpState::reset;
    bool has_srq_ = false;
    bool signals_all_ = false;
    std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
    std::uint8_t port_ = 1;
    std::uint16_t pkey_index_ = 0;
    std::uint32_t qkey_ = 0;
    Access remote_access_ = Access::none;
    LinkLayer link_layer_ = LinkLayer::unknown;
};

} // namespace rdmaxx

/// @cond
// QP types and states format as their names, computed only when a message is made:
// the post path's checks pass them by value and pay nothing unless they fail.
template <>
struct fmt::formatter<rdmaxx::QpType> : fmt::formatter<std::string_view> {
    auto format(rdmaxx::QpType type, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(rdmaxx::to_string(type), ctx);
    }
};
template <>
struct fmt::formatter<rdmaxx::QpState> : fmt::formatter<std::string_view> {
    auto format(rdmaxx::QpState state, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(rdmaxx::to_string(state), ctx);
    }
};
/// @endcond
