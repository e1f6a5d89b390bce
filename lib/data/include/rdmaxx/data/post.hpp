/// @file
/// Posting work requests: one-sided (READ, WRITE, WRITE_WITH_IMM, CAS, FAA), two-sided
/// (SEND, SEND_WITH_IMM, RECV), UD sends, and batches rung with one doorbell.
///
/// Everything here is inline (the posts always: no call of rdmaxx's own between the
/// caller and ibv_post_send) and allocation-free: a post costs the checks below (47
/// instructions per single-WR post on rxe, counted by bench/post-cost.sh) plus what
/// ibv_post_send costs. On a QP created with PostApi::extended, the built WRs are
/// replayed through the ibv_wr_* API by one out-of-line call (88 instructions then). A hot loop builds
/// its WRs once in a SendBatch or RecvBatch and posts that batch again and again,
/// changing only what varies (wr_id, signaling, immediate, atomic operands), as
/// perftest does with its prebuilt WRs. The checks are
/// programming errors (abort naming the caller): posting on a QP that is not in RTS,
/// a remote slice smaller than the local data, inline data above the QP's
/// max_inline_data, more SGEs than the QP was created with, an operation the QP type
/// does not support, atomics that are not 8 bytes and 8-aligned on both sides.
/// What the device refuses is an Error.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <rdmaxx/wrap/ah.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/mw.hpp>
#include <rdmaxx/wrap/qp.hpp>
#include <rdmaxx/wrap/srq.hpp>

