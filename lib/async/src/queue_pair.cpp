#include <rdmaxx/async/queue_pair.hpp>
#include <rdmaxx/wrap/log.hpp>

#include <chrono>
#include <thread>

namespace rdmaxx::async {

namespace detail {

namespace {

bool is_atomic(const Op& op) noexcept {
    return op.kind == Op::Kind::send && (op.wr.send.wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
                                         op.wr.send.wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD);
}

// Completes an operation that was never posted (or whose post failed), deferred: an
// initiating function never calls its handler inline.
void fail(Completions& service, Op& op, Error why) {
    op.qp = nullptr;
    if (service.shut_down()) {
        op.table->destroy(op);
        service.slab().release(op);
        return;
    }
    op.table->complete(op, std::unexpected(std::move(why)), true, service.slab());
}

void fail(Op& op, Error why) { fail(*op.qp->service, op, std::move(why)); }

// `op`'s WR went to the device: its completion is due.
[[gnu::always_inline]] inline void mark_posted(QpCore& qp, Op& op) {
    op.state = Op::State::posted;
    ++qp.posted;
    qp.service->posted(op.kind == Op::Kind::recv ? *qp.recv_cq : *qp.send_cq);
}

// Fails a held send (never posted): its entries come back.
void drop_held(QpCore& qp, Op& op, Error why) {
    qp.send_held.remove(op);
    qp.send_credits += op.credits;
    fail(op, std::move(why));
}

// Links a send's WR to its storage and its slot, signaled, ending the chain.
[[gnu::always_inline]] inline ibv_send_wr& prepare(Op& op) {
    ibv_send_wr& wr = op.wr.send.wr;
    wr.wr_id = op.wr_id();
    wr.next = nullptr;
    wr.sg_list = op.wr.send.sge.data();
    wr.send_flags |= IBV_SEND_SIGNALED;
    return wr;
}

// Posts one receive WR; `accepted`: 1 when the device took it or may have (a provider
// that fails without naming the WR it refused), else 0.
[[gnu::always_inline]] inline Result<void> post_receive_wr(QpCore& qp, ibv_recv_wr& wr, std::size_t& accepted,
                                                           std::source_location where) {
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(qp.qp.get(where), &wr, &bad); rc != 0) [[unlikely]] {
        accepted = bad == nullptr ? 1 : 0;
        return std::unexpected(rdmaxx::detail::post_recv_error("ibv_post_recv", rc, wr, bad, 1));
    }
    accepted = 1;
    return {};
}

// Posts a batch or a receive; `accepted`: the WRs the device took (or may have), `first`
// a batch's first WR.
Result<void> post_other(QpCore& qp, Op& op, std::size_t& accepted, const ibv_send_wr*& first) {
    accepted = 0;
    if (op.kind == Op::Kind::batch) {
        ring(qp); // the sends held before it go first: a QP's sends keep their order
        if (qp.dead) [[unlikely]] // their doorbell failed
            return std::unexpected(*qp.dead);
        return op.wr.batch.post(op.wr.batch.batch, op.wr_id(), accepted, first, op.where);
    }
    ibv_recv_wr& wr = op.wr.recv.wr;
    wr.wr_id = op.wr_id();
    wr.next = nullptr;
    wr.sg_list = op.wr.recv.sge.data();
    return post_receive_wr(qp, wr, accepted, op.where);
}

// `op`'s flush marker (complete_by_flush): a signaled empty WR of its queue with its
// wr_id; `first`: a send's WR (the marker's UD destination).
[[gnu::cold]] void post_flush_marker(QpCore& qp, Op& op, const ibv_send_wr* first) {
    Result<void> posted;
    std::size_t accepted = 0;
    if (op.kind == Op::Kind::recv) {
        ibv_recv_wr marker{};
        marker.wr_id = op.wr_id();
        posted = post_receive_wr(qp, marker, accepted, op.where);
    } else {
        ibv_send_wr marker{};
        marker.wr_id = op.wr_id();
        marker.opcode = IBV_WR_SEND;
        marker.send_flags = IBV_SEND_SIGNALED;
        marker.wr.ud = first->wr.ud; // a UD QP's destination; the other types ignore it
        posted = rdmaxx::detail::submit(qp.qp, marker, 1, accepted, op.where);
    }
    if (!posted)
        logger()->error("rdmaxx: QP {:#x}: the flush marker after a failed post: {} (the operation completes with "
                        "its WRs' flush, if one comes)",
                        qp.qp.qpn(), posted.error());
}

// A post that failed with WRs the device may have taken: a batch refused at a WR after
// its first (those before it run, the last of them unsignaled: no completion need come
// for them), or a post whose provider did not say which WR it refused (any may run).
// The operation completes only once the NIC is done with them (its memory is the
// caller's again then): the QP is moved to the error state, and a marker (a signaled
// empty WR with the operation's wr_id) is flushed behind them. Its completion, or a
// flushed WR's before it, completes the operation with the post's Error (a WR that ran
// before the QP stopped completes it as it ran). A send's marker goes in once the QP is
// in the error state (it would run before); a receive's while the QP still runs: whether
// a receive posted in the error state is flushed is up to the provider (and if the
// receive was not taken, its marker may take a message first: a zero-length one
// completes the operation successfully, a longer one with a length error). The caller
// kills the QP when it may (kill() may destroy it).
[[gnu::cold]] void complete_by_flush(QpCore& qp, Op& op, const ibv_send_wr* first, const Error& why) {
    mark_posted(qp, op);
    op.completes_by_flush = true;
    if (op.kind == Op::Kind::recv)
        post_flush_marker(qp, op, first);
    halt(qp, why);
    if (op.kind != Op::Kind::recv)
        post_flush_marker(qp, op, first);
}

// A post of `op` that failed with `accepted` of its WRs taken (or maybe taken): none,
// the operation fails at once; else it completes by their flush, the QP killed.
[[gnu::cold]] void post_failed(QpCore& qp, Op& op, std::size_t accepted, const ibv_send_wr* first, Error why) {
    if (accepted == 0) {
        fail(op, std::move(why));
        return;
    }
    (op.kind == Op::Kind::recv ? qp.recv_credits : qp.send_credits) -= op.credits;
    complete_by_flush(qp, op, first, why);
    kill(qp, *qp.dead); // last: failing the waiting operations may destroy `qp` (kill())
}

void post(Op& op) {
    QpCore& qp = *op.qp;
    if (op.kind != Op::Kind::send) {
        std::size_t accepted = 0;
        const ibv_send_wr* first = nullptr;
        if (Result<void> posted = post_other(qp, op, accepted, first); !posted) [[unlikely]] {
            post_failed(qp, op, accepted, first, std::move(posted.error()));
            return;
        }
        (op.kind == Op::Kind::recv ? qp.recv_credits : qp.send_credits) -= op.credits;
        mark_posted(qp, op);
        return;
    }
    // a send, every operation's but receives and batches: on a path of its own
    Completions::Posting& posting = qp.service->posting();
    // held behind held ones, so that a QP's sends keep their order
    if (posting == Completions::Posting::held || !qp.send_held.empty()) {
        // started by a handler of the running poll: posted with the others they
        // start, one doorbell, when they are done (ring)
        qp.service->hold(qp);
        qp.send_credits -= op.credits;
        op.state = Op::State::held;
        qp.send_held.push_back(op);
        return;
    }
    if (posting == Completions::Posting::first_at_once)
        posting = Completions::Posting::held;
    std::size_t accepted = 0;
    ibv_send_wr& wr = prepare(op);
    if (Result<void> posted = rdmaxx::detail::submit(qp.qp, wr, 1, accepted, op.where); !posted) [[unlikely]] {
        post_failed(qp, op, accepted, &wr, std::move(posted.error()));
        return;
    }
    qp.send_credits -= op.credits;
    mark_posted(qp, op);
}

// Posts the waiting operations that fit, in order; fails them all once the QP is dead.
void pump(QpCore& qp, OpQueue& waiting, const std::uint32_t& credits) {
    while (!waiting.empty()) {
        Op& op = *waiting.front();
        if (!qp.dead && op.credits > credits)
            return;
        waiting.remove(op);
        if (qp.dead)
            fail(op, *qp.dead);
        else
            post(op);
    }
}

} // namespace

void ring(QpCore& qp) {
    OpQueue& held = qp.send_held;
    if (held.empty())
        return;
    if (qp.dead) {
        while (!held.empty())
            drop_held(qp, *held.front(), *qp.dead);
        return;
    }
    std::size_t count = 0;
    ibv_send_wr* last = nullptr;
    for (Op* op = held.front(); op != nullptr; op = op->next, ++count) {
        ibv_send_wr& wr = prepare(*op);
        if (last != nullptr)
            last->next = &wr;
        last = &wr;
    }
    Op& first = *held.front();
    std::size_t accepted = 0;
    const Result<void> posted = rdmaxx::detail::submit(qp.qp, first.wr.send.wr, count, accepted, first.where);
    qp.service->rang(posted ? count : accepted);
    if (!posted && accepted == count) [[unlikely]] { // the provider did not say which it refused
        while (!held.empty()) {
            Op& op = *held.front();
            held.remove(op);
            complete_by_flush(qp, op, &op.wr.send.wr, posted.error());
        }
        // halted, not killed: post_other goes on with `qp` (kill() may destroy it); the
        // markers' flushes fail the waiting operations as they retire
        return;
    }
    for (std::size_t k = 0; !held.empty(); ++k) {
        Op& op = *held.front();
        if (posted || k < accepted) {
            held.remove(op);
            mark_posted(qp, op);
        } else {
            drop_held(qp, op, posted.error()); // the refused WR's Error, for it and those after it
        }
    }
}

void start(Op& op) {
    QpCore& qp = *op.qp;
    if (qp.dead) [[unlikely]] {
        fail(op, *qp.dead);
        return;
    }
    if (!qp.qp.supports_atomics() && is_atomic(op)) [[unlikely]] {
        fail(op, Error::unsupported(op.call, "atomics on a device without atomic support"));
        return;
    }
    const bool recv = op.kind == Op::Kind::recv;
    OpQueue& waiting = recv ? qp.recv_waiting : qp.send_waiting;
    if (waiting.empty() && op.credits <= (recv ? qp.recv_credits : qp.send_credits)) [[likely]] {
        post(op);
        return;
    }
    op.state = Op::State::waiting;
    waiting.push_back(op);
}

void retire(Op& op, const WorkCompletion& wc) {
    QpCore& qp = *op.qp;
    op.qp = nullptr; // a second completion naming it (a failed batch's flushes) is stale
    const bool recv = op.kind == Op::Kind::recv;
    std::uint32_t& credits = recv ? qp.recv_credits : qp.send_credits;
    credits += op.credits;
    --qp.posted;
    if (!wc.ok() && !qp.dead) [[unlikely]]
        qp.dead = wc.error();
    // the common case, nothing waiting for credits, without a call
    if (OpQueue& waiting = recv ? qp.recv_waiting : qp.send_waiting; !waiting.empty() || qp.dead)
        pump(qp, waiting, credits);
    if (qp.dead) [[unlikely]] // the other side's waiters fail too
        pump(qp, recv ? qp.send_waiting : qp.recv_waiting, recv ? qp.send_credits : qp.recv_credits);
}

Error failure(const Op& op, const WorkCompletion& wc) {
    // the event that killed the QP says why, not the flush it caused
    if (op.qp->dead_by_event || op.completes_by_flush)
        return *op.qp->dead;
    if (op.cancelled)
        return Error::cancelled(op.call, "flushed after its cancellation: the QP is in the error state");
    return wc.error();
}

void halt(QpCore& qp, Error why) {
    if (!qp.dead)
        qp.dead = std::move(why);
    if (qp.qp.state() != rdmaxx::QpState::error && qp.qp.state() != rdmaxx::QpState::reset)
        if (auto moved = qp.qp.to_error(); !moved)
            logger()->error("rdmaxx: moving QP {:#x} to the error state: {}", qp.qp.qpn(), moved.error());
}

void kill(QpCore& qp, Error why) {
    halt(qp, std::move(why));
    // every operation waiting or held fails: taken off the QP first, failed once it is
    // touched no more. In the io_context's shutdown a failed operation's handler is
    // destroyed at once, and one that owned the QueuePair destroys it, and `qp`, as it goes.
    OpQueue failing;
    for (OpQueue* queue : {&qp.send_waiting, &qp.recv_waiting})
        while (!queue->empty()) {
            Op& op = *queue->front();
            queue->remove(op);
            failing.push_back(op);
        }
    while (!qp.send_held.empty()) {
        Op& op = *qp.send_held.front();
        qp.send_held.remove(op);
        qp.send_credits += op.credits;
        failing.push_back(op);
    }
    Completions& service = *qp.service;
    const Error reason = *qp.dead;
    while (!failing.empty()) {
        Op& op = *failing.front();
        failing.remove(op);
        fail(service, op, reason);
    }
}

void kill_by_event(QpCore& qp, const Error& why) {
    if (!qp.dead) {
        qp.dead = why;
        qp.dead_by_event = true;
    }
    kill(qp, why);
}

void cancel(Completions& service, std::uint32_t index, std::uint32_t generation, asio::cancellation_type_t type) {
    Op* op = service.slab().at(index, generation);
    if (op == nullptr || op->qp == nullptr)
        return;
    QpCore& qp = *op->qp;
    if (op->state == Op::State::waiting) {
        (op->kind == Op::Kind::recv ? qp.recv_waiting : qp.send_waiting).remove(*op);
        fail(*op, Error::cancelled(op->call, "before it was posted"));
        return;
    }
    if (op->state == Op::State::held) {
        drop_held(qp, *op, Error::cancelled(op->call, "before it was posted"));
        return;
    }
    // posted: only the error state gets it back from the NIC, which a terminal
    // cancellation allows (partial and total ones promise the QP survives)
    if ((type & asio::cancellation_type::terminal) == asio::cancellation_type::none)
        return;
    op->cancelled = true;
    kill(qp, Error::cancelled(op->call, "an operation on this QP was cancelled: the QP is in the error state"));
}

void Claim::give_back(Op& op) noexcept { op.qp->service->slab().release(op); }

} // namespace detail

