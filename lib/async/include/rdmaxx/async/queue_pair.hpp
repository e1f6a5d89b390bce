/// @file
/// Asynchronous RDMA operations on a QP: post, and complete when the work completion
/// arrives. Every operation takes an Asio completion token and completes with
/// `Result<WorkCompletion>`:
///
/// @code
/// Result<WorkCompletion> done = co_await qp.write(local, remote, asio::use_awaitable);
/// @endcode
///
/// (the default token is asio::use_awaitable; callbacks, asio::use_future and
/// asio::experimental::as_tuple work as well). Many operations may be in flight on one
/// QP and across QPs from one thread; an operation is posted when the QP's queue has
/// room for it (a credit wait, in order), so that many coroutines never overflow it.
///
/// Doorbells: a send-side operation started by a handler that a poll of the
/// Completions service runs (a coroutine resumed by its completion that starts its next
/// operation) is held, its queue entry taken, when more of the poll's handlers follow
/// or when its handler has posted a send already; the held sends of a QP are posted as
/// one chain, one ibv_post_send, once the poll's handlers are done and before it
/// returns: many operations in flight cost a doorbell per poll, not one each
/// (Completions::held_doorbells() counts them). The first send of a poll's last handler
/// is posted at once, as is an operation started anywhere else: a lone operation's
/// latency pays nothing for this. Receives and SendBatch posts are never held (a batch
/// posts its QP's held sends first, and a send is held behind held ones: a QP's sends
/// keep their order).
///
/// The rules that keep the NIC from writing into freed memory:
///  * An operation completes only when its work completion has been taken from the CQ:
///    never before, whatever happens. Its memory must stay valid until then, as every
///    Asio operation's buffers must; for a coroutine that awaits it this holds by
///    construction (the frame stays suspended until the completion).
///  * Cancelling a posted operation (Asio's cancellation slot with a terminal type,
///    which is what `op || timer` and parallel_group emit) moves the QP to the error
///    state: the operation completes with an Error of kind cancelled when its flush
///    completion arrives, and the QP is then dead (every other operation completes with
///    a flush error, every later one fails at once). An operation still waiting for
///    queue room is cancelled cleanly (any cancellation type) and the QP lives on.
///  * Destroying this object, or the io_context, with operations in flight quiesces
///    first: the QP goes to the error state and its flush completions are taken (the
///    handlers of a destroyed io_context are then destroyed uncalled).
///  * A failed work completion kills the QP the same way (RC QPs enter the error state
///    at the first one).
///  * So does a device event that concerns the QP (its fatal error, its port down, its
///    CQ in error, the device fatal: rdmaxx/async/completions.hpp): its operations end
///    with the event's Error (a port down: ENETDOWN), a posted one at its flush
///    completion, one waiting for queue entries at once.
///
/// The operations' checks are those of rdmaxx/data/post.hpp (programming errors naming
/// the caller's line), made when the operation is called. Of PostOptions, wr_id and
/// signaled are the operation's own: every operation is signaled and named by its slot.
///
/// @threadsafety As the io_context (rdmaxx/async/completions.hpp).
#pragma once

#include <cstdint>
#include <source_location>
#include <utility>

#include <asio/async_result.hpp>
#include <asio/use_awaitable.hpp>

#include <rdmaxx/async/completions.hpp>
#include <rdmaxx/async/detail/qp_core.hpp>
#include <rdmaxx/data/post.hpp>