namespace rdmaxx {

/// How one work request is posted: the wr_id its completion carries, and its flags.
struct PostOptions {
    std::uint64_t wr_id = 0;  ///< returned by the WR's completion (WorkCompletion::wr_id)
    bool signaled = true;     ///< ignored (always on) when the QP signals every WR
    bool inline_data = false; ///< copy the payload into the WR: the buffer is free at once
    bool fence = false;       ///< wait for earlier READs and atomics first
    bool solicited = false;   ///< wake a receiver that armed for solicited events only
};

/// The local side of a work request: one slice or a scatter/gather list. Only a
/// parameter type: it refers to its argument for the duration of the call.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe (every member function is
/// const).
class Gather {
public:
    /// One slice.
    Gather(const LocalSlice& one) noexcept : slices_(&one, 1) {}               // NOLINT: implicit
    /// A scatter/gather list, in order.
    Gather(std::span<const LocalSlice> many) noexcept : slices_(many) {}       // NOLINT: implicit
    /// The slices, one SGE each.
    std::span<const LocalSlice> slices() const noexcept { return slices_; }

private:
    std::span<const LocalSlice> slices_;
};

/// Where a UD send goes.
struct UdDestination {
    const AddressHandle* ah = nullptr; ///< the route to the destination's port; required
    std::uint32_t qpn = 0;             ///< the destination QP's number
    std::uint32_t qkey = 0;            ///< the destination QP's Q_Key (QueuePair::qkey there)
};

/// The payload of a UD receive starts after the 40-byte global routing header.
inline constexpr std::size_t ud_grh_bytes = 40;

namespace detail {

// Most SGEs one WR may carry through rdmaxx (the QP's own limit also applies).
inline constexpr std::size_t max_sge = 16;

// A send WR with room for its SGEs: built on the stack, then posted.
struct SendWr {
    ibv_send_wr wr;
    std::array<ibv_sge, max_sge> sge;
};

// A send WR's SGEs from `local`, checked against the QP's limits; returns the payload
// length. Always inlined, as SendBatch's set_* calls that use it.
[[gnu::always_inline]] inline std::uint64_t set_sges(SendWr& s, const QueuePair& qp, Gather local, bool inline_data,
                                                     std::source_location where) {
    const auto slices = local.slices();
    require(slices.size() <= qp.caps().max_send_sge && slices.size() <= max_sge, where,
            "{} SGEs on a QP created with max_send_sge {}", slices.size(), qp.caps().max_send_sge);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < slices.size(); ++i) {
        s.sge[i] = slices[i].sge();
        total += slices[i].size();
    }
    require(!inline_data || total <= qp.caps().max_inline_data, where,
            "{} bytes inline on a QP with max_inline_data {}", total, qp.caps().max_inline_data);
    s.wr.num_sge = static_cast<int>(slices.size());
    return total;
}

// The common part of every send WR; returns the payload length.
inline std::uint64_t build(SendWr& s, const QueuePair& qp, ibv_wr_opcode opcode, Gather local,
                           const PostOptions& options, std::source_location where) {
    const std::uint64_t total = set_sges(s, qp, local, options.inline_data, where);
    s.wr.wr_id = options.wr_id;
    s.wr.next = nullptr;
    s.wr.sg_list = s.sge.data();
    s.wr.opcode = opcode;
    s.wr.send_flags = (options.signaled ? IBV_SEND_SIGNALED : 0) | (options.inline_data ? IBV_SEND_INLINE : 0) |
                      (options.fence ? IBV_SEND_FENCE : 0) | (options.solicited ? IBV_SEND_SOLICITED : 0);
    return total;
}

inline void build_rdma(SendWr& s, const QueuePair& qp, ibv_wr_opcode opcode, Gather local, const RemoteMemory& remote,
                       const PostOptions& options, std::source_location where) {
    require(qp.type() != QpType::ud, where, "RDMA {} on a UD QP",
            opcode == IBV_WR_RDMA_READ ? "READ" : "WRITE");
    require(opcode != IBV_WR_RDMA_READ || qp.type() == QpType::rc, where, "RDMA READ on a {} QP: RC only",
            qp.type());
    require(opcode != IBV_WR_RDMA_READ || !options.inline_data, where, "RDMA READ cannot be inline");
    const std::uint64_t total = build(s, qp, opcode, local, options, where);
    require(total <= remote.length, where, "{} local bytes into a {}-byte remote slice", total, remote.length);
    s.wr.wr.rdma.remote_addr = remote.addr;
    s.wr.wr.rdma.rkey = remote.rkey;
}

inline void build_atomic(SendWr& s, const QueuePair& qp, ibv_wr_opcode opcode, const LocalSlice& result,
                         const RemoteMemory& target, std::uint64_t compare_add, std::uint64_t swap,
                         const PostOptions& options, std::source_location where) {
    require(qp.type() == QpType::rc, where, "an atomic on a {} QP: RC only", qp.type());
    require(result.size() == 8 && reinterpret_cast<std::uintptr_t>(result.data()) % 8 == 0, where,
            "an atomic's local slice must be 8 bytes, 8-aligned (got {} bytes at {})", result.size(),
            static_cast<const void*>(result.data()));
    require(target.length >= 8 && target.addr % 8 == 0, where,
            "an atomic's remote slice must be 8 bytes, 8-aligned (got {} bytes at {:#x})", target.length,
            target.addr);
    require(!options.inline_data, where, "an atomic cannot be inline");
    build(s, qp, opcode, result, options, where);
    s.wr.wr.atomic.remote_addr = target.addr;
    s.wr.wr.atomic.compare_add = compare_add;
    s.wr.wr.atomic.swap = swap;
    s.wr.wr.atomic.rkey = target.rkey;
}

// What a bind or an invalidation of a memory window checks, and the part of their WR
// they share (no SGEs; inline_data and solicited do not apply).
inline void build_window(SendWr& s, const QueuePair& qp, ibv_wr_opcode opcode, const PostOptions& options,
                         std::source_location where) {
    require(qp.type() == QpType::rc, where, "a memory window on a {} QP: type 2 windows are bound through RC QPs",
            qp.type());
    s.wr = {};
    s.wr.wr_id = options.wr_id;
    s.wr.opcode = opcode;
    s.wr.send_flags = (options.signaled ? IBV_SEND_SIGNALED : 0) | (options.fence ? IBV_SEND_FENCE : 0);
}

// Replays a WR chain through the ibv_wr_* API; returns ibv_wr_complete's result.
int post_extended(ibv_qp_ex* qpx, const ibv_send_wr* wr);

// The Error of a failed post of `count` WRs from `first`; sets `accepted`. The
// extended API posts all or nothing; ibv_post_send posts the WRs before `bad`. A
// provider that fails without setting `bad` has told nothing: every WR counts as
// accepted, as the safe side (a completion waited for in vain times out; a buffer
// thought free while the device reads it would be worse). Out of line: the post path
// carries no formatting code.
[[gnu::cold]] Error post_error(bool extended, int rc, const ibv_send_wr& first, const ibv_send_wr* bad,
                               std::size_t count, std::size_t& accepted);

// Posts a WR chain of `count` WRs through the QP's post API; `accepted` receives how
// many WRs the device took (all, or those before the failing one).
[[gnu::always_inline]] inline Result<void> submit(QueuePair& qp, ibv_send_wr& first, std::size_t count, std::size_t& accepted,
                           std::source_location where) {
    // RTS and later: a QP in ERR takes WRs and flushes them, a runtime condition
    require(qp.state() >= QpState::rts, where, "post on a {} QP in state {}: connect it first", qp.type(),
            qp.state());
    accepted = count;
    if (ibv_qp_ex* qpx = qp.extended()) {
        if (const int rc = post_extended(qpx, &first); rc != 0) [[unlikely]]
            return std::unexpected(post_error(true, rc, first, nullptr, count, accepted));
        return {};
    }
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(qp.get(where), &first, &bad); rc != 0) [[unlikely]]
        return std::unexpected(post_error(false, rc, first, bad, count, accepted));
    return {};
}

} // namespace detail

