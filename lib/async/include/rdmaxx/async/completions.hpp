/// @file
/// Completions on an Asio io_context: one service per io_context drives the completion
/// queues registered with it, and resumes the operation each completion belongs to.
///
/// @code
/// asio::io_context io;
/// auto cq = rdmaxx::async::CompletionQueue::create(io, context, {.depth = 4096},
///                                                  {.mode = rdmaxx::async::CompletionMode::event});
/// @endcode
///
/// No background thread: completions are taken by handlers that run inside the
/// io_context's run(), beside the program's sockets and timers. The modes, per CQ:
///  * event: the CQ's completion channel is watched by the io_context's reactor; on
///    wake every pending event is taken, the CQ polled empty, armed, polled again (a
///    completion that lands between poll and arm is never stranded), and events
///    acknowledged in batches. Costs a system call per wake; no CPU while idle.
///  * busy: a handler polls up to DriveOptions::busy_polls times or until it has taken
///    DriveOptions::busy_completions (an RPC call its completions complete is resumed
///    at once, between two polls), then yields to the io_context's other handlers and
///    polls again. Lowest latency; a core while operations are in flight. The busy CQs
///    of one io_context share their turns: each poll of a turn polls the others too
///    (those with a turn pending, counted against the turn's busy_polls), so that a
///    completion on one waits for a poll, not for another CQ's whole turn (lib/rpc's UD
///    and RC CQs: ~300 us per hop on rxe).
///  * hybrid: busy for DriveOptions::spin after the last completion, then event.
///  * manual: nothing is driven; the application calls poll() from its own loop (and
///    the io_context's run() does not wait for these operations: nothing in it is). A
///    channel asked for (CqOptions::channel) is created and left to the application:
///    its loop may block on it (get().arm(), get().wait_event() or channel_fd()).
///
/// A handler of the application's that throws (rdmaxx never does) ends run() with its
/// exception, as Asio's handlers do; nothing is lost: the completions its poll took
/// besides run as posted handlers, the sends its batch's handlers started are rung, and
/// the CQ is driven again at the next run() (manual mode: poll() throws, the same holds).
///
/// A CQ is driven only while operations are in flight on it, so run() returns once
/// every operation has completed. A CQ created with a CompletionSink is the exception:
/// its completions go to the sink (an engine that posts its own work requests, such as
/// lib/rpc's receive ring), and it is driven from its creation until its handle is
/// destroyed.
///
/// The device's async events (ibv_get_async_event(3)): the service watches the event fd
/// of each device context it has a CQ of (sink CQs aside), once per context however
/// many CQs and QPs it has, in the io_context's reactor, and reads every event (each
/// acknowledged at once). An event that leaves work unable to complete ends the
/// operations it concerns with its Error (rdmaxx::event_error: a port down is
/// ENETDOWN): a QP's fatal, request or access error that QP's; a port down (PORT_ERR)
/// those of the QPs on that port; a CQ error those of the QPs on that CQ; a fatal
/// device error all. The QP is moved to the error state and marked dead: an operation
/// waiting for queue entries fails at once, a posted one completes with the event's
/// Error when its (flush) completion is taken, never before (its memory stays the
/// NIC's until then), and later ones fail at once. Port events are not undone by a
/// PORT_ACTIVE: the QP stays dead. QPs still in RESET (never connected) are left alone.
/// Why watched per context and only while needed: the kernel queues each context's
/// events on its fd, and an fd can be in a reactor once; and a wait pending in the
/// reactor would keep run() from returning, so the fd is waited on only while a
/// driven (not manual) CQ of the context has operations in flight; events that come
/// meanwhile stay queued in the kernel and are read, in order, when the watch
/// resumes. Manual mode: the application takes them with take_device_events() from its
/// own loop (when the context's async_fd is readable). The kernel hands each event to
/// one reader: while this service watches a context, nothing else (AsyncEvents,
/// WaitOptions::events, another io_context's CQs on the same Context) may read that
/// context's events, or an event read there is lost to this one (an async::Connection
/// opens a context of its own, so it never competes).
///
/// @threadsafety An io_context with rdmaxx CQs is run by one thread (the objects here
/// keep counts without locks, and a handler of theirs never runs concurrently with
/// another). Distinct io_contexts on distinct threads are independent.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <source_location>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>

