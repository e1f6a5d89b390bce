// The engine behind Connection: one RC queue pair and what runs over it. Each part has
// one job and a file of its own: control_codec (the bytes), credit_window (credits),
// lease_table (leases and quota), handshake (how a Link gets connected). Link itself
// keeps the conversation: send slots, the inbox, completion routing, liveness and the
// bounded waits. Connection (connection.cpp) is a facade over it that blocks between a
// call's steps; async::Connection (lib/async/src/connection.cpp) awaits between the
// same steps, driven by lib/async/src/link_driver.cpp.
//
// Not thread-safe: a Group and every Link in it are used from one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <rdmaxx/ctrl/cm.hpp>
#include <rdmaxx/ctrl/connection.hpp>
#include <rdmaxx/ctrl/tcp.hpp>
#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/qp.hpp>

#include "control_codec.hpp"
#include "credit_window.hpp"
#include "lease_table.hpp"
#include "loan.hpp"

namespace rdmaxx::detail {

class Link;

// A work request's wr_id: the top byte says what it is, the rest which one.
inline constexpr std::uint64_t tag_send = 1ull << 56, tag_recv = 2ull << 56, tag_op = 3ull << 56,
                               tag_bind = 4ull << 56;
inline constexpr std::uint64_t tag_mask = 0xffull << 56;

// The verbs objects several connections share: a Listener's accepted ones, or client
// connections made with Connection::connect_another.
struct Group {
    Context context;
    ProtectionDomain pd;
    CompletionQueue cq;
    MemoryPool pool;
    Lending lending; // memory_window or registration: ConnectionOptions::lending resolved
    std::unordered_map<std::uint32_t, Link*> links; // by QPN, while they may complete work
    // CQ entries held for the send and receive queues of the QPs that complete into cq,
    // and of those the ones whose QPs are gone but whose last completions may still be
    // in cq (freed by the next pump that empties it): the CQ never overflows, whatever
    // every peer does at once.
    std::uint32_t cq_held = 0;
    std::uint32_t cq_retired = 0;

    static Result<std::shared_ptr<Group>> create(const ConnectionOptions& options);
    // Takes every completion there is and hands it to its link; then each link
    // expires leases and sends what it queued. Never waits.
    Result<void> pump();
};

// A QP's entries in its group's CQ (its send and receive queues' sizes together), held
// from before the QP is created until after it is destroyed. Holding more than the CQ
// has grows it (ibv_resize_cq, doubling) up to the device's max_cqe.
class CqEntries {
public:
    // Errors: the CQ at max_cqe has no room for `count` more (ENOBUFS: the connection is
    // refused, the group's others go on); the device cannot resize its CQ.
    static Result<CqEntries> hold(Group& group, std::uint32_t count);
    CqEntries(CqEntries&& other) noexcept
        : group_(std::exchange(other.group_, nullptr)), count_(other.count_) {}
    CqEntries& operator=(CqEntries&&) = delete;
    ~CqEntries() {
        if (group_ != nullptr)
            group_->cq_retired += count_;
    }

private:
    CqEntries(Group& group, std::uint32_t count) : group_(&group), count_(count) {}
    Group* group_;
    std::uint32_t count_;
};

// The limits each side announces in the endpoint message's 8 metadata bytes.
struct Limits {
    std::uint32_t max_message = 0;   // largest user message it receives
    std::uint32_t receive_depth = 0; // receives it posts: the other side's credits
};
inline constexpr std::size_t limits_bytes = 8;
inline constexpr std::uint32_t max_message_limit = 1u << 30;
std::array<std::byte, limits_bytes> encode_limits(const Limits& limits) noexcept;
// Untrusted: a size other than 8, a max_message outside 1..max_message_limit or a
// receive depth outside CreditWindow's bounds is a protocol Error.
Result<Limits> decode_limits(std::span<const std::byte> metadata);

// send_local_mr's misuse checks (both Connections'): a region of another PD, one with
// no remote rights, a negative lease. Aborts naming `where`.
void check_lend(const MemoryRegion& mr, const ProtectionDomain& pd, std::chrono::milliseconds lease,
                std::source_location where);

class Link {
public:
    // A QP and its buffers in `group`, not yet connected.
    static Result<std::unique_ptr<Link>> create(std::shared_ptr<Group> group, const ConnectionOptions& options);
    Link(const Link&) = delete;
    Link& operator=(const Link&) = delete;
    // A link not closed yet closes now, within its timeout (close() below).
    ~Link();