/// Up to N send WRs chained and posted with one doorbell; no heap. Add operations,
/// then post(); clear() makes room for the next batch. Each add checks what the
/// matching post_* function documents (programming errors), plus: the batch is full.
/// A batch stays built after post(): post it again, after changing what varies with
/// the set_* calls, and a post costs ibv_post_send and a few branches. A batch may be
/// copied and moved (each post points its WRs at their own storage); its QP must
/// outlive it.
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
template <std::size_t N>
class SendBatch {
public:
    /// An empty batch that posts on `qp`.
    explicit SendBatch(QueuePair& qp) noexcept : qp_(&qp) {}

    /// How many WRs were added.
    std::size_t size() const noexcept { return count_; }
    /// N: the most WRs the batch holds.
    static constexpr std::size_t capacity() noexcept { return N; }
    /// Removes every WR: the next one added is WR 0.
    void clear() noexcept { count_ = 0, special_ = 0; }
    /// The QP the batch posts on.
    const QueuePair& queue_pair() const noexcept { return *qp_; }

    /// Adds an RDMA WRITE of `local` into `remote` (as post_write).
    /// @misuse as post_write's; a full batch.
    SendBatch& write(Gather local, const RemoteMemory& remote, const PostOptions& options = {},
                     std::source_location where = std::source_location::current()) {
        detail::build_rdma(next(where), *qp_, IBV_WR_RDMA_WRITE, local, remote, options, where);
        return *this;
    }
    /// Adds an RDMA WRITE with immediate (as post_write_with_imm).
    /// @misuse as post_write's; a full batch.
    SendBatch& write_with_imm(Gather local, const RemoteMemory& remote, std::uint32_t imm,
                              const PostOptions& options = {},
                              std::source_location where = std::source_location::current()) {
        detail::SendWr& s = next(where);
        detail::build_rdma(s, *qp_, IBV_WR_RDMA_WRITE_WITH_IMM, local, remote, options, where);
        s.wr.imm_data = htonl(imm);
        return *this;
    }
    /// Adds an RDMA READ of `remote` into `local` (as post_read).
    /// @misuse as post_read's; a full batch.
    SendBatch& read(Gather local, const RemoteMemory& remote, const PostOptions& options = {},
                    std::source_location where = std::source_location::current()) {
        detail::build_rdma(next(where), *qp_, IBV_WR_RDMA_READ, local, remote, options, where);
        return *this;
    }
    /// Adds an RC/UC SEND (as post_send).
    /// @misuse as post_send's; a full batch.
    SendBatch& send(Gather local, const PostOptions& options = {},
                    std::source_location where = std::source_location::current()) {
        require(qp_->type() != QpType::ud, where, "a send on a UD QP needs a UdDestination");
        detail::build(next(where), *qp_, IBV_WR_SEND, local, options, where);
        return *this;
    }
    /// Adds an RC/UC SEND with immediate (as post_send_with_imm).
    /// @misuse as post_send's; a full batch.
    SendBatch& send_with_imm(Gather local, std::uint32_t imm, const PostOptions& options = {},
                             std::source_location where = std::source_location::current()) {
        require(qp_->type() != QpType::ud, where, "a send on a UD QP needs a UdDestination");
        detail::SendWr& s = next(where);
        detail::build(s, *qp_, IBV_WR_SEND_WITH_IMM, local, options, where);
        s.wr.imm_data = htonl(imm);
        return *this;
    }
    /// Adds a UD SEND of `local` to destination `to` (as the UD post_send).
    /// @misuse as the UD post_send's; a full batch.
    SendBatch& send(Gather local, const UdDestination& to, const PostOptions& options = {},
                    std::source_location where = std::source_location::current()) {
        require(qp_->type() == QpType::ud, where, "a UdDestination on a {} QP", qp_->type());
        require(to.ah != nullptr, where, "a UdDestination without an address handle");
        detail::SendWr& s = next(where);
        detail::build(s, *qp_, IBV_WR_SEND, local, options, where);
        s.wr.wr.ud.ah = to.ah->get(where);
        s.wr.wr.ud.remote_qpn = to.qpn;
        s.wr.wr.ud.remote_qkey = to.qkey;
        return *this;
    }
    /// Adds an atomic compare-and-swap (as post_compare_swap).
    /// @misuse as post_compare_swap's; a full batch.
    SendBatch& compare_swap(const LocalSlice& result, const RemoteMemory& target, std::uint64_t compare,
                            std::uint64_t swap, const PostOptions& options = {},
                            std::source_location where = std::source_location::current()) {
        detail::build_atomic(next(where), *qp_, IBV_WR_ATOMIC_CMP_AND_SWP, result, target, compare, swap, options,
                             where);
        special_ |= has_atomics;
        return *this;
    }
    /// Adds an atomic fetch-and-add (as post_fetch_add).
    /// @misuse as post_fetch_add's; a full batch.
    SendBatch& fetch_add(const LocalSlice& result, const RemoteMemory& target, std::uint64_t add,
                         const PostOptions& options = {},
                         std::source_location where = std::source_location::current()) {
        detail::build_atomic(next(where), *qp_, IBV_WR_ATOMIC_FETCH_AND_ADD, result, target, add, 0, options, where);
        special_ |= has_atomics;
        return *this;
    }