namespace {

std::uint32_t entries(const rdmaxx::QueuePair& qp, bool send) {
    return send ? qp.caps().max_send_wr : qp.caps().max_recv_wr;
}

} // namespace

QueuePair QueuePair::attach(rdmaxx::QueuePair qp, CompletionQueue& send_cq, CompletionQueue& recv_cq,
                            std::source_location where) {
    detail::CqCore& scq = send_cq.state(where);
    detail::CqCore& rcq = recv_cq.state(where);
    ibv_qp* raw = qp.get(where);
    require(raw->send_cq == scq.cq.get() && raw->recv_cq == rcq.cq.get(), where,
            "QP {:#x} was not created on these CQs (QpOptions::send_cq / recv_cq = &cq.get())", qp.qpn());
    require(scq.service == rcq.service, where, "a QP's send and receive CQs of two io_contexts");
    require(scq.sink.take == nullptr && rcq.sink.take == nullptr, where,
            "an async::QueuePair attached to a CQ with a CompletionSink (its completions go to the sink)");
    require(!qp.has_srq(), where, "QP {:#x} receives from an SRQ: not supported by async::QueuePair", qp.qpn());
    const std::size_t send = entries(qp, true), recv = entries(qp, false);
    const auto room = [&](const detail::CqCore& cq, std::size_t more) {
        require(cq.reserved + more <= cq.cq.depth(), where,
                "a CQ of depth {} with {} entries of its QPs could overflow with {} more: QP {:#x}'s queues need "
                "room for every completion they can have due",
                cq.cq.depth(), cq.reserved, more, qp.qpn());
    };
    if (&scq == &rcq) {
        room(scq, send + recv);
    } else {
        room(scq, send);
        room(rcq, recv);
    }
    scq.reserved += send;
    rcq.reserved += recv;
    ++scq.qps;
    ++rcq.qps;
    auto* state = new detail::QpCore{.service = scq.service,
                                      .qp = std::move(qp),
                                      .send_cq = &scq,
                                      .recv_cq = &rcq,
                                      .send_credits = static_cast<std::uint32_t>(send),
                                      .recv_credits = static_cast<std::uint32_t>(recv),
                                      .send_waiting = {},
                                      .recv_waiting = {},
                                      .send_held = {},
                                      .dead = {},
                                      .created = where};
    scq.service->add(*state);
    return QueuePair(state);
}