    // --- setup (handshake.cpp) ---
    QueuePair& qp() noexcept { return qp_; }
    const ConnectionOptions& options() const noexcept { return options_; }
    Group& group() noexcept { return *group_; }
    const std::shared_ptr<Group>& shared_group() const noexcept { return group_; }
    // Our QP and limits, for the peer.
    EndpointMessage describe() const;
    // Takes the peer's limits (from its endpoint message), posts our receives and
    // starts taking completions: the peer may send from now on. The QP is connected.
    Result<void> start(const EndpointMessage& peer);
    // The side channel that reports the peer's death: quiet after the handshake.
    void watch(TcpStream stream);
    void watch(CmConnection cm);

    // --- steps: each call of Connection is steps separated by waits. Link's own calls
    // below wait between them by blocking (wait()); async::Connection (lib/async) drives
    // the same steps and awaits between them. A step never waits. ---
    const std::optional<Error>& broken() const noexcept { return broken_; }
    // Records the first failure: every later call fails with it.
    Error fail(Error e);
    // The side channel that reports the peer's death (-1: none), and reading it.
    int watch_fd() const;
    void check_peer_alive();
    const std::string& peer() const;
    // The earliest lease end, when a lease runs (Group::pump expires it).
    std::optional<Clock::time_point> next_expiry() const { return leases_.next_expiry(); }

    // send: size checked, then wait for can_send(), post, wait for sent(slot).
    Result<void> check_sendable(const LocalSlice& message) const;
    bool can_send() const; // a credit for a user message and a free send slot
    Result<std::uint32_t> post_user_message(const LocalSlice& message, std::optional<std::uint32_t> imm);
    bool sent(std::uint32_t slot) const noexcept { return !slots_.busy[slot]; }
    Result<void> send_result(std::uint32_t slot) const;
    // receive / receive_write_imm: wait for has_message() / has_write_imm().
    bool has_message() const noexcept { return !inbox_.empty(); }
    Result<Received> take_message(std::span<std::byte> into);
    bool has_write_imm() const noexcept { return !write_imms_.empty(); }
    std::uint32_t take_write_imm();
    // one-sided: wait for can_post_op(), post_op(post), wait for op_done(op), take_op(op).
    // Up to ConnectionOptions::max_send_wr operations are in flight at once.
    bool can_post_op() const noexcept { return !free_ops_.empty(); }
    template <class Post>
    Result<std::uint32_t> post_op(Post&& post);
    bool op_done(std::uint32_t op) const noexcept { return ops_[op].has_value(); }
    Result<void> take_op(std::uint32_t op);
    // write_with_imm: one of the peer's receives, so one credit (taken before the post,
    // given back when the post fails).
    bool can_take_user_credit() const;
    void take_user_credit();
    void give_back_user_credit();
    // Moves the QP to the error state after `why` (an operation ran out of time or was
    // cancelled): its posted work requests complete as flushed soon, and the caller
    // waits for them (within options().timeout) before it gives up the memory.
    void abandon(const Error& why);

    // send_local_mr: wait for can_lend(mr), then lend.
    bool can_lend(const MemoryRegion& mr) const;
    Result<void> lend(MemoryRegion mr, std::chrono::milliseconds lease);
    bool has_lent_to_us() const noexcept { return !lent_to_us_.empty(); }
    RemoteMr take_lent_to_us();
    // request_remote_mr: ask, wait for answered(request), take_answer(request).
    // A misuse aborts naming `where`: rights beyond control::known_access, a lease
    // outside 0..control::max_lease_ms.
    std::uint64_t ask_for_region(std::size_t size, Access access, std::chrono::milliseconds lease,
                                 std::source_location where);
    bool answered(std::uint64_t request) const {
        const auto it = grants_.find(request);
        return it != grants_.end() && it->second.has_value();
    }
    Result<RemoteMr> take_answer(std::uint64_t request);
    // send_remote_mr: give_back, wait for return_answered(token), take_return_answer(token).
    void give_back(std::uint64_t token);
    bool return_answered(std::uint64_t token) const {
        const auto it = return_acks_.find(token);
        return it != return_acks_.end() && !it->second.codes.empty();
    }
    Result<void> take_return_answer(std::uint64_t token);
    bool has_returned() const noexcept { return leases_.has_returned(); }
    MemoryRegion take_returned();
    // close: begin_close() (true: a goodbye is queued, wait for goodbye_done()), end_close().
    bool closed() const noexcept { return closed_; }
    bool begin_close();
    // Our sends and goodbye completed, or the peer's goodbye came (both closing at once:
    // nothing of ours is owed to a peer that left).
    bool goodbye_done() const { return peer_said_goodbye_ || (outbox_.empty() && slots_.idle()); }
    void end_close();