    /// Adds a bind of `window` to `length` bytes at `offset` of `region` with the remote
    /// `rights` (as post_bind). Each post() binds it anew, with the window's next key:
    /// bound(k) tells the bytes and the key to hand to the peer, and the key becomes the
    /// window's once the device took the WR. Two windows bound with one doorbell, only
    /// the last signaled, cost one post and one completion (an RC QP's WRs complete in
    /// order, so the last one's completion says both are done).
    /// @misuse as post_bind's; a window the batch already binds or invalidates; a full
    /// batch.
    SendBatch& bind(MemoryWindow& window, const MemoryRegion& region, std::size_t offset, std::size_t length,
                    Access rights, const PostOptions& options = {},
                    std::source_location where = std::source_location::current()) {
        require(rights != Access::none && has(access_remote, rights), where,
                "a window's rights must be remote ones, at least one (got {})", rights);
        require(offset <= region.size() && length <= region.size() - offset, where,
                "a window on [{}, +{}) of a {}-byte region", offset, length, region.size());
        require_new_window(window, where);
        detail::SendWr& s = next(where);
        detail::build_window(s, *qp_, IBV_WR_BIND_MW, options, where);
        s.wr.bind_mw.mw = window.get(where);
        s.wr.bind_mw.rkey = ibv_inc_rkey(window.rkey(where));
        s.wr.bind_mw.bind_info = {.mr = region.get(where),
                                  .addr = reinterpret_cast<std::uintptr_t>(region.data(where) + offset),
                                  .length = length,
                                  .mw_access_flags = static_cast<unsigned>(rights)};
        special_ |= has_windows;
        return *this;
    }
    /// Adds an invalidation of `window`'s key (as post_invalidate): each post()
    /// invalidates the key the window has then.
    /// @misuse as post_invalidate's; a window the batch already binds or invalidates; a
    /// full batch.
    SendBatch& invalidate(const MemoryWindow& window, const PostOptions& options = {},
                          std::source_location where = std::source_location::current()) {
        require_new_window(window, where);
        detail::SendWr& s = next(where);
        detail::build_window(s, *qp_, IBV_WR_LOCAL_INV, options, where);
        s.wr.invalidate_rkey = window.rkey(where);
        // where a bind names its window: LOCAL_INV reads invalidate_rkey only, and
        // post_special and require_new_window find the window there
        s.wr.bind_mw.mw = window.get(where);
        special_ |= has_windows;
        return *this;
    }
    /// What bind k bound in the last post() (before any: what it will bind): the bytes
    /// and the key to hand to the peer.
    /// @misuse k past the batch, WR k not a bind.
    RemoteMemory bound(std::size_t k, std::source_location where = std::source_location::current()) const {
        require(k < count_ && wrs_[k].wr.opcode == IBV_WR_BIND_MW, where, "bound({}) of a batch of {}: not a bind", k,
                count_);
        const ibv_mw_bind_info& info = wrs_[k].wr.bind_mw.bind_info;
        return {.addr = info.addr, .length = info.length, .rkey = wrs_[k].wr.bind_mw.rkey};
    }

    // The set_* calls are always inlined: they are the post path of a batch built once.