#include <rdmaxx/async/detail/deferred.hpp>
#include <rdmaxx/async/detail/handler_memory.hpp>
#include <rdmaxx/async/detail/op.hpp>
#include <rdmaxx/data/events.hpp>
#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/cq.hpp>

namespace rdmaxx::async {

/// How a CQ's completions are taken (the modes in full: completions.hpp).
///  - `event`: the completion channel in the io_context's reactor; no CPU while idle.
///    A CQ the device will not arm (or whose channel cannot be waited on) is polled in
///    turns, as a busy one, until it can be again (a warning is logged).
///  - `busy`: a handler polls, and yields to the io_context's others between turns.
///  - `hybrid`: busy for DriveOptions::spin after the last completion, then event.
///  - `manual`: nothing is driven; the application calls poll().
enum class CompletionMode : std::uint8_t { event, busy, hybrid, manual };

/// How a CompletionQueue is driven.
struct DriveOptions {
    CompletionMode mode = CompletionMode::event; ///< the mode (completions.hpp tells each)
    /// busy, hybrid: polls per turn (the other busy CQs' polls in it included) before
    /// the io_context's other handlers run. Each
    /// turn's end costs the reactor's epoll_wait (a system call): fewer polls give
    /// sockets and timers a shorter wait, more give a CQ's operations fewer syscalls
    /// (an empty poll is some nanoseconds on hardware, a few on rxe under emulation).
    /// Many polls suit a CQ that is mostly empty (an RPC client waiting for its
    /// response stays in its turn); busy_completions bounds a CQ that never runs dry.
    unsigned busy_polls = 1024;
    /// busy, hybrid: completions per turn (whole polls of 16): a turn ends after
    /// busy_polls polls or once it has taken this many, whichever comes first, so that
    /// sockets and timers wait at most this many completions' handlers for their turn.
    unsigned busy_completions = 1024;
    /// hybrid: how long to spin without a completion before sleeping on the channel
    std::chrono::microseconds spin{50};
};

/// Where a sink CQ's completions go: `take` is called from the driver (inside the
/// io_context's run, or poll()) with each batch polled, successes and failures alike,
/// in the CQ's order. It may post work requests; it must not destroy the CQ (a
/// programming error the library cannot see).
struct CompletionSink {
    void* context = nullptr; ///< given to `take` as it is
    /// Called with each batch polled (required).
    void (*take)(void* context, std::span<const WorkCompletion> completions) = nullptr;
};

class Completions;

namespace detail {

// One device context's async events, watched for the QPs on this service's CQs of it.
// Owned by the service; its CQs and every pending handler of its watch pin it.
struct DeviceWatch {
    Completions* service;
    AsyncEvents events;                // reads and acknowledges (lib/data's decoding)
    asio::posix::stream_descriptor fd; // events.fd(): released, never closed (the context's)
    unsigned pins = 0;
    bool armed = false;      // a read-then-wait is posted or its wait is pending
    bool idle_check = false; // a check whether to stop waiting is posted
    bool broken = false;     // reading failed: no longer watched (logged)
};

// A registered CQ and the state of its driver. Owned by the service; the handle
// (async::CompletionQueue) and every pending driver handler pin it.
struct CqCore {
    Completions* service;
    rdmaxx::CompletionQueue cq;
    DriveOptions drive;
    std::optional<asio::posix::stream_descriptor> channel; // event and hybrid
    std::source_location created;
    std::size_t outstanding = 0; // completions due (one per posted operation)
    std::size_t reserved = 0;    // queue entries of the QPs attached: at most the CQ's depth
    unsigned qps = 0;
    unsigned pins = 0;           // the handle and pending driver handlers
    bool driving = false;        // a poll turn or a channel wait is pending
    bool events_failing = false; // an arm or a channel wait failed: polled in turns (logged once)
    std::chrono::steady_clock::time_point last_completion{};
    CompletionSink sink;         // take == nullptr: completions name operations
    DeviceWatch* device = nullptr; // its context's events (none for a sink CQ)

