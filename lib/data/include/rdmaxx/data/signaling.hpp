/// @file
/// Selective signaling made safe. Signaling one WR in k saves completions, but an
/// unsignaled WR leaves the send queue only when a later signaled one completes: post
/// more than the queue's depth without reaping one and ibv_post_send fails with ENOMEM
/// (or, on some providers, the queue silently wraps). SignaledSendQueue keeps the count.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <source_location>
#include <vector>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>

namespace rdmaxx {

/// The send queue of one QP under selective signaling: next() hands out each WR's
/// PostOptions, signaling one in `interval`, and reaps completions whenever the queue
/// is full, so that a post never finds it overfilled.
///
/// A failed completion ends the count: the QP is in error and flushes every WR,
/// signaled or not, so no later completion says which WRs left the queue. That Error
/// is then what next() and drain() return, for good.
///
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class SignaledSendQueue : detail::MoveOnly {
public:
    /// Signals every `interval`-th WR of `qp`, whose send completions go to `send_cq`
    /// and to nowhere else: this object reaps them. `send_cq` takes no receive
    /// completions either (this object would take one and lose it).
    /// @misuse interval 0 or above the QP's send queue depth, a QP that signals every
    /// WR anyway (a receive completion found in `send_cq` aborts next() or drain()).
    SignaledSendQueue(QueuePair& qp, CompletionQueue& send_cq, std::uint32_t interval,
                      std::source_location where = std::source_location::current())
        : qp_(&qp), cq_(&send_cq), depth_(qp.caps().max_send_wr), interval_(interval), signaled_(depth_) {
        require(interval >= 1 && interval <= depth_, where,
                "signal interval {} outside 1..{} (the send queue depth)", interval, depth_);
        require(!qp.signals_all(), where,
                "a SignaledSendQueue on QP {:#x}, created with signal_all: its unsignaled WRs would complete too",
                qp.qpn());
    }

    /// The options for the next WR, counted as posted: `signaled` set on every
    /// interval-th WR (and when `force_signal`, e.g.\ for the last WR of a stream).
    /// Waits, reaping completions, while the send queue is full. A post that then
    /// fails must be given back with unpost(). A failed completion is its Error; a completion of
    /// another QP in `send_cq` is a programming error.
    /// @errors a failed completion reaped, now or before (kind completion); no
    /// completion within `timeout` while the queue is full (kind timeout); ibv_poll_cq
    /// fails.
    /// @misuse a completion of another QP in `send_cq`, a receive's, or one of a WR this
    /// object did not signal; a moved-from CQ or SignaledSendQueue.
    Result<PostOptions> next(PostOptions options = {}, bool force_signal = false,
                             std::chrono::milliseconds timeout = std::chrono::seconds(5),
                             std::source_location where = std::source_location::current()) {
        live(where);
        if (failed_) [[unlikely]]
            return std::unexpected(*failed_);
        if (posted_ - retired_ == depth_) [[unlikely]] {
            if (auto ok = reap(timeout, where); !ok)
                return std::unexpected(std::move(ok.error()));
        }
        options.signaled = force_signal || ++since_signal_ == interval_;
        if (options.signaled) {
            since_signal_ = 0;
            signaled_[signaled_tail_] = posted_;
            signaled_tail_ = (signaled_tail_ + 1) % depth_;
            ++signaled_count_;
        }
        ++posted_;
        return options;
    }

    /// The last `count` WRs that next() counted were not posted: ibv_post_send failed
    /// at the first of them (SendBatch: count = its size - accepted()). Forgets them, so
    /// that drain() waits for no completion that cannot come.
    /// @misuse more than are outstanding; a moved-from SignaledSendQueue.
    void unpost(std::uint32_t count, std::source_location where = std::source_location::current()) {
        live(where);
        require(count <= posted_ - retired_, where, "unpost({}) with {} WRs outstanding", count, posted_ - retired_);
        posted_ -= count;
        while (signaled_count_ != 0 && signaled_[(signaled_tail_ + depth_ - 1) % depth_] >= posted_) {
            signaled_tail_ = (signaled_tail_ + depth_ - 1) % depth_;
            --signaled_count_;
        }
        // the WRs since the last signaled one, posted or retired
        const std::uint64_t after =
            signaled_count_ != 0 ? signaled_[(signaled_tail_ + depth_ - 1) % depth_] + 1 : retired_;
        since_signal_ = static_cast<std::uint32_t>(posted_ - std::min(after, posted_));
    }

    /// Reaps until every signaled WR completed. WRs after the last signaled one stay
    /// outstanding: signal the last WR of a stream (next(options, true)).
    /// @errors as next()'s: a failed completion, a timeout (`timeout` for each signaled
    /// WR), a failed ibv_poll_cq.
    /// @misuse as next()'s.
    Result<void> drain(std::chrono::milliseconds timeout = std::chrono::seconds(5),
                       std::source_location where = std::source_location::current()) {
        live(where);
        if (failed_)
            return std::unexpected(*failed_);
        while (signaled_count_ != 0)
            if (auto ok = reap(timeout, where); !ok)
                return ok;
        return {};
    }

    /// WRs posted and not yet known to have left the send queue (after a failed
    /// completion, those counted before it).
    std::uint64_t outstanding() const noexcept { return posted_ - retired_; }

private:
    // A move empties the ring: a moved-from object's next() would write past it.
    void live(std::source_location where) const {
        require(!signaled_.empty(), where, "a moved-from SignaledSendQueue");
    }

    // Waits for the next signaled WR's completion, which retires it and every
    // unsignaled WR before it. One at a time: each retires a whole interval.
    Result<void> reap(std::chrono::milliseconds timeout, std::source_location where) {
        const auto retire = [&](const WorkCompletion& wc) {
            require(wc.qp_num() == qp_->qpn(), where,
                    "a completion of QP {:#x} in the send CQ of a SignaledSendQueue for QP {:#x}", wc.qp_num(),
                    qp_->qpn());
            if (!wc.ok()) { // maybe the flush of an unsignaled WR: it retires nothing we know of
                failed_ = wc.error(where);
                return true;
            }
            // a successful completion's opcode is defined
            require(wc.raw().opcode != IBV_WC_RECV && wc.raw().opcode != IBV_WC_RECV_RDMA_WITH_IMM, where,
                    "a receive completion of QP {:#x} in the send CQ of its SignaledSendQueue (it would be lost)",
                    wc.qp_num());
            require(signaled_count_ != 0, where, "a completion for a WR this SignaledSendQueue did not signal");
            retired_ = signaled_[signaled_head_] + 1;
            signaled_head_ = (signaled_head_ + 1) % depth_;
            --signaled_count_;
            return true;
        };
        return detail::wait_until(*cq_, {.timeout = timeout}, [] { return std::size_t{1}; }, retire, where);
    }

    QueuePair* qp_;
    CompletionQueue* cq_;
    std::uint32_t depth_;
    std::uint32_t interval_;
    std::uint32_t since_signal_ = 0;
    std::uint64_t posted_ = 0;
    std::uint64_t retired_ = 0;
    // sequence numbers of the signaled WRs in flight, oldest first (a ring)
    std::vector<std::uint64_t> signaled_;
    std::size_t signaled_head_ = 0, signaled_tail_ = 0, signaled_count_ = 0;
    std::optional<Error> failed_; // the first failed completion: sticky
};

} // namespace rdmaxx