    /// What varies between posts of WR k (in the order added): its wr_id.
    /// @misuse k past the batch.
    [[gnu::always_inline]]
    SendBatch& set_wr_id(std::size_t k, std::uint64_t wr_id,
                         std::source_location where = std::source_location::current()) {
        at(k, where).wr.wr_id = wr_id;
        return *this;
    }
    /// Whether WR k is signaled (always, on a QP that signals every WR).
    /// @misuse k past the batch.
    [[gnu::always_inline]]
    SendBatch& set_signaled(std::size_t k, bool signaled,
                            std::source_location where = std::source_location::current()) {
        ibv_send_wr& wr = at(k, where).wr;
        wr.send_flags = signaled ? wr.send_flags | IBV_SEND_SIGNALED : wr.send_flags & ~unsigned{IBV_SEND_SIGNALED};
        return *this;
    }
    /// A SEND's local data and whether it goes inline, checked as when it was added (the
    /// QP's max_send_sge and max_inline_data): a batch that sends another buffer each
    /// post (a transport's packets) is built once. (An RDMA operation or an atomic is
    /// checked against its remote slice: add it anew.)
    /// @misuse k past the batch; WR k not a SEND (with or without immediate); the add's
    /// checks.
    [[gnu::always_inline]]
    SendBatch& set_local(std::size_t k, Gather local, bool inline_data,
                         std::source_location where = std::source_location::current()) {
        detail::SendWr& s = at(k, where);
        require(s.wr.opcode == IBV_WR_SEND || s.wr.opcode == IBV_WR_SEND_WITH_IMM, where,
                "set_local on WR {} of a batch, which is not a SEND", k);
        detail::set_sges(s, *qp_, local, inline_data, where);
        s.wr.send_flags = inline_data ? s.wr.send_flags | IBV_SEND_INLINE : s.wr.send_flags & ~unsigned{IBV_SEND_INLINE};
        return *this;
    }
    /// WR k's destination: another peer for a UD send added with send(local, to).
    /// @misuse k past the batch; WR k not a UD send; a destination without an address
    /// handle.
    [[gnu::always_inline]]
    SendBatch& set_destination(std::size_t k, const UdDestination& to,
                               std::source_location where = std::source_location::current()) {
        ibv_send_wr& wr = at(k, where).wr;
        require(qp_->type() == QpType::ud && wr.opcode == IBV_WR_SEND, where,
                "set_destination on WR {} of a batch, which is not a UD send", k);
        require(to.ah != nullptr, where, "a UdDestination without an address handle");
        wr.wr.ud.ah = to.ah->get(where);
        wr.wr.ud.remote_qpn = to.qpn;
        wr.wr.ud.remote_qkey = to.qkey;
        return *this;
    }
    /// WR k's immediate: `imm` in host order, as in write_with_imm().
    /// @misuse k past the batch, a WR without an immediate.
    [[gnu::always_inline]]
    SendBatch& set_imm(std::size_t k, std::uint32_t imm, std::source_location where = std::source_location::current()) {
        ibv_send_wr& wr = at(k, where).wr;
        require(wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr.opcode == IBV_WR_SEND_WITH_IMM, where,
                "set_imm on WR {} of a batch, which carries no immediate", k);
        wr.imm_data = htonl(imm);
        return *this;
    }
    /// WR k's atomic operands. compare_add: the CAS's compare value or the FAA's addend;
    /// swap: the CAS's swap.
    /// @misuse k past the batch, a WR that is not an atomic.
    [[gnu::always_inline]]
    SendBatch& set_atomic(std::size_t k, std::uint64_t compare_add, std::uint64_t swap = 0,
                          std::source_location where = std::source_location::current()) {
        ibv_send_wr& wr = at(k, where).wr;
        require(wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD, where,
                "set_atomic on WR {} of a batch, which is not an atomic", k);
        wr.wr.atomic.compare_add = compare_add;
        wr.wr.atomic.swap = swap;
        return *this;
    }

    /// Posts every WR with one doorbell. On failure the Error says which WR failed and
    /// why, and accepted() how many WRs before it the device took (the classic API
    /// posts those; the extended API posts all or nothing; all of them when the
    /// provider did not say which failed, the safe side). Atomics on a device
    /// without atomic support are an Error before anything is posted.
    /// @errors ibv_post_send fails (ibv_wr_complete on a QP with the extended post
    /// API), e.g. ENOMEM for a full send queue; atomics on a device without them (kind
    /// unsupported). What the device refuses later is a failed completion.
    /// @misuse an empty batch, a QP not in RTS (or later), a moved-from QP.
    [[gnu::always_inline]] Result<void> post(std::source_location where = std::source_location::current()) {
        require(count_ > 0, where, "post of an empty batch");
        accepted_ = 0;
        for (std::size_t i = 0; i < count_; ++i) {
            wrs_[i].wr.sg_list = wrs_[i].sge.data();
            wrs_[i].wr.next = i + 1 < count_ ? &wrs_[i + 1].wr : nullptr;
        }
        if (special_ != 0) [[unlikely]]
            return post_special(where);
        return detail::submit(*qp_, wrs_[0].wr, count_, accepted_, where);
    }
    /// How many WRs the last post() handed to the device.
    std::size_t accepted() const noexcept { return accepted_; }
    /// WR `k` as post() hands it to the device (read-only): what code posting after the
    /// batch must match, a UD batch's destination, say.
    /// @misuse k not below size().
    const ibv_send_wr& work_request(std::size_t k, std::source_location where = std::source_location::current()) const {
        require(k < count_, where, "WR {} of a batch of {}", k, count_);
        return wrs_[k].wr;
    }

private:
    detail::SendWr& next(std::source_location where) {
        require(count_ < N, where, "a SendBatch<{}> is full", N);
        return wrs_[count_++];
    }
    detail::SendWr& at(std::size_t k, std::source_location where) {
        require(k < count_, where, "WR {} of a batch of {}", k, count_);
        return wrs_[k];
    }
    static bool window_wr(const ibv_send_wr& wr) noexcept {
        return wr.opcode == IBV_WR_BIND_MW || wr.opcode == IBV_WR_LOCAL_INV;
    }
    // a window's key changes with each bind: a batch names each window once
    void require_new_window(const MemoryWindow& window, std::source_location where) const {
        for (std::size_t i = 0; i < count_; ++i)
            require(!window_wr(wrs_[i].wr) || wrs_[i].wr.bind_mw.mw != window.get(where), where,
                    "a memory window twice in one SendBatch");
    }
    // post() of a batch with atomics (an Error on a device without them) or memory
    // windows: each bind takes its window's next key, and each the device took makes
    // it the window's; each invalidation, the window's key. Apart, so that the post
    // path of other batches checks one flag.
    Result<void> post_special(std::source_location where) {
        qp_->get(where); // a moved-from QP has no device, so no atomics: the misuse first
        if ((special_ & has_atomics) != 0 && !qp_->supports_atomics())
            return std::unexpected(Error::unsupported("post", "atomics on a device without atomic support"));
        for (std::size_t i = 0; i < count_; ++i) {
            ibv_send_wr& wr = wrs_[i].wr;
            if (wr.opcode == IBV_WR_BIND_MW)
                wr.bind_mw.rkey = ibv_inc_rkey(wr.bind_mw.mw->rkey);
            else if (wr.opcode == IBV_WR_LOCAL_INV)
                wr.invalidate_rkey = wr.bind_mw.mw->rkey;
        }
        auto posted = detail::submit(*qp_, wrs_[0].wr, count_, accepted_, where);
        for (std::size_t i = 0; i < accepted_; ++i)
            if (wrs_[i].wr.opcode == IBV_WR_BIND_MW)
                wrs_[i].wr.bind_mw.mw->rkey = wrs_[i].wr.bind_mw.rkey;
        return posted;
    }