    // Whether the driver keeps going: operations due, or a sink whose handle lives.
    bool wanted() const noexcept { return outstanding != 0 || sink.take != nullptr; }
};

} // namespace detail

/// The service that drives an io_context's CQs. Reach it with Completions::of(io); it
/// is created with the first CQ.
/// Destroying its io_context quiesces every QP with operations in flight (QP to the
/// error state, flush completions taken) before their handlers are destroyed uncalled.
/// @threadsafety As the io_context, which one thread runs (completions.hpp).
class Completions : public asio::io_context::service {
public:
    /// Asio's key of this service.
    static inline asio::io_context::id id;

    /// Made by Asio (asio::use_service, through of()), not by applications.
    explicit Completions(asio::io_context& io);
    /// Destroyed with its io_context.
    /// @misuse An async::QueuePair or async::CompletionQueue that outlives its
    /// io_context (the abort names the line that created it).
    ~Completions() override;

    /// The service of `io`, created on first use.
    static Completions& of(asio::io_context& io) { return asio::use_service<Completions>(io); }

    /// Polls every CQ of this io_context once, whatever its mode (up to turn_budget
    /// completions each), and runs the handlers of what completed (inline, when their
    /// executor allows). Returns how many operations completed. For applications with
    /// their own loop (manual mode).
    std::size_t poll();
    /// Reads the pending async events of every device context this service watches,
    /// without waiting, and ends the operations they concern (see the top of this
    /// file); returns how many events were read. For manual mode: the io_context
    /// watches a context's events only while a driven CQ of it has work in flight.
    std::size_t take_device_events();

    /// Operations posted or waiting for queue entries.
    std::size_t in_flight() const noexcept { return slab_.in_use(); }
    /// Completions that named no operation in flight: late flushes of a batch's
    /// unsignaled WRs after it failed, or a WR posted on an async QP by other means.
    std::uint64_t stale_completions() const noexcept { return stale_; }
    /// Doorbells rung for held sends (async::QueuePair: the sends that the handlers of
    /// one poll start go out together).
    std::uint64_t held_doorbells() const noexcept { return held_doorbells_; }
    /// The sends those doorbells posted: held_sends() / held_doorbells() is how many
    /// operations a doorbell carried.
    std::uint64_t held_sends() const noexcept { return held_sends_; }
    /// Completions of rdmaxx's (RPC calls) deferred by post_completion() and run by the
    /// driver handler that took them, after its poll or as it ended, with no turn of the
    /// io_context between (after an application's exception out of one, the rest run
    /// in a handler of their own).
    std::uint64_t deferred_completions() const noexcept { return deferred_completions_; }

    /// @name lib/async's own use
    /// What async::CompletionQueue and async::QueuePair call; not for applications.
    /// @{

