#include <rdmaxx/async/completions.hpp>
#include <rdmaxx/async/detail/qp_core.hpp>
#include <rdmaxx/wrap/log.hpp>

#include <algorithm>
#include <array>
#include <memory>
#include <thread>

#include <asio/post.hpp>

namespace rdmaxx::async {

namespace {

using Clock = std::chrono::steady_clock;

// How long quiescing waits for the flush completions of a dead QP: a device that
// gives none in this time is broken, and its QP's memory is left to it (leaked)
// rather than freed under a DMA.
constexpr auto flush_bound = std::chrono::seconds(10);

} // namespace

// A pending driver handler pins what it drives (a CQ, a device watch): one whose
// handle is gone lives until the handlers that name it have run or been destroyed.
template <class Core>
struct Pin {
    Core* core;
    explicit Pin(Core& c) : core(&c) { ++c.pins; }
    Pin(Pin&& other) noexcept : core(std::exchange(other.core, nullptr)) {}
    Pin& operator=(Pin&&) = delete;
    ~Pin() {
        if (core)
            core->service->unpin(*core);
    }
};

// A driver handler's scope: the completions deferred (post_completion) while it runs
// run when the outermost one ends, after it has touched its CQ for the last time (a
// completion may destroy the CQ's handle; the handler's pin keeps its state). One
// that ends by an exception posts them instead.
class Completions::Deferral {
public:
    explicit Deferral(Completions& service) noexcept : service_(service) { ++service_.deferring_; }
    Deferral(const Deferral&) = delete;
    Deferral& operator=(const Deferral&) = delete;
    ~Deferral() {
        if (!ended_ && --service_.deferring_ == 0)
            service_.post_deferred();
    }
    void end() {
        ended_ = true;
        if (--service_.deferring_ == 0)
            service_.run_deferred();
    }

private:
    Completions& service_;
    bool ended_ = false;
};

struct Completions::RunDeferred {
    Completions* service;
    void operator()() {
        if (service->deferring_ == 0) // else the driver handler running ends with them
            service->run_deferred();
    }
};

// Those queued as it begins: one they queue (a call made again that fails at once, from
// a coroutine in a loop) waits for the next run, so that such a loop still lets a busy
// turn end and the io_context's other handlers run.
void Completions::run_deferred() {
    for (detail::DeferredOp* op = deferred_.take_all(); op != nullptr;) {
        detail::DeferredOp* const next = op->next; // `end` frees `op`
        ++deferred_completions_;
        try {
            op->end(op, true);
        } catch (...) { // the application's, from a coroutine it resumed: the rest still run
            deferred_.put_back(next);
            post_deferred();
            throw;
        }
        op = next;
    }
}

void Completions::post_deferred() {
    if (!deferred_.empty())
        post_recycled(RunDeferred{this});
}

struct Completions::Turn : Pin<detail::CqCore> {
    explicit Turn(detail::CqCore& c) : Pin(c) {}
    // busy and hybrid: a turn of polling; event: the first arm-poll-wait
    void operator()() {
        detail::CqCore& c = *core;
        std::erase(c.service->spinning_, &c); // its own turn: the others' polls stop taking it
        c.service->drive(c, [&c] {
            if (c.drive.mode == CompletionMode::busy ||
                (c.drive.mode == CompletionMode::hybrid && Clock::now() - c.last_completion <= c.drive.spin))
                c.service->spin(c);
            else
                c.service->sleep(c);
        });
    }
};

struct Completions::Wake {
    Turn pin;
    void operator()(const std::error_code& ec) {
        detail::CqCore& c = *pin.core;
        if (ec == asio::error::operation_aborted || c.service->shut_down_) // the handle is gone
            return;
        if (ec)
            return c.service->poll_instead(c, Error::from_errno("epoll_wait", ec.value(), "a completion channel"));
        c.events_failing = false;
        c.service->drive(c, [&c] {
            if (auto taken = c.cq.take_events(); !taken)
                logger()->error("rdmaxx: completion channel: {}", taken.error());
            if (c.drive.mode == CompletionMode::hybrid) {
                c.last_completion = Clock::now();
                c.service->spin(c);
            } else {
                c.service->sleep(c);
            }
        });
    }
};

struct Completions::DeviceTurn {
    Pin<detail::DeviceWatch> pin;
    void operator()() { pin.core->service->listen(*pin.core); }
};

struct Completions::DeviceWake {
    Pin<detail::DeviceWatch> pin;
    void operator()(const std::error_code& ec) {
        detail::DeviceWatch& d = *pin.core;
        if (d.service->shut_down_)
            return;
        if (ec && ec != asio::error::operation_aborted) {
            logger()->error("rdmaxx: waiting for the device's async events: {}", ec.message());
            d.broken = true;
        }
        d.service->listen(d); // also when cancelled: work may have come back since
    }
};

// Stops the wait once the context has no operation in flight on a driven CQ (checked
// after the handlers that may start the next operation have run).
struct Completions::IdleCheck {
    Pin<detail::DeviceWatch> pin;
    void operator()() {
        detail::DeviceWatch& d = *pin.core;
        d.idle_check = false;
        if (d.armed && !d.service->wanted(d)) {
            std::error_code ignored;
            d.fd.cancel(ignored); // the wait ends (aborted) and sees nothing wanted
        }
    }
};

Completions::Completions(asio::io_context& io) : asio::io_context::service(io) {}

Completions::~Completions() {
    // every handle must be gone by now (their io_context is being destroyed)
    for (detail::QpCore* qp : qps_)
        rdmaxx::detail::programming_error("an async::QueuePair outlives its io_context", qp->created);
    for (detail::CqCore* cq : cqs_)
        if (cq->pins != 0)
            rdmaxx::detail::programming_error("an async::CompletionQueue outlives its io_context", cq->created);
}

// Posted, never run inline: start() runs inside an operation's initiating function,
// whose handler must not be called before it returns (and a poll here could).
void Completions::start(detail::CqCore& cq) {
    cq.driving = true;
    cq.last_completion = Clock::now();
    next_turn(cq);
}

void Completions::next_turn(detail::CqCore& cq) {
    post_recycled(Turn(cq));
    if (cq.drive.mode == CompletionMode::busy || cq.drive.mode == CompletionMode::hybrid)
        spinning_.push_back(&cq);
}

// by index: a handler may start a CQ (listed at the end); none leaves the list, as only
// its own Turn or its erasure (unpinned: no Turn pending) takes it out
std::size_t Completions::poll_spinning(const detail::CqCore& turning) {
    std::size_t taken = 0;
    for (std::size_t i = 0; i < spinning_.size(); ++i) {
        detail::CqCore& other = *spinning_[i];
        if (&other == &turning || !other.wanted()) // as in spin()
            continue;
        const std::size_t found = drain(other, false, poll_batch);
        if (found != 0 && other.drive.mode == CompletionMode::hybrid)
            other.last_completion = Clock::now();
        taken += found;
    }
    return taken;
}

// A driver handler's body (`take`: spin or sleep, which post the next Turn or Wake) in
// its Deferral. An application's exception out of a handler it ran leaves run(), and
// the CQ is driven again by a turn posted for the next run() (it would never be
// otherwise: nothing else posts one while `driving`).
template <class Take>
void Completions::drive(detail::CqCore& cq, Take take) {
    Deferral deferral(*this);
    try {
        take();
    } catch (...) {
        if (!shut_down_)
            next_turn(cq);
        throw;
    }
    deferral.end();
}

// One turn of busy polling, then yield (or, hybrid, sleep once idle for `spin`). The
// turn ends after busy_polls polls or busy_completions completions, whichever comes
// first: many polls keep an RPC client that waits on an almost empty CQ in its turn (no
// epoll_wait per call), and the completion budget keeps a CQ that never runs dry from
// holding the io_context's sockets and timers for busy_polls full polls.
void Completions::spin(detail::CqCore& cq) {
    std::size_t taken = 0;
    for (unsigned polls = 0; polls < cq.drive.busy_polls && taken < cq.drive.busy_completions; ++polls) {
        // before the poll: what a sink CQ whose handle is gone still holds names no
        // operation of this service (taken for one, a wr_id could end an unrelated op)
        if (!cq.wanted()) {
            cq.driving = false;
            return;
        }
        const std::size_t found = drain(cq, false, poll_batch);
        taken += found;
        if (found != 0 && cq.drive.mode == CompletionMode::hybrid)
            cq.last_completion = Clock::now();
        if (!spinning_.empty()) {
            // the others' polls count against the turn's: with N busy CQs a turn stays
            // busy_polls polls long, so sockets and timers wait no longer than with one
            polls += static_cast<unsigned>(spinning_.size());
            taken += poll_spinning(cq);
        }
        // a completion that the poll deferred (an RPC call's resumption) runs now, not
        // after the turn's remaining polls (half a turn of polls was a seventh of an
        // RPC's round trip on rxe), and the turn goes on: ending it would hand the
        // io_context to its reactor, an epoll_wait per call (a tenth of a round trip).
        if (!deferred_.empty()) {
            run_deferred();
            if (shut_down_) {
                cq.driving = false;
                return;
            }
        }
    }
    if (cq.drive.mode == CompletionMode::hybrid && Clock::now() - cq.last_completion > cq.drive.spin) {
        sleep(cq);
        return;
    }
    next_turn(cq);
}

// Arms the CQ and polls it once more (a completion that landed before the arm raises
// no event): what that poll finds is handled, and the CQ is polled again in a later
// turn, so that a CQ that never runs dry still lets the io_context's other handlers
// run; once a poll finds nothing, waits on the channel.
void Completions::sleep(detail::CqCore& cq) {
    if (!cq.wanted() || shut_down_) {
        cq.driving = false;
        return;
    }
    const Result<void> armed = cq.cq.arm();
    const std::size_t found = drain(cq, false, turn_budget);
    if (found != 0 && cq.drive.mode == CompletionMode::hybrid) // busy again
        cq.last_completion = Clock::now();
    if (!armed)
        return poll_instead(cq, armed.error());
    if (found != 0)
        return next_turn(cq);
    cq.channel->async_wait(asio::posix::stream_descriptor::wait_read,
                           detail::with_memory(handler_memory_, Wake{Turn(cq)}));
}

// A CQ whose event cannot come (its arm or its channel's wait failed) is polled in
// turns, as a busy one is, until an arm and a wait work again: its completions are
// found late rather than never (waiting on the channel, its operations hung for ever).
void Completions::poll_instead(detail::CqCore& cq, const Error& why) {
    if (!std::exchange(cq.events_failing, true))
        logger()->warn("rdmaxx: {}: the completion queue is polled in turns instead", why);
    next_turn(cq);
}

std::size_t Completions::drain(detail::CqCore& cq, bool defer, std::size_t limit) {
    const std::size_t completed = take(cq, defer, limit);
    if (cq.outstanding == 0 && cq.device != nullptr)
        settle(*cq.device);
    return completed;
}

namespace {

using BatchFailures = std::array<std::optional<Error>, Completions::poll_batch>;

[[gnu::cold, gnu::noinline]] void judge_failure(std::unique_ptr<BatchFailures>& failed, std::size_t k,
                                                const detail::Op& op, const WorkCompletion& wc) {
    if (!failed)
        failed = std::make_unique<BatchFailures>();
    (*failed)[k] = detail::failure(op, wc);
}

} // namespace

[[gnu::always_inline]] inline std::size_t Completions::take_batches(detail::CqCore& cq, bool defer, std::size_t limit) {
    constexpr int batch = poll_batch;
    std::array<WorkCompletion, batch> wcs;
    std::size_t completed = 0;
    for (;;) {
        const int n = ibv_poll_cq(cq.cq.get(), batch, reinterpret_cast<ibv_wc*>(wcs.data()));
        if (n < 0) [[unlikely]] {
            // a CQ that cannot be polled completes nothing more: its QPs are dead, and
            // their operations fail now (the device stopped reporting; nothing waits)
            const Error why = rdmaxx::detail::poll_error(n);
            logger()->error("rdmaxx: {}", why);
            for (detail::QpCore* qp : qps_)
                if (qp->send_cq == &cq || qp->recv_cq == &cq)
                    detail::kill(*qp, why);
            return completed;
        }
        if (cq.sink.take != nullptr) {
            if (n > 0)
                cq.sink.take(cq.sink.context, std::span<const WorkCompletion>(wcs.data(), static_cast<std::size_t>(n)));
            completed += static_cast<std::size_t>(n);
            if (n < batch || completed >= limit)
                return completed;
            continue;
        }
        // take every completion of the batch before running any handler: a handler
        // may destroy a QP, whose quiescing must not wait for a completion taken here
        std::array<detail::Op*, batch> ops;
        std::array<const WorkCompletion*, batch> taken; // ops[k]'s completion
        // a failure's Error, judged before the handlers run (one may destroy the QP);
        // their storage made only for a batch with a failure, on the heap: 16 empty
        // optionals cost a third of this function's instructions per completion, and an
        // empty std::optional of them is zeroed whole by g++ 12 (904 bytes, rep stos:
        // 113 instructions per take on valgrind's count). A failure allocates already
        // (its Error's message).
        std::unique_ptr<BatchFailures> failed;
        int found = 0;
        for (int i = 0; i < n; ++i) {
            detail::Op* op = slab_.find(wcs[static_cast<std::size_t>(i)].wr_id());
            if (op == nullptr || op->qp == nullptr) {
                ++stale_;
                continue;
            }
            --cq.outstanding;
            const auto k = static_cast<std::size_t>(found);
            ops[k] = op;
            taken[k] = &wcs[static_cast<std::size_t>(i)];
            if (!taken[k]->ok()) [[unlikely]]
                judge_failure(failed, k, *op, *taken[k]);
            detail::retire(*op, *taken[k]);
            ++found;
        }
        auto complete = [&](std::size_t k, bool posted) {
            detail::Op& op = *ops[k];
            if (shut_down_)
                op.table->destroy(op), slab_.release(op);
            else if (failed && (*failed)[k]) [[unlikely]]
                op.table->complete(op, std::unexpected(std::move(*(*failed)[k])), posted, slab_);
            else
                op.table->complete(op, *taken[k], posted, slab_);
        };
        int i = 0;
        try {
            for (; i < found; ++i) {
                posting_ = i + 1 < found ? Posting::held : Posting::first_at_once;
                complete(static_cast<std::size_t>(i), defer);
            }
        } catch (...) {
            // an application's handler threw: the exception leaves run() (Asio's rule),
            // and the batch's later completions, out of the CQ already, are posted (their
            // handlers would never run otherwise)
            while (++i < found)
                complete(static_cast<std::size_t>(i), true);
            throw;
        }
        completed += static_cast<std::size_t>(found);
        if (n < batch || completed >= limit)
            return completed;
    }
}

// The sends that the handlers start are held (posting()) and rung together once they
// are done: a CQ running full (many coroutines, each awaiting its operation and
// starting the next) posts them with one doorbell per poll instead of one each. A take
// inside a handler (a QueuePair's destructor draining, a nested manual poll) rings
// too, so that nothing held is waited for.
std::size_t Completions::take(detail::CqCore& cq, bool defer, std::size_t limit) {
    // restored however take_batches() ends (a handler that throws out of run() included)
    struct Restore {
        Posting& posting;
        const Posting outer;
        ~Restore() { posting = outer; }
    } restore{posting_, posting_};
    std::size_t completed = 0;
    try {
        completed = take_batches(cq, defer, limit);
    } catch (...) { // a handler's: what the handlers before it started still goes
        ring_held();
        throw;
    }
    if (!holding_.empty()) [[unlikely]] // the one-at-a-time loop holds nothing: no call
        ring_held();
    return completed;
}

void Completions::ring_held() {
    // by index: ringing fails sends of a dead QP, deferred, and adds no QP here
    for (std::size_t i = 0; i < holding_.size(); ++i)
        detail::ring(*holding_[i]);
    holding_.clear();
}

void Completions::hold(detail::QpCore& qp) {
    // its first held send: listed (again, if a batch post rang it since: ringing an
    // empty queue does nothing)
    if (qp.send_held.empty())
        holding_.push_back(&qp);
}

// inlined into its one caller, take()
std::size_t Completions::poll() {
    std::size_t completed = 0;
    // by index: a handler may add CQs
    for (std::size_t i = 0; i < cqs_.size(); ++i)
        completed += drain(*cqs_[i], false, turn_budget);
    return completed;
}

void Completions::remove(detail::QpCore& qp) noexcept {
    std::erase(qps_, &qp);
    std::erase(holding_, &qp);
}

// --- the device's async events ------------------------------------------------------

Result<detail::DeviceWatch*> Completions::device(const Context& context, std::source_location where) {
    const int fd = context.get(where)->async_fd;
    for (detail::DeviceWatch* d : devices_)
        if (d->fd.native_handle() == fd) { // the watch holds its context open: the fd is not reused
            ++d->pins;
            return d;
        }
    auto events = AsyncEvents::open(context, where); // the fd made non-blocking
    if (!events)
        return std::unexpected(std::move(events.error()));
    auto* d = new detail::DeviceWatch{
        .service = this, .events = std::move(*events), .fd = asio::posix::stream_descriptor(get_io_context())};
    std::error_code ec;
    d->fd.assign(fd, ec);
    if (ec) {
        d->fd.release();
        delete d;
        return std::unexpected(Error::from_errno("epoll_ctl", ec.value(), "watching the device's async event fd"));
    }
    d->pins = 1;
    devices_.push_back(d);
    return d;
}

void Completions::unpin(detail::DeviceWatch& device) noexcept {
    if (--device.pins != 0)
        return;
    std::erase(devices_, &device);
    device.fd.release(); // the fd is the context's: ibv_close_device closes it
    delete &device;
}

// Posted, never run inline: called from an operation's initiating function, where
// reading events could end operations (and their handlers must not run before it returns).
void Completions::watch(detail::DeviceWatch& device) {
    if (shut_down_ || device.broken)
        return;
    device.armed = true;
    post_recycled(DeviceTurn{Pin<detail::DeviceWatch>(device)});
}

// Reads what is pending, then waits for more while wanted. The reactor sees the fd
// edge-triggered, and an event that came while nothing waited made its edge then: the
// read comes first, so none is left behind a wait that would never end.
void Completions::listen(detail::DeviceWatch& device) {
    if (shut_down_ || device.broken) {
        device.armed = false;
        return;
    }
    read_events(device);
    if (device.broken || !wanted(device)) {
        device.armed = false;
        return;
    }
    device.fd.async_wait(asio::posix::stream_descriptor::wait_read,
                       detail::with_memory(handler_memory_, DeviceWake{Pin<detail::DeviceWatch>(device)}));
}

bool Completions::wanted(const detail::DeviceWatch& device) const noexcept {
    return std::any_of(cqs_.begin(), cqs_.end(), [&](const detail::CqCore* cq) {
        return cq->device == &device && cq->outstanding != 0 && cq->drive.mode != CompletionMode::manual;
    });
}

// A CQ of the context ran out of work: stop waiting unless its handlers (or others)
// start more first. Posted, so that an operation started by a completion's handler
// keeps the wait rather than cancel and renew it.
void Completions::settle(detail::DeviceWatch& device) {
    if (!device.armed || device.idle_check || shut_down_)
        return;
    device.idle_check = true;
    post_recycled(IdleCheck{Pin<detail::DeviceWatch>(device)});
}

namespace {

// Whether `event` (one that kills work) concerns `qp`, a QP of the event's context.
bool concerns(const AsyncEvent& event, const detail::QpCore& qp) {
    switch (event.type) {
    case AsyncEventType::port_error: return qp.qp.port() == event.port;
    case AsyncEventType::cq_error: return qp.send_cq->cq.get() == event.cq || qp.recv_cq->cq.get() == event.cq;
    case AsyncEventType::device_fatal: return true;
    default: return qp.qp.qpn() == event.qp_num; // a QP's own event
    }
}

} // namespace

std::size_t Completions::read_events(detail::DeviceWatch& device) {
    std::size_t read = 0;
    for (;;) {
        auto next = device.events.next();
        if (!next) {
            // the fd stays readable: waiting again would spin, so the watch stops
            logger()->error("rdmaxx: the device's async events are no longer watched: {}", next.error());
            device.broken = true;
            return read;
        }
        if (!*next)
            return read;
        ++read;
        const AsyncEvent& event = **next;
        if (!event.kills(event.qp_num))
            continue;
        const Error why = event_error(event);
        // by index: ending an operation runs no handler here (failures are deferred)
        for (std::size_t i = 0; i < qps_.size(); ++i) {
            detail::QpCore& qp = *qps_[i];
            if (qp.send_cq->device == &device && qp.qp.state() != QpState::reset && concerns(event, qp))
                detail::kill_by_event(qp, why);
        }
    }
}

std::size_t Completions::take_device_events() {
    std::size_t read = 0;
    for (std::size_t i = 0; i < devices_.size(); ++i)
        if (!devices_[i]->broken)
            read += read_events(*devices_[i]);
    return read;
}

void Completions::unpin(detail::CqCore& cq) noexcept {
    if (--cq.pins == 0)
        erase(cq);
}

void Completions::erase(detail::CqCore& cq) noexcept {
    std::erase(cqs_, &cq);
    std::erase(spinning_, &cq); // its Turn destroyed unrun (the io_context's shutdown)
    if (cq.channel)
        cq.channel->release(); // the fd is the channel's: ibv_destroy_comp_channel closes it
    if (cq.device != nullptr) // a wait pending on it ends by the idle check its last completion posted
        unpin(*cq.device);
    delete &cq;
}

// The io_context is going away: no handler may run any more, and none may be
// destroyed (with the memory it owns, such as a coroutine frame a READ lands in)
// while the NIC can still write for it. Every QP with operations in flight is moved
// to the error state and its flush completions taken, then the handlers destroyed.
void Completions::shutdown() {
    shut_down_ = true;
    // Destroying a handler can destroy a coroutine frame that owns a QP or a CQ: the
    // CQs are pinned meanwhile, and a QP is looked up again before it is touched.
    const std::vector<detail::CqCore*> cqs = cqs_;
    for (detail::CqCore* cq : cqs)
        ++cq->pins;
    const std::vector<detail::QpCore*> qps = qps_;
    for (detail::QpCore* qp : qps)
        if (std::find(qps_.begin(), qps_.end(), qp) != qps_.end() &&
            (qp->posted != 0 || !qp->send_waiting.empty() || !qp->recv_waiting.empty() || !qp->send_held.empty()))
            detail::kill(*qp, Error::cancelled("io_context", "the io_context was destroyed"));
    const auto deadline = Clock::now() + flush_bound;
    auto busy = [&] {
        return std::any_of(qps_.begin(), qps_.end(), [](const detail::QpCore* qp) { return qp->posted != 0; });
    };
    while (busy() && Clock::now() < deadline) {
        for (detail::CqCore* cq : cqs)
            drain(*cq, true, unlimited);
        std::this_thread::yield();
    }
    if (busy())
        logger()->critical("rdmaxx: a device gave no flush completions within {} s: its QPs and their memory are "
                           "leaked, not freed under a DMA",
                           std::chrono::duration_cast<std::chrono::seconds>(flush_bound).count());
    for (detail::CqCore* cq : cqs)
        if (cq->channel)
            cq->channel->release(), cq->channel.reset();
    for (detail::DeviceWatch* device : devices_)
        device->fd.release();
    // destroyed uncalled, as Asio destroys the handlers it holds (one may own a CQ: pinned)
    while (!deferred_.empty()) {
        detail::DeferredOp* op = deferred_.pop();
        op->end(op, false);
    }
    for (detail::CqCore* cq : cqs)
        unpin(*cq);
}

Result<CompletionQueue> CompletionQueue::create(asio::io_context& io, const Context& context, CqOptions cq,
                                                DriveOptions drive, std::source_location where) {
    return make(io, context, cq, drive, {}, where);
}

Result<CompletionQueue> CompletionQueue::create(asio::io_context& io, const Context& context, CompletionSink sink,
                                                CqOptions cq, DriveOptions drive, std::source_location where) {
    require(sink.take != nullptr, where, "a CompletionSink without a take function");
    return make(io, context, cq, drive, sink, where);
}

Result<CompletionQueue> CompletionQueue::make(asio::io_context& io, const Context& context, CqOptions cq,
                                              DriveOptions drive, CompletionSink sink, std::source_location where) {
    require((drive.busy_polls > 0 && drive.busy_completions > 0) || drive.mode == CompletionMode::event ||
                drive.mode == CompletionMode::manual,
            where, "DriveOptions::{} 0 for a {} CQ", drive.busy_polls == 0 ? "busy_polls" : "busy_completions",
            drive.mode == CompletionMode::busy ? "busy" : "hybrid");
    const bool watched = drive.mode == CompletionMode::event || drive.mode == CompletionMode::hybrid;
    cq.channel = cq.channel || watched;
    auto created = rdmaxx::CompletionQueue::create(context, cq, where);
    if (!created)
        return std::unexpected(std::move(created.error()));
    Completions& service = Completions::of(io);
    detail::DeviceWatch* device = nullptr;
    if (sink.take == nullptr) { // a sink CQ has no async::QueuePair whose operations an event could end
        auto watched_device = service.device(context, where);
        if (!watched_device)
            return std::unexpected(std::move(watched_device.error()));
        device = *watched_device;
    }
    auto* state = new detail::CqCore{.service = &service, .cq = std::move(*created), .drive = drive, .channel = {},
                                     .created = where, .sink = sink, .device = device};
    state->pins = 1;
    if (watched) {
        std::error_code ec;
        state->channel.emplace(io);
        state->channel->assign(state->cq.channel_fd(), ec);
        if (ec) {
            state->channel->release();
            if (device != nullptr)
                service.unpin(*device);
            delete state;
            return std::unexpected(Error::from_errno("epoll_ctl", ec.value(), "watching a completion channel"));
        }
    }
    service.add(*state);
    if (sink.take != nullptr && drive.mode != CompletionMode::manual)
        service.start(*state);
    return CompletionQueue(state);
}

CompletionQueue& CompletionQueue::operator=(CompletionQueue&& other) noexcept {
    if (this != &other) {
        CompletionQueue old(std::move(*this));
        state_ = std::exchange(other.state_, nullptr);
    }
    return *this;
}

CompletionQueue::~CompletionQueue() {
    if (!state_)
        return;
    if (state_->qps != 0)
        rdmaxx::detail::programming_error("an async::CompletionQueue destroyed before the QPs attached to it",
                                          state_->created);
    // a pending channel wait ends (cancelled) and unpins; a pending busy turn sees
    // nothing wanted (no operation due, no sink) and stops
    state_->sink = {};
    if (state_->channel && !state_->service->shut_down()) {
        std::error_code ignored;
        state_->channel->cancel(ignored);
    }
    state_->service->unpin(*state_);
}

detail::CqCore& CompletionQueue::state(std::source_location where) const {
    require(state_ != nullptr, where, "use of a moved-from async::CompletionQueue");
    return *state_;
}

rdmaxx::CompletionQueue& CompletionQueue::get(std::source_location where) const { return state(where).cq; }
CompletionMode CompletionQueue::mode(std::source_location where) const { return state(where).drive.mode; }

std::size_t CompletionQueue::poll(std::source_location where) {
    detail::CqCore& cq = state(where);
    return cq.service->drain(cq, false, Completions::turn_budget);
}

} // namespace rdmaxx::async