    QueuePair* qp_;
    std::size_t count_ = 0;
    std::size_t accepted_ = 0;
    static constexpr std::uint8_t has_atomics = 1, has_windows = 2;
    std::uint8_t special_ = 0; // what post_special() handles
    std::array<detail::SendWr, N> wrs_;
};

/// An RDMA WRITE of `local` into `remote`. One WR, posted at once: a batch of one, with
/// the same checks (so is every post_* call below).
/// @errors ibv_post_send fails (ibv_wr_complete on a QP with the extended post API),
/// e.g. ENOMEM for a full send queue; so for every send-side post_* call. What the
/// device refuses later is a failed completion.
/// @misuse a QP not in RTS (or later); a UD QP; more local bytes than `remote` holds;
/// more SGEs than the QP's max_send_sge (or 16); inline data above its max_inline_data;
/// a moved-from QP.
inline Result<void> post_write(QueuePair& qp, Gather local, const RemoteMemory& remote, const PostOptions& options = {},
                               std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).write(local, remote, options, where).post(where);
}

/// An RDMA WRITE that also consumes a receive of the peer, whose completion carries
/// `imm`. `imm` in host order; the receiver's completion returns it in host order.
/// @errors as post_write's.
/// @misuse as post_write's.
inline Result<void> post_write_with_imm(QueuePair& qp, Gather local, const RemoteMemory& remote, std::uint32_t imm,
                                        const PostOptions& options = {},
                                        std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).write_with_imm(local, remote, imm, options, where).post(where);
}

/// An RDMA READ of `remote` into `local`.
/// @errors as post_write's.
/// @misuse as post_write's, and a QP not RC, inline_data.
inline Result<void> post_read(QueuePair& qp, Gather local, const RemoteMemory& remote, const PostOptions& options = {},
                              std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).read(local, remote, options, where).post(where);
}

/// RC/UC send; a UD send takes a destination.
/// @errors as post_write's.
/// @misuse a UD QP (it takes the UdDestination overload); a QP not in RTS (or later);
/// more SGEs than the QP's max_send_sge (or 16); inline data above its max_inline_data;
/// a moved-from QP.
inline Result<void> post_send(QueuePair& qp, Gather local, const PostOptions& options = {},
                              std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).send(local, options, where).post(where);
}

/// An RC/UC send whose receiver's completion carries `imm` (host order both sides).
/// @errors as post_write's.
/// @misuse as post_send's.
inline Result<void> post_send_with_imm(QueuePair& qp, Gather local, std::uint32_t imm, const PostOptions& options = {},
                                       std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).send_with_imm(local, imm, options, where).post(where);
}

/// A UD send of `local` to destination `to`: a message of at most the path MTU.
/// @errors as post_write's.
/// @misuse a QP that is not UD, a destination without an address handle, a QP not in
/// RTS, more SGEs than the QP's max_send_sge (or 16), inline data above its
/// max_inline_data, a moved-from QP or address handle.
inline Result<void> post_send(QueuePair& qp, Gather local, const UdDestination& to, const PostOptions& options = {},
                              std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).send(local, to, options, where).post(where);
}