    /// The slots of the operations in flight.
    detail::OpSlab& slab() noexcept { return slab_; }
    /// Whether the io_context is shutting down: no handler runs any more.
    bool shut_down() const noexcept { return shut_down_; }
    /// Registers a CQ's driver state (CompletionQueue::create).
    void add(detail::CqCore& cq) { cqs_.push_back(&cq); }
    /// Registers a QP's state (QueuePair::attach).
    void add(detail::QpCore& qp) { qps_.push_back(&qp); }
    /// Forgets a QP's state (~QueuePair).
    void remove(detail::QpCore& qp) noexcept;
    /// How a send is posted now: at once (no poll's handlers run), at once and the next
    /// ones held (the last handler of a poll runs and has posted nothing: a lone
    /// operation's latency pays for no holding), or held (handlers follow in the same
    /// poll, or this one has posted already), to be rung with the others when the
    /// poll's handlers are done.
    enum class Posting : std::uint8_t { at_once, first_at_once, held };
    /// The posting mode now (take() sets it per handler; a send at once of the last
    /// handler makes it held).
    Posting& posting() noexcept { return posting_; }
    /// `qp` holds sends for the doorbell rung when the running poll's handlers are done.
    void hold(detail::QpCore& qp);
    /// A doorbell posted `sends` held sends.
    void rang(std::size_t sends) noexcept {
        ++held_doorbells_;
        held_sends_ += sends;
    }
    /// Drives `cq` from a handler posted now (never inline: see completions.cpp).
    void start(detail::CqCore& cq);
    /// An operation was posted whose completion will come to `cq`: drive it.
    void posted(detail::CqCore& cq) {
        ++cq.outstanding;
        if (cq.drive.mode == CompletionMode::manual)
            return;
        if (!cq.driving)
            start(cq);
        if (cq.device != nullptr && !cq.device->armed)
            watch(*cq.device);
    }
    /// The watch of `context`'s events, pinned for a CQ (created with the first).
    /// @errors Opening the context's events (AsyncEvents::open); adding their fd to the
    /// reactor (epoll_ctl).
    /// @misuse A moved-from Context.
    Result<detail::DeviceWatch*> device(const Context& context, std::source_location where);
    /// Releases a pin of `device`'s watch; the last frees it.
    void unpin(detail::DeviceWatch& device) noexcept;
    /// Takes what `cq` holds, up to about `limit` completions (whole polls of
    /// poll_batch), and completes it: handlers run inline unless `defer`.
    std::size_t drain(detail::CqCore& cq, bool defer, std::size_t limit);
    /// Work completions one ibv_poll_cq takes.
    static constexpr int poll_batch = 16;
    /// What one turn (a wake, a manual poll) takes before the io_context's other
    /// handlers get theirs: a CQ that never runs dry must not starve a socket.
    static constexpr std::size_t turn_budget = 64;
    /// drain()'s `limit` for all there is.
    static constexpr std::size_t unlimited = ~std::size_t{0};
    /// Releases a pin of `cq`'s driver state; the last frees it.
    void unpin(detail::CqCore& cq) noexcept;
    /// The memory of the handlers rdmaxx posts on this io_context's hot paths.
    detail::HandlerMemory& handler_memory() noexcept { return handler_memory_; }
    /// Runs `handler`, a completion of rdmaxx's (lib/rpc's calls), on this io_context,
    /// never inline: while a driver handler of this service takes completions (a busy
    /// turn, an event wake), when that handler ends, before the io_context's next turn
    /// (whose reactor would first make an epoll_wait: a few microseconds of an RPC's
    /// round trip on rxe); otherwise posted. A busy turn runs them after the poll that
    /// deferred them, and goes on polling.
    template <class Handler>
    void post_completion(Handler&& handler) {
        if (deferring_ != 0 && !shut_down_)
            deferred_.push(handler_memory_, std::forward<Handler>(handler));
        else
            post_recycled(std::forward<Handler>(handler));
    }

    /// @}

private:
    struct Turn;
    struct Wake;
    struct DeviceTurn;
    struct DeviceWake;
    struct IdleCheck;
    class Deferral;
    struct RunDeferred;
    void shutdown() override;
    // asio::post with the handler's memory from handler_memory_
    template <class Handler>
    void post_recycled(Handler&& handler) {
        asio::post(get_io_context(), detail::with_memory(handler_memory_, std::forward<Handler>(handler)));
    }
    // Runs the deferred completions in order; if one throws, the rest are posted.
    void run_deferred();
    // Posts a handler that runs the deferred completions (a driver handler that threw).
    void post_deferred();
    // Runs a driver handler's `take` (spin, sleep); drives the CQ again if it throws.
    template <class Take>
    void drive(detail::CqCore& cq, Take take);
    void spin(detail::CqCore& cq);
    void sleep(detail::CqCore& cq);
    // Posts `cq`'s next Turn; a busy or hybrid CQ's is listed in spinning_ until it runs.
    void next_turn(detail::CqCore& cq);
    void poll_instead(detail::CqCore& cq, const Error& why);
    // Polls once each spinning CQ but `turning` (whose turn runs); returns what it took.
    std::size_t poll_spinning(const detail::CqCore& turning);
    void erase(detail::CqCore& cq) noexcept;
    // Polls and completes (take_batches), the sends its handlers start held and then
    // rung together.
    std::size_t take(detail::CqCore& cq, bool defer, std::size_t limit);
    std::size_t take_batches(detail::CqCore& cq, bool defer, std::size_t limit);
    void ring_held();
    // The device watch: reads the pending events, then waits on the fd while wanted.
    void watch(detail::DeviceWatch& device);
    void listen(detail::DeviceWatch& device);
    std::size_t read_events(detail::DeviceWatch& device);
    bool wanted(const detail::DeviceWatch& device) const noexcept;
    void settle(detail::DeviceWatch& device);