QueuePair& QueuePair::operator=(QueuePair&& other) noexcept {
    if (this != &other) {
        QueuePair old(std::move(*this));
        state_ = std::exchange(other.state_, nullptr);
    }
    return *this;
}

QueuePair::~QueuePair() {
    if (!state_)
        return;
    detail::QpCore& qp = *state_;
    Completions& service = *qp.service;
    const std::size_t send = entries(qp.qp, true), recv = entries(qp.qp, false);
    // also while the io_context shuts down (a coroutine frame that owned this object
    // is being destroyed): its completions are then taken and their handlers dropped
    if (qp.posted != 0 || !qp.send_waiting.empty() || !qp.recv_waiting.empty() || !qp.send_held.empty())
        detail::kill(qp, Error::cancelled("async::QueuePair", "the QueuePair was destroyed"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (qp.posted != 0 && std::chrono::steady_clock::now() < deadline) {
        service.drain(*qp.send_cq, true, Completions::unlimited);
        if (qp.recv_cq != qp.send_cq)
            service.drain(*qp.recv_cq, true, Completions::unlimited);
        if (qp.posted != 0)
            std::this_thread::yield();
    }
    // detached from its CQs either way: their handles may go (a leaked QP keeps the
    // verbs CQs it holds, not the async ones)
    qp.send_cq->reserved -= send;
    qp.recv_cq->reserved -= recv;
    --qp.send_cq->qps;
    --qp.recv_cq->qps;
    service.remove(qp);
    if (qp.posted != 0) {
        // the NIC may still write for it: leak the QP and its operations (their
        // handlers and what they keep alive), detached from everything else
        logger()->critical("rdmaxx: QP {:#x} gave no flush completions within 10 s: leaked, not destroyed under a DMA",
                           qp.qp.qpn());
        return;
    }
    delete state_;
}

rdmaxx::QueuePair& QueuePair::get(std::source_location where) const { return state(where).qp; }
const std::optional<Error>& QueuePair::dead(std::source_location where) const { return state(where).dead; }

} // namespace rdmaxx::async