namespace rdmaxx::async {

namespace detail {

// An operation's slot between the call (which builds its WR, with the call's checks)
// and its initiation (which stores the handler and posts). Dropped uninitiated (an
// awaitable never awaited), it gives the slot back.
class Claim {
public:
    explicit Claim(Op& op) noexcept : op_(&op) {}
    Claim(Claim&& other) noexcept : op_(std::exchange(other.op_, nullptr)) {}
    Claim& operator=(Claim&&) = delete;
    // inline: every operation destroys one or two moved-from claims
    ~Claim() {
        if (op_ != nullptr) [[unlikely]]
            give_back(*op_);
    }
    Op& op() const noexcept { return *op_; }
    Op& take() noexcept { return *std::exchange(op_, nullptr); }

private:
    static void give_back(Op& op) noexcept;
    Op* op_;
};

struct Initiate {
    template <class Handler>
    void operator()(Handler&& handler, Claim claim) const {
        Op& op = claim.take();
        using Box = HandlerBox<std::decay_t<Handler>, asio::io_context::executor_type>;
        Box::store(op, std::forward<Handler>(handler), io_executor(op));
        auto slot = asio::get_associated_cancellation_slot(static_cast<Box*>(op.handler)->handler);
        if (slot.is_connected())
            slot.template emplace<CancelOp>(service(op), op.index, op.generation);
        start(op);
    }
    static asio::io_context::executor_type io_executor(const Op& op) noexcept {
        return op.qp->service->get_io_context().get_executor();
    }
    static Completions* service(const Op& op) noexcept { return op.qp->service; }
};

template <class Token>
auto initiate(Token&& token, Claim claim) {
    return asio::async_initiate<Token, void(OpResult)>(Initiate{}, token, std::move(claim));
}

template <std::size_t N>
Result<void> post_batch(void* batch, std::uint64_t wr_id, std::size_t& accepted, const ibv_send_wr*& first,
                        std::source_location where) {
    auto& b = *static_cast<SendBatch<N>*>(batch);
    for (std::size_t k = 0; k < b.size(); ++k)
        b.set_wr_id(k, wr_id, where).set_signaled(k, k + 1 == b.size(), where);
    Result<void> posted = b.post(where);
    accepted = posted ? b.size() : b.accepted();
    first = &b.work_request(0, where);
    return posted;
}

} // namespace detail

/// A verbs QP whose operations are Asio asynchronous operations, each completing with
/// `Result<WorkCompletion>` once its work completion is taken (the top of queue_pair.hpp
/// tells the rules). Move-only.
///
/// @anchor async_qp_errors
/// @par Runtime errors of every operation
/// An operation completes with an Error, never before its work completion is taken
/// if it was posted:
///  - the QP dead before it was posted (a failed completion, a cancellation after a
///    post, a device event): that Error, at once;
///  - the device refusing the post (ibv_post_send's or ibv_post_recv's errno). When
///    the device may have taken some of its WRs (a batch refused after its first WRs;
///    a provider failing a post, or the doorbell of sends held together, without naming
///    the WR it refused) the QP is moved to the error state and the operation completes
///    only once they are flushed (a WR that ran before, as it ran); the QP's other
///    operations then fail as on a dead QP;
///  - a failed work completion: kind completion (its ibv_wc_status); the event's
///    Error (a port down: ENETDOWN) once a device event killed the QP; kind cancelled
///    for the operation cancelled after its post;
///  - cancelled while waiting for queue room: kind cancelled (the QP lives on);
///  - the QueuePair destroyed: a waiting operation kind cancelled, a posted one its
///    flush completion.
///
/// @par Programming errors of every operation
/// A moved-from QueuePair, and the checks of rdmaxx/data/post.hpp, named at the
/// caller's line: more SGEs than the QP was created with, inline data above its
/// max_inline_data, an operation its type does not support, and, once a send-side
/// operation is posted, a QP not in RTS.
///
/// @threadsafety As the io_context, which one thread runs (rdmaxx/async/completions.hpp).
class QueuePair : rdmaxx::detail::MoveOnly {
public:
    /// The completion token when none is given.
    using DefaultToken = asio::use_awaitable_t<>;

    /// Attaches `qp`, created on send_cq.get() and recv_cq.get() (of one io_context), in
    /// any state: connect it (get()) before its first operation. The CQs must have room
    /// for every completion their QPs can have due at once: a CQ's depth at least the
    /// sum of the send and receive queue depths of the QPs attached to it (an overrun
    /// CQ loses completions, and some devices do not say so).
    /// @misuse A QP not created on these CQs, CQs of two io_contexts, a sink CQ, a QP
    /// whose receives come from an SRQ, CQs without that room, a moved-from argument.
    static QueuePair attach(rdmaxx::QueuePair qp, CompletionQueue& send_cq, CompletionQueue& recv_cq,
                            std::source_location where = std::source_location::current());

    /// Takes over `other`'s QP; `other` is left moved-from.
    QueuePair(QueuePair&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}
    /// Lets go of this one's QP, as the destructor does, then takes over `other`'s.
    QueuePair& operator=(QueuePair&& other) noexcept;
    /// Quiesces (see the top of queue_pair.hpp); waits for the flush completions without
    /// running the io_context (their handlers are posted to it). A device that gives
    /// no flush completion within 10 s has its QP leaked, not destroyed under a DMA.
    ~QueuePair();

    /// The verbs QP: connect it, read its endpoint. Posting on it directly is a
    /// programming error the library cannot see (its completions would be lost).
    /// @misuse A moved-from QueuePair.
    rdmaxx::QueuePair& get(std::source_location where = std::source_location::current()) const;
    /// Operations whose completion is due.
    std::size_t posted() const noexcept { return state_ ? state_->posted : 0; }
    /// Why the QP can complete nothing more, if it cannot.
    /// @misuse A moved-from QueuePair.
    const std::optional<Error>& dead(std::source_location where = std::source_location::current()) const;

    /// @name Operations
    /// Each takes an Asio completion token (default: asio::use_awaitable) and completes
    /// with `Result<WorkCompletion>`: the runtime and programming errors of every
    /// operation are in the class description.
    /// @{