    detail::HandlerMemory handler_memory_;
    detail::DeferredQueue deferred_; // post_completion()'s, while deferring_
    unsigned deferring_ = 0;         // driver handlers running (nested: a poll inside a handler)
    detail::OpSlab slab_;
    std::vector<detail::CqCore*> cqs_;
    // The busy and hybrid CQs whose Turn is pending (which pins them): a busy turn polls
    // them too. Unordered.
    std::vector<detail::CqCore*> spinning_;
    std::vector<detail::DeviceWatch*> devices_;
    std::vector<detail::QpCore*> qps_;
    std::vector<detail::QpCore*> holding_; // QPs with held sends
    Posting posting_ = Posting::at_once;
    std::uint64_t stale_ = 0;
    std::uint64_t held_doorbells_ = 0;
    std::uint64_t held_sends_ = 0;
    std::uint64_t deferred_completions_ = 0;
    bool shut_down_ = false;
};

/// A completion queue driven by its io_context's Completions service. Create QPs on
/// get(), then attach them (async::QueuePair). Destroy the QPs attached first, and this
/// object before its io_context (programming errors otherwise). Move-only.
/// @threadsafety As the io_context, which one thread runs (completions.hpp).
class CompletionQueue : rdmaxx::detail::MoveOnly {
public:
    /// `cq` as for rdmaxx::CompletionQueue::create; its channel is created for the
    /// event and hybrid modes (and in manual mode if `cq.channel` asks for it).
    /// @errors rdmaxx::CompletionQueue::create's (a depth above the device's max_cqe,
    /// say); opening the context's async events; adding an fd to the reactor
    /// (epoll_ctl).
    /// @misuse A moved-from Context, depth 0; busy_polls or busy_completions 0 in busy or hybrid mode.
    static Result<CompletionQueue> create(asio::io_context& io, const Context& context, CqOptions cq = {},
                                          DriveOptions drive = {},
                                          std::source_location where = std::source_location::current());
    /// A sink CQ (see the top of completions.hpp): every completion goes to `sink`; no
    /// async::QueuePair can be attached to it. Driven from now until the handle is
    /// destroyed (busy mode spins all that time), so it keeps run() going.
    /// @errors As create(), but for the async events, which a sink CQ does not watch.
    /// @misuse As create(), and a sink without `take`.
    static Result<CompletionQueue> create(asio::io_context& io, const Context& context, CompletionSink sink,
                                          CqOptions cq = {}, DriveOptions drive = {},
                                          std::source_location where = std::source_location::current());

    /// Takes over `other`'s CQ; `other` is left moved-from.
    CompletionQueue(CompletionQueue&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}
    /// Lets go of this one's CQ, as the destructor does, then takes over `other`'s.
    CompletionQueue& operator=(CompletionQueue&& other) noexcept;
    /// Stops driving the CQ; it is destroyed once no pending driver handler names it.
    /// @misuse A QueuePair attached to it still alive.
    ~CompletionQueue();

    /// The verbs CQ, to create QPs on (QpOptions::send_cq / recv_cq).
    /// @misuse A moved-from CompletionQueue.
    rdmaxx::CompletionQueue& get(std::source_location where = std::source_location::current()) const;
    /// How it is driven.
    /// @misuse A moved-from CompletionQueue.
    CompletionMode mode(std::source_location where = std::source_location::current()) const;
    /// Takes this CQ's completions now and runs their handlers (or gives them to its
    /// sink); returns how many.
    /// @misuse A moved-from CompletionQueue.
    std::size_t poll(std::source_location where = std::source_location::current());
    /// Completions due: operations posted and not yet completed.
    std::size_t outstanding() const noexcept { return state_ ? state_->outstanding : 0; }

    /// lib/async's own use: the driver's state of this CQ.
    /// @misuse A moved-from CompletionQueue.
    detail::CqCore& state(std::source_location where) const;

private:
    explicit CompletionQueue(detail::CqCore* state) : state_(state) {}
    static Result<CompletionQueue> make(asio::io_context& io, const Context& context, CqOptions cq,
                                        DriveOptions drive, CompletionSink sink, std::source_location where);
    detail::CqCore* state_;
};

} // namespace rdmaxx::async