    // --- what Connection offers: the steps, waiting by blocking ---
    Result<void> send(const LocalSlice& message, std::optional<std::uint32_t> imm, Clock::time_point deadline);
    Result<Received> receive(std::span<std::byte> into, Clock::time_point deadline);
    Result<std::uint32_t> receive_write_imm(Clock::time_point deadline);
    // Posts a one-sided operation with `post` (given the PostOptions to use) and waits
    // for its completion. At the deadline the connection ends: the QP goes to the error
    // state and the operation's flushed completion is taken before this returns, so
    // the NIC no longer touches the caller's memory.
    template <class Post>
    Result<void> one_sided(Post&& post, Clock::time_point deadline);
    Result<void> wait_user_credit(Clock::time_point deadline);
    Result<void> send_local_mr(MemoryRegion mr, std::chrono::milliseconds lease);
    Result<RemoteMr> receive_remote_mr(Clock::time_point deadline);
    Result<RemoteMr> request_remote_mr(std::size_t size, Access access, std::chrono::milliseconds lease,
                                       Clock::time_point deadline, std::source_location where);
    Result<void> send_remote_mr(const RemoteMr& mr, Clock::time_point deadline);
    Result<MemoryRegion> receive_local_mr(Clock::time_point deadline);
    Result<void> progress();
    // Graceful: sends what is queued and a goodbye, waits (until `deadline`) for all of
    // our sends to complete, then closes the side channel. Later calls fail.
    Result<void> close(Clock::time_point deadline);

    // The bound of a wait that moves `bytes`: the per-call timeout when given, else
    // timeout + bytes * timeout_per_mib.
    Clock::time_point deadline(std::optional<std::chrono::milliseconds> timeout, std::uint64_t bytes = 0) const;
    std::uint64_t pinned_for_peer() const noexcept { return leases_.pinned_for_peer(); }

private:
    friend struct Group;
    struct Incoming {
        std::uint32_t buffer;
        std::uint32_t length;
        std::optional<std::uint32_t> imm;
    };
    // Registered buffers for outgoing headers and control messages, each busy from its
    // post until its completion.
    struct SendSlots {
        MemoryRegion mr;
        std::vector<bool> busy;
        std::vector<std::optional<Error>> error;
        std::optional<std::uint32_t> free() const;
        bool idle() const;
    };

    Link(std::shared_ptr<Group> group, const ConnectionOptions& options, CqEntries cq_entries, MemoryRegion receive,
         SendSlots slots, QueuePair qp);

    void on_completion(const WorkCompletion& wc);
    Result<void> on_receive(std::uint32_t buffer, const WorkCompletion& wc);
    Result<void> on_control(const control::Message& message);
    Result<void> grant(const control::Request& request);
    // What the peer gets to see of `region` with `rights`: its own registration, or for
    // a pooled one a registration of its bytes or a window (whose bind is posted now;
    // the loan starts when it completes: on_bound). `announce` is the Lend or Grant
    // that carries the key, sent once the key works; `charge` is what the quota counts
    // for it (0 for a region lent). Failing to register or to
    // allocate the window is an Error for this loan only; a failed post ends the link.
    Result<void> expose(MemoryRegion region, Access rights, std::uint64_t token, std::chrono::milliseconds lease,
                        control::Message announce, std::uint64_t charge);
    void on_bound();
    void start_loan(Loan loan, const RemoteMemory& key, std::uint64_t token, std::chrono::milliseconds lease,
                    control::Message announce, std::uint64_t charge);
    Result<void> post_receive(std::uint32_t buffer);
    Result<void> recycle(std::uint32_t buffer);
    void expire_leases(Clock::time_point now);

    void queue(const control::Message& message) { outbox_.push_back(message); }
    Result<void> post_message(std::uint32_t slot, std::span<const std::byte> header_and_control,
                              const LocalSlice* user, std::optional<std::uint32_t> imm);
    Result<void> flush();

    // Waits until done() or the deadline. A peer seen gone is reported only after the
    // completions already in the CQ were taken: what it sent before it went counts.
    template <class Done>
    Result<void> wait(Done&& done, const char* what, Clock::time_point deadline);
    // abandon(why), then the flushed completions taken (done()) within the drain bound.
    template <class Done>
    void abandon_and_drain(const Error& why, Done&& done);

    // A window whose bind is posted and not yet complete, with what starts on completion.
    struct Binding {
        Loan loan;
        RemoteMemory key;
        std::uint64_t token;
        std::chrono::milliseconds lease;
        control::Message announce;
        std::uint64_t charge; // against the quota: 0 for a region lent
    };