    /// RDMA WRITE of `local` to the start of `remote`.
    /// @errors @ref async_qp_errors "Those of every operation".
    /// @misuse @ref async_qp_errors "Those of every operation" (a UD QP, among them),
    /// and a remote slice smaller than the local data.
    template <class Token = DefaultToken>
    auto write(Gather local, const RemoteMemory& remote, Token&& token = {}, const PostOptions& options = {},
               std::source_location where = std::source_location::current()) {
        detail::Claim claim = send("write", where);
        rdmaxx::detail::build_rdma(wr(claim), state_->qp, IBV_WR_RDMA_WRITE, local, remote, options, where);
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// RDMA WRITE that consumes a receive of the peer's, which completes with `imm`.
    /// `imm` in host order.
    /// @errors @ref async_qp_errors "Those of every operation".
    /// @misuse As write().
    template <class Token = DefaultToken>
    auto write_with_imm(Gather local, const RemoteMemory& remote, std::uint32_t imm, Token&& token = {},
                        const PostOptions& options = {}, std::source_location where = std::source_location::current()) {
        detail::Claim claim = send("write_with_imm", where);
        rdmaxx::detail::build_rdma(wr(claim), state_->qp, IBV_WR_RDMA_WRITE_WITH_IMM, local, remote, options, where);
        wr(claim).wr.imm_data = htonl(imm);
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// RDMA READ of the start of `remote` into `local`.
    /// @errors @ref async_qp_errors "Those of every operation".
    /// @misuse As write(), and a QP other than RC, inline data.
    template <class Token = DefaultToken>
    auto read(Gather local, const RemoteMemory& remote, Token&& token = {}, const PostOptions& options = {},
              std::source_location where = std::source_location::current()) {
        detail::Claim claim = send("read", where);
        rdmaxx::detail::build_rdma(wr(claim), state_->qp, IBV_WR_RDMA_READ, local, remote, options, where);
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// RC/UC send; a UD send takes a destination.
    /// @errors @ref async_qp_errors "Those of every operation".
    /// @misuse @ref async_qp_errors "Those of every operation", and a UD QP.
    template <class Token = DefaultToken>
    auto send(Gather local, Token&& token = {}, const PostOptions& options = {},
              std::source_location where = std::source_location::current()) {
        require(state(where).qp.type() != QpType::ud, where, "a send on a UD QP needs a UdDestination");
        detail::Claim claim = send("send", where);
        rdmaxx::detail::build(wr(claim), state_->qp, IBV_WR_SEND, local, options, where);
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// RC/UC send whose receive completes with `imm`, in host order.
    /// @errors @ref async_qp_errors "Those of every operation".
    /// @misuse @ref async_qp_errors "Those of every operation", and a UD QP.
    template <class Token = DefaultToken>
    auto send_with_imm(Gather local, std::uint32_t imm, Token&& token = {}, const PostOptions& options = {},
                       std::source_location where = std::source_location::current()) {
        require(state(where).qp.type() != QpType::ud, where, "a send on a UD QP needs a UdDestination");
        detail::Claim claim = send("send_with_imm", where);
        rdmaxx::detail::build(wr(claim), state_->qp, IBV_WR_SEND_WITH_IMM, local, options, where);
        wr(claim).wr.imm_data = htonl(imm);
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// UD send to the destination `to`. The address handle must stay alive until the
    /// operation completes.
    /// @errors @ref async_qp_errors "Those of every operation".
    /// @misuse @ref async_qp_errors "Those of every operation", a QP other than UD, a
    /// destination without an address handle.
    template <class Token = DefaultToken>
    auto send(Gather local, const UdDestination& to, Token&& token = {}, const PostOptions& options = {},
              std::source_location where = std::source_location::current()) {
        require(state(where).qp.type() == QpType::ud, where, "a UdDestination on a {} QP", state_->qp.type());
        require(to.ah != nullptr, where, "a UdDestination without an address handle");
        detail::Claim claim = send("send", where);
        rdmaxx::detail::build(wr(claim), state_->qp, IBV_WR_SEND, local, options, where);
        wr(claim).wr.wr.ud = {.ah = to.ah->get(where), .remote_qpn = to.qpn, .remote_qkey = to.qkey};
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// Atomic compare-and-swap of the 8 bytes at `target`: `swap` replaces them if they
    /// equal `compare`. The old remote value lands in `result`. A device without
    /// atomics: an Error.
    /// @errors A device without atomics (unsupported); otherwise
    /// @ref async_qp_errors "those of every operation".
    /// @misuse @ref async_qp_errors "Those of every operation", a QP other than RC,
    /// inline data, a `result` not 8 bytes and 8-aligned, a `target` shorter than 8
    /// bytes or not 8-aligned.
    template <class Token = DefaultToken>
    auto compare_swap(const LocalSlice& result, const RemoteMemory& target, std::uint64_t compare, std::uint64_t swap,
                      Token&& token = {}, const PostOptions& options = {},
                      std::source_location where = std::source_location::current()) {
        detail::Claim claim = send("compare_swap", where);
        rdmaxx::detail::build_atomic(wr(claim), state_->qp, IBV_WR_ATOMIC_CMP_AND_SWP, result, target, compare, swap,
                                     options, where);
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// Atomic fetch-and-add of `add` to the 8 bytes at `target`; the old remote value
    /// lands in `result`.
    /// @errors As compare_swap().
    /// @misuse As compare_swap().
    template <class Token = DefaultToken>
    auto fetch_add(const LocalSlice& result, const RemoteMemory& target, std::uint64_t add, Token&& token = {},
                   const PostOptions& options = {}, std::source_location where = std::source_location::current()) {
        detail::Claim claim = send("fetch_add", where);
        rdmaxx::detail::build_atomic(wr(claim), state_->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, result, target, add, 0,
                                     options, where);
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// A prebuilt batch as one operation: its WRs are given the operation's wr_id, the
    /// last one alone signaled, and it completes with the last one's completion (or the
    /// first failure). It takes as many queue entries as it has WRs. The batch must
    /// stay alive and unchanged until the operation completes.
    /// @errors @ref async_qp_errors "Those of every operation". A batch the device
    /// refuses after taking its first WRs (ibv_post_send took those before the refused
    /// one) kills the QP, and completes with the refusal only once they are flushed.
    /// @misuse A batch of another QP, an empty one, one larger than the queue; a
    /// moved-from QueuePair; a QP not in RTS when the batch is posted; a QP created
    /// with QpOptions::signal_all (its first WR's completion would end the operation
    /// while the others run).
    template <std::size_t N, class Token = DefaultToken>
    auto post(SendBatch<N>& batch, Token&& token = {}, std::source_location where = std::source_location::current()) {
        require(&batch.queue_pair() == &state(where).qp, where, "a SendBatch of QP {:#x} posted on QP {:#x}",
                batch.queue_pair().qpn(), state_->qp.qpn());
        require(batch.size() > 0 && batch.size() <= state_->qp.caps().max_send_wr, where,
                "a batch of {} WRs on a send queue of {}", batch.size(), state_->qp.caps().max_send_wr);
        require(!state_->qp.signals_all(), where,
                "a batch on QP {:#x}, created with signal_all: its first WR's completion would end it while the others "
                "run", state_->qp.qpn());
        detail::Claim claim = send("post(batch)", where);
        detail::Op& op = claim.op();
        op.kind = detail::Op::Kind::batch;
        op.credits = static_cast<std::uint32_t>(batch.size());
        op.wr.batch = {.batch = &batch, .post = &detail::post_batch<N>};
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }
    /// A receive buffer for the next incoming SEND or WRITE_WITH_IMM; completes with it
    /// (byte_len(), imm()). On UD the buffer's first 40 bytes receive the GRH.
    /// @errors @ref async_qp_errors "Those of every operation".
    /// @misuse A moved-from QueuePair, more SGEs than the QP's max_recv_sge.
    template <class Token = DefaultToken>
    auto receive(Gather local, Token&& token = {}, std::source_location where = std::source_location::current()) {
        detail::Claim claim = claim_op(detail::Op::Kind::recv, "receive", where);
        detail::Op& op = claim.op();
        rdmaxx::detail::build_recv(op.wr.recv.wr, op.wr.recv.sge, local, 0, state_->qp.caps().max_recv_sge, where);
        return detail::initiate(std::forward<Token>(token), std::move(claim));
    }

    /// @}

private:
    explicit QueuePair(detail::QpCore* state) : state_(state) {}
    detail::QpCore& state(std::source_location where) const {
        require(state_ != nullptr, where, "use of a moved-from async::QueuePair");
        return *state_;
    }
    // inline, as the rest of an operation's call: one out-of-line call per operation
    // (start()) once the WR is built
    detail::Claim claim_op(detail::Op::Kind kind, const char* call, std::source_location where) {
        detail::QpCore& qp = state(where);
        detail::Op& op = qp.service->slab().acquire();
        op.qp = &qp;
        op.kind = kind;
        op.credits = 1;
        op.call = call;
        op.where = where;
        return detail::Claim(op);
    }
    detail::Claim send(const char* call, std::source_location where) {
        return claim_op(detail::Op::Kind::send, call, where);
    }
    static rdmaxx::detail::SendWr& wr(detail::Claim& claim) noexcept { return claim.op().wr.send; }

    detail::QpCore* state_;
};

} // namespace rdmaxx::async