/// The remote 8 bytes become `swap` if they equal `compare`; their old value lands in
/// `result` either way. A device without atomics gives an Error before posting.
/// @errors as post_write's, and a device without atomics (kind unsupported).
/// @misuse a QP not RC or not in RTS; `result` not 8 bytes, 8-aligned; `target` shorter
/// than 8 bytes or not 8-aligned; inline_data; a moved-from QP.
inline Result<void> post_compare_swap(QueuePair& qp, const LocalSlice& result, const RemoteMemory& target,
                                      std::uint64_t compare, std::uint64_t swap, const PostOptions& options = {},
                                      std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).compare_swap(result, target, compare, swap, options, where).post(where);
}

/// Adds `add` to the remote 8 bytes; their old value lands in `result`.
/// @errors as post_compare_swap's.
/// @misuse as post_compare_swap's.
inline Result<void> post_fetch_add(QueuePair& qp, const LocalSlice& result, const RemoteMemory& target,
                                   std::uint64_t add, const PostOptions& options = {},
                                   std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).fetch_add(result, target, add, options, where).post(where);
}

// --- memory windows (rdmaxx/wrap/mw.hpp) ---------------------------------------------
/// Binds `window` to `length` bytes at `offset` of `region` with the remote `rights`
/// (type 2: the key works only through `qp`, an RC QP) and returns the descriptor to
/// hand to the peer, with the window's new key. The bind is posted on `qp`'s send queue
/// like any WR: WRs posted after it (the message that carries the key) run after it.
/// It fails with an error completion when the device refuses it (a region not
/// registered with Access::mw_bind: a pooled region's arena is).
/// Whether the device refuses an access outside the window's bytes is its business:
/// Soft-RoCE in Linux 6.1 checks only the region's (window_bounds_enforced() tells).
/// @errors the post fails (ibv_post_send, or ibv_wr_complete on a QP with the extended
/// post API); the window's key is then unchanged.
/// @misuse `rights` not remote ones (remote_read|remote_write|remote_atomic,
/// at least one), a range outside the region, a QP not RC, or not in RTS; a moved-from
/// QP, window or region.
inline Result<RemoteMemory> post_bind(QueuePair& qp, MemoryWindow& window, const MemoryRegion& region,
                                      std::size_t offset, std::size_t length, Access rights,
                                      const PostOptions& options = {},
                                      std::source_location where = std::source_location::current()) {
    SendBatch<1> batch(qp);
    if (auto posted = batch.bind(window, region, offset, length, rights, options, where).post(where); !posted)
        return std::unexpected(std::move(posted.error()));
    return batch.bound(0, where);
}
/// post_bind() of the whole region.
/// @errors as the other post_bind's.
/// @misuse as the other post_bind's.
inline Result<RemoteMemory> post_bind(QueuePair& qp, MemoryWindow& window, const MemoryRegion& region, Access rights,
                                      const PostOptions& options = {},
                                      std::source_location where = std::source_location::current()) {
    return post_bind(qp, window, region, 0, region.size(), rights, options, where);
}
/// Invalidates the window's current key (LOCAL_INV on `qp`, which bound it): once this
/// completes, an access with the key fails at the NIC with a remote access error, and
/// the window may be bound again.
/// @errors as post_bind's.
/// @misuse as post_bind's that apply: a QP not RC, or not in RTS; a moved-from QP or
/// window.
inline Result<void> post_invalidate(QueuePair& qp, const MemoryWindow& window, const PostOptions& options = {},
                                    std::source_location where = std::source_location::current()) {
    return SendBatch<1>(qp).invalidate(window, options, where).post(where);
}

namespace detail {

// The Error of a failed post of `count` receive WRs from `first` (out of line, as
// post_error); `bad` is the failing one.
[[gnu::cold]] Error post_recv_error(const char* call, int rc, const ibv_recv_wr& first, const ibv_recv_wr* bad,
                                    std::size_t count);

inline void build_recv(ibv_recv_wr& wr, std::array<ibv_sge, max_sge>& sge, Gather local, std::uint64_t wr_id,
                               std::uint32_t max_recv_sge, std::source_location where) {
    const auto slices = local.slices();
    require(slices.size() <= max_recv_sge && slices.size() <= max_sge, where,
            "{} SGEs on a receive queue with max_recv_sge {}", slices.size(), max_recv_sge);
    for (std::size_t i = 0; i < slices.size(); ++i)
        sge[i] = slices[i].sge();
    wr = {.wr_id = wr_id, .next = nullptr, .sg_list = sge.data(), .num_sge = static_cast<int>(slices.size())};
}

} // namespace detail