    std::shared_ptr<Group> group_;
    ConnectionOptions options_;
    CqEntries cq_entries_;
    // member order: the QP is destroyed first, then the buffers and windows it used
    MemoryRegion receive_mr_;
    SendSlots slots_;
    std::deque<Binding> binding_;     // in posting order: binds complete in order
    std::uint64_t binding_bytes_ = 0; // their charges: the quota counts them already
    QueuePair qp_;
    std::optional<TcpStream> tcp_;
    std::optional<CmConnection> cm_;
    std::uint32_t buffer_bytes_;      // receive_buffer_bytes(): header + max(max_message, control payload)
    std::uint32_t peer_max_message_ = 0;
    std::optional<CreditWindow> credits_;
    std::deque<Incoming> inbox_;      // at most receive_depth: bounded by the peer's credits
    std::deque<std::uint32_t> write_imms_; // at most max_unreceived, as lent_to_us_
    std::deque<control::Message> outbox_; // control messages waiting for a credit or slot
    std::deque<RemoteMr> lent_to_us_;
    LeaseTable<Loan> leases_;
    std::uint64_t next_request_ = 1;
    // Answers the peer may send: only to what we asked (anything else is a protocol
    // error, so a peer cannot grow these with made-up ids).
    std::map<std::uint64_t, std::optional<Result<RemoteMr>>> grants_; // request id -> answer, once there
    struct ReturnWait {
        std::uint32_t asked = 0; // Returns of the token not yet acknowledged
        std::deque<int> codes;   // acks not yet taken, in order: errno, 0 when taken back
    };
    std::map<std::uint64_t, ReturnWait> return_acks_; // token -> its Returns
    // requests for regions that this end failed to allocate or register: a peer asking
    // again and again for what memory cannot give logs a few lines a second
    rdmaxx::detail::LogBudget grant_warnings_;
    std::vector<std::optional<WorkCompletion>> ops_; // by op slot: its completion, once there
    std::vector<std::uint32_t> free_ops_;
    std::optional<Error> broken_;
    bool registered_ = false;         // in group_->links
    bool closed_ = false;
    bool peer_said_goodbye_ = false;
};

// --- templates ------------------------------------------------------------------

template <class Done>
Result<void> Link::wait(Done&& done, const char* what, Clock::time_point deadline) {
    for (;;) {
        if (auto ok = group_->pump(); !ok)
            return ok;
        if (done())
            return {};
        if (broken_)
            return std::unexpected(*broken_);
        check_peer_alive();
        if (broken_) {
            // the peer's last messages may be in the CQ already: they count
            if (auto ok = group_->pump(); !ok)
                return ok;
            if (done())
                return {};
            return std::unexpected(*broken_);
        }
        if (auto armed = group_->cq.arm(); !armed)
            return armed;
        if (auto ok = group_->pump(); !ok)
            return ok;
        if (done())
            return {};
        if (Clock::now() >= deadline)
            return std::unexpected(Error::timeout(
                "Connection", fmt::format("{}: nothing from peer {} in time", what, peer())));
        if (auto woke = group_->cq.wait_event_until(deadline, watch_fd()); !woke && !woke.error().is_timeout())
            return woke;
    }
}

template <class Done>
void Link::abandon_and_drain(const Error& why, Done&& done) {
    abandon(why);
    const auto until = deadline_after(options_.timeout);
    while (!done() && Clock::now() < until)
        if (auto ok = group_->pump(); !ok)
            break;
    if (!done())
        logger()->error("Connection: peer {}: a flushed work request did not complete within {} ms", peer(),
                        options_.timeout.count());
}

template <class Post>
Result<std::uint32_t> Link::post_op(Post&& post) {
    if (broken_)
        return std::unexpected(*broken_);
    const std::uint32_t op = free_ops_.back();
    if (auto ok = post(PostOptions{.wr_id = tag_op | op}); !ok)
        return std::unexpected(std::move(ok.error()));
    free_ops_.pop_back();
    return op;
}

template <class Post>
Result<void> Link::one_sided(Post&& post, Clock::time_point deadline) {
    if (auto ok = wait([&] { return can_post_op(); }, "a one-sided operation: waiting for room", deadline); !ok)
        return ok;
    auto op = post_op(std::forward<Post>(post));
    if (!op)
        return std::unexpected(std::move(op.error()));
    auto done = [&] { return op_done(*op); };
    if (auto ok = wait(done, "a one-sided operation", deadline); !ok) {
        if (!done())
            abandon_and_drain(ok.error(), done);
        if (!done())
            return ok; // its slot stays taken: the NIC may still complete it
        (void)take_op(*op);
        return ok;
    }
    return take_op(*op);
}

} // namespace rdmaxx::detail
