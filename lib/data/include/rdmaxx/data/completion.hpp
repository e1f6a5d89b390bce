/// @file
/// Work completions: a value type over ibv_wc, batch polling into caller memory, and
/// bounded waits (busy polling or the completion channel).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <source_location>
#include <span>
#include <type_traits>

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <rdmaxx/wrap/cq.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx {

class AsyncEvents;
class QueuePair;

/// What a completed work request did (ibv_wc_opcode, for the operations rdmaxx posts);
/// `unknown` for a failed completion and for any other opcode.
enum class WcOpcode : std::uint8_t {
    unknown, ///< a failed completion's opcode is undefined (ibv_poll_cq(3)): never read it
    send, rdma_write, rdma_read, compare_swap, fetch_add, recv, recv_rdma_with_imm,
};
/// The opcode's name in capitals ("SEND", "RDMA_WRITE", "COMPARE_SWAP", ...); "unknown"
/// for `unknown`.
std::string_view to_string(WcOpcode opcode) noexcept;

namespace detail {
// The Error of ibv_poll_cq's negative return `n`: EIO, `n` in the detail (providers
// return what they like, no errno: mlx5's is -2).
[[gnu::cold]] Error poll_error(int n);
} // namespace detail

/// One completion, layout-identical to ibv_wc so that ibv_poll_cq writes straight into
/// a caller's array of them.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe (a value; every member
/// function is const).
class WorkCompletion {
public:
    /// The wr_id the work request was posted with.
    std::uint64_t wr_id() const noexcept { return wc_.wr_id; }
    /// IBV_WC_SUCCESS, or why the work request failed (ibv_wc_status_str() names it).
    ibv_wc_status status() const noexcept { return wc_.status; }
    /// Whether the work request succeeded (status IBV_WC_SUCCESS).
    bool ok() const noexcept { return wc_.status == IBV_WC_SUCCESS; }
    /// What completed; `unknown` for a failed completion.
    WcOpcode opcode() const noexcept;
    /// Bytes transferred: for a receive, the message's length (on UD, plus the
    /// ud_grh_bytes of the GRH).
    std::uint32_t byte_len() const noexcept { return wc_.byte_len; }
    /// The immediate in host order, when the completion carries one (IBV_WC_WITH_IMM:
    /// a bit, tested as a bit: providers set other bits beside it).
    std::optional<std::uint32_t> imm() const noexcept {
        if (ok() && (wc_.wc_flags & IBV_WC_WITH_IMM))
            return ntohl(wc_.imm_data);
        return std::nullopt;
    }
    /// The number of the local QP whose work request completed.
    std::uint32_t qp_num() const noexcept { return wc_.qp_num; }
    std::uint32_t src_qp() const noexcept { return wc_.src_qp; } ///< UD receives: the sender's QPN
    std::uint16_t slid() const noexcept { return wc_.slid; }     ///< UD receives: the sender's LID (InfiniBand)
    /// Whether a global routing header came first in the buffer (IBV_WC_GRH: UD receives).
    bool has_grh() const noexcept { return (wc_.wc_flags & IBV_WC_GRH) != 0; }
    /// The ibv_wc itself, for the fields not above.
    const ibv_wc& raw() const noexcept { return wc_; }

    /// The failure as an Error (status text, wr_id, QP, vendor error).
    /// @misuse a successful completion.
    Error error(std::source_location where = std::source_location::current()) const;
    /// Success, or the failure as an Error.
    /// @errors this completion's failure: an Error of kind completion whose code is its
    /// ibv_wc_status.
    Result<void> check() const {
        if (ok()) [[likely]]
            return {};
        return std::unexpected(error());
    }

private:
    ibv_wc wc_;
};
static_assert(std::is_standard_layout_v<WorkCompletion> && sizeof(WorkCompletion) == sizeof(ibv_wc));

/// Takes up to `out.size()` completions without waiting; returns how many. Failed
/// completions are returned like the others: check each one.
/// @errors ibv_poll_cq fails (the provider's errno; EIO when it gives none).
/// @misuse a moved-from CQ.
[[gnu::always_inline]] inline Result<std::size_t> poll(const CompletionQueue& cq, std::span<WorkCompletion> out,
                                                      std::source_location where = std::source_location::current()) {
    const int n = ibv_poll_cq(cq.get(where), static_cast<int>(out.size()), reinterpret_cast<ibv_wc*>(out.data()));
    if (n < 0) [[unlikely]]
        return std::unexpected(detail::poll_error(n));
    return static_cast<std::size_t>(n);
}

/// How wait_n and wait_for wait for completions.
enum class WaitMode : std::uint8_t {
    busy_poll, ///< spin on ibv_poll_cq: lowest latency, one core
    event,     ///< sleep on the CQ's completion channel (created with CqOptions::channel)
};

/// How long and how wait_n and wait_for wait, and which device events end the wait.
struct WaitOptions {
    std::chrono::milliseconds timeout{5000}; ///< the bound of the wait
    WaitMode mode = WaitMode::busy_poll;     ///< spin, or sleep on the completion channel
    /// When set, device events that kill the wait's work (a fatal event of `qp`, a
    /// CQ error of the CQ waited on, `qp`'s port down, a fatal device error) end the
    /// wait with an Error instead of letting it run out its timeout.
    AsyncEvents* events = nullptr;
    /// The QP waited for; nullptr: any QP completing into the CQ, any port
    /// (AsyncEvents::check).
    const QueuePair* qp = nullptr;
};

namespace detail {

// The slow part of a wait, out of line: the clock, the device's fatal events and, in
// event mode, the sleep on the completion channel. A busy wait pauses every 256 empty
// polls, an event wait at every turn; the deadline starts at the first pause, so a
// busy wait that ends sooner never reads the clock.
class WaitPause {
public:
    Result<void> operator()(CompletionQueue& cq, const WaitOptions& options);

private:
    std::optional<std::chrono::steady_clock::time_point> deadline_;
};

// Hands completions to `take` until it returns true; a failed completion ends the
// wait with its Error after `take` saw it. `room()` bounds how many completions one
// poll may take: none may be taken out of the CQ that `take` will not keep. Always
// inline, with `room` and `take` inlined into it: a completion found within the
// first polls costs ibv_poll_cq and a few branches, as a hand-written loop would.
template <class Room, class Take>
[[gnu::always_inline]] inline Result<void> wait_until(CompletionQueue& cq, const WaitOptions& options, Room&& room, Take&& take,
                        std::source_location where) {
    require(options.mode != WaitMode::event || cq.has_channel(), where,
            "an event wait on a completion queue created without a channel");
    ibv_cq* const raw = cq.get(where);
    std::array<WorkCompletion, 16> batch;
    WaitPause pause;
    bool armed = false;
    for (unsigned spins = 1;; ++spins) {
        // drain what is there
        for (;;) {
            const int want = static_cast<int>(std::min<std::size_t>(room(), batch.size()));
            const int n = ibv_poll_cq(raw, want, reinterpret_cast<ibv_wc*>(batch.data()));
            if (n < 0) [[unlikely]]
                return std::unexpected(poll_error(n));
            for (int i = 0; i < n; ++i) {
                const bool done = take(batch[static_cast<std::size_t>(i)]);
                if (!batch[static_cast<std::size_t>(i)].ok()) [[unlikely]]
                    return std::unexpected(batch[static_cast<std::size_t>(i)].error());
                if (done)
                    return {};
            }
            if (n < want)
                break;
        }
        if (options.mode == WaitMode::event && !armed) {
            // arm, then drain once more before sleeping: a completion that landed
            // before the arm raises no event
            if (auto ok = cq.arm(); !ok)
                return ok;
            armed = true;
            continue;
        }
        armed = false;
        if (options.mode == WaitMode::event || spins % 256 == 0)
            if (auto ok = pause(cq, options); !ok)
                return ok;
    }
}

} // namespace detail

/// Waits until `n` completions were taken into `out`. A failed completion ends the
/// wait early with its Error (it and those before it are in `out`). A timeout is an
/// Error of kind timeout.
/// @errors a failed completion (kind completion), the timeout (kind timeout), a failed
/// ibv_poll_cq or, in event mode, a failed wait on the completion channel; with
/// WaitOptions::events, a device event that kills the work (event_error).
/// @misuse n > out.size(), event mode on a CQ without a channel, a moved-from CQ.
[[gnu::always_inline]] inline Result<void> wait_n(CompletionQueue& cq, std::span<WorkCompletion> out, std::size_t n,
                           const WaitOptions& options = {},
                           std::source_location where = std::source_location::current()) {
    require(n <= out.size(), where, "wait_n for {} completions into room for {}", n, out.size());
    std::size_t taken = 0;
    auto take = [&](const WorkCompletion& wc) {
        out[taken++] = wc;
        return taken == n;
    };
    auto room = [&] { return n - taken; };
    if (n == 0)
        return {};
    return detail::wait_until(cq, options, room, take, where);
}

namespace detail {
// wait_for's `other` when none is given: another WR's successful completion then
// has nowhere to go.
struct NoOtherCompletions {};
} // namespace detail

/// Waits for the completion of `wr_id`, taking one completion at a time so that none
/// after it leaves the CQ. Completions of other WRs taken meanwhile are handed to
/// `other`; a failed one ends the wait with its Error. Without `other`, the CQ must
/// hold no successful completion of another WR (a programming error otherwise, naming
/// both wr_ids: it would be lost). Pass a handler that drops them to mean dropping.
/// @errors as wait_n's: a failed completion (of `wr_id` or of another WR), the timeout,
/// a failed ibv_poll_cq or channel wait, a device event that kills the work.
/// @misuse without `other`, a successful completion of another WR; event mode on a CQ
/// without a channel; a moved-from CQ.
template <class Other = detail::NoOtherCompletions>
Result<WorkCompletion> wait_for(CompletionQueue& cq, std::uint64_t wr_id, const WaitOptions& options = {},
                                Other&& other = {},
                                std::source_location where = std::source_location::current()) {
    WorkCompletion found;
    auto take = [&](const WorkCompletion& wc) {
        if (wc.wr_id() == wr_id) {
            found = wc;
            return true;
        }
        if constexpr (std::is_same_v<std::remove_cvref_t<Other>, detail::NoOtherCompletions>)
            require(!wc.ok(), where, "wait_for(wr_id {}) took the completion of wr_id {} and has no `other` to give it to",
                    wr_id, wc.wr_id());
        else
            other(wc);
        return false;
    };
    auto room = [] { return std::size_t{1}; };
    if (auto ok = detail::wait_until(cq, options, room, take, where); !ok)
        return std::unexpected(std::move(ok.error()));
    return found;
}

} // namespace rdmaxx