/// Up to N receive WRs of a QP or of a shared receive queue, posted with one call; no
/// heap. Like SendBatch, a batch stays built after post(): a loop that reposts the same
/// buffers builds them once. On UD, each buffer's first 40 bytes (ud_grh_bytes) receive
/// the GRH.
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
template <std::size_t N>
class RecvBatch {
public:
    /// An empty batch for `qp`'s receive queue; `qp` must outlive it.
    /// @misuse a QP whose receives come from an SRQ.
    explicit RecvBatch(QueuePair& qp, std::source_location where = std::source_location::current()) : qp_(&qp) {
        require(!qp.has_srq(), where, "a receive on a QP whose receives come from an SRQ");
    }
    /// An empty batch for `srq`, whose receives serve every QP attached to it; `srq`
    /// must outlive it.
    explicit RecvBatch(SharedReceiveQueue& srq) noexcept : srq_(&srq) {}

    /// How many WRs were added.
    std::size_t size() const noexcept { return count_; }
    /// Removes every WR: the next one added is WR 0.
    void clear() noexcept { count_ = 0; }

    /// Adds a receive into `local` whose completion carries `wr_id`.
    /// @misuse more SGEs than the QP's max_recv_sge or the SRQ's max_sge (or 16), a full
    /// batch.
    RecvBatch& add(Gather local, std::uint64_t wr_id, std::source_location where = std::source_location::current()) {
        require(count_ < N, where, "a RecvBatch<{}> is full", N);
        detail::build_recv(wrs_[count_], sges_[count_], local, wr_id,
                           qp_ != nullptr ? qp_->caps().max_recv_sge : srq_->max_sge(), where);
        ++count_;
        return *this;
    }
    /// The wr_id of WR k (in the order added), for the next post.
    /// @misuse k past the batch.
    RecvBatch& set_wr_id(std::size_t k, std::uint64_t wr_id,
                         std::source_location where = std::source_location::current()) {
        require(k < count_, where, "WR {} of a batch of {}", k, count_);
        wrs_[k].wr_id = wr_id;
        return *this;
    }

    /// Posts every WR with one ibv_post_recv (ibv_post_srq_recv). On failure the Error
    /// names the failing WR; the WRs before it were posted.
    /// @errors ibv_post_recv or ibv_post_srq_recv fails, e.g. ENOMEM for a full queue.
    /// @misuse an empty batch, a QP in RESET, a moved-from QP or SRQ.
    [[gnu::always_inline]] Result<void> post(std::source_location where = std::source_location::current()) {
        require(count_ > 0, where, "post of an empty batch");
        require(qp_ == nullptr || qp_->state() != QpState::reset, where,
                "a receive on a QP in RESET: bring it to INIT first");
        for (std::size_t i = 0; i < count_; ++i) {
            wrs_[i].sg_list = sges_[i].data();
            wrs_[i].next = i + 1 < count_ ? &wrs_[i + 1] : nullptr;
        }
        ibv_recv_wr* bad = nullptr;
        if (qp_ == nullptr) {
            if (const int rc = ibv_post_srq_recv(srq_->get(where), &wrs_[0], &bad); rc != 0) [[unlikely]]
                return std::unexpected(detail::post_recv_error("ibv_post_srq_recv", rc, wrs_[0], bad, count_));
        } else if (const int rc = ibv_post_recv(qp_->get(where), &wrs_[0], &bad); rc != 0) [[unlikely]] {
            return std::unexpected(detail::post_recv_error("ibv_post_recv", rc, wrs_[0], bad, count_));
        }
        return {};
    }

private:
    QueuePair* qp_ = nullptr;            // the batch's target: a QP's receive queue,
    SharedReceiveQueue* srq_ = nullptr; // or a shared one
    std::size_t count_ = 0;
    std::array<ibv_recv_wr, N> wrs_;
    std::array<std::array<ibv_sge, detail::max_sge>, N> sges_;
};

/// A receive buffer for the next incoming SEND (or WRITE_WITH_IMM's immediate): a
/// RecvBatch of one, with its checks.
/// @errors ibv_post_recv fails, e.g. ENOMEM for a full receive queue.
/// @misuse a QP whose receives come from an SRQ, more SGEs than its max_recv_sge (or
/// 16), a QP in RESET, a moved-from QP.
inline Result<void> post_recv(QueuePair& qp, Gather local, std::uint64_t wr_id,
                              std::source_location where = std::source_location::current()) {
    return RecvBatch<1>(qp, where).add(local, wr_id, where).post(where);
}

/// A receive buffer on the shared receive queue `srq`: for the next incoming SEND (or
/// WRITE_WITH_IMM's immediate) on any QP attached to it.
/// @errors ibv_post_srq_recv fails, e.g. ENOMEM for a full queue.
/// @misuse more SGEs than the SRQ's max_sge (or 16), a moved-from SRQ.
inline Result<void> post_recv(SharedReceiveQueue& srq, Gather local, std::uint64_t wr_id,
                              std::source_location where = std::source_location::current()) {
    return RecvBatch<1>(srq).add(local, wr_id, where).post(where);
}

} // namespace rdmaxx
