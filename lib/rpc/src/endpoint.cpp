// The endpoint's core: the UD transport's packets into the session windows (slots.hpp)
// and out again, the listener and session setup over TCP or RDMA CM (session_codec.hpp,
// session_table.hpp, control_channel.hpp), the calls' handlers and one ticker for every timeout.
#include <rdmaxx/rpc/endpoint.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <fmt/format.h>

#include <rdmaxx/async/blocking.hpp>
#include <rdmaxx/async/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>
#include <rdmaxx/wrap/mw.hpp>

#include "../../ctrl/src/host_shares.hpp"
#include "control_channel.hpp"
#include "packet.hpp"
#include "rc_codec.hpp"
#include "rc_transport.hpp"
#include "session_codec.hpp"
#include "session_table.hpp"
#include "slots.hpp"
#include "test_access.hpp"
#include "ud_transport.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::rpc {

static_assert(detail::drop_reasons <= std::tuple_size_v<decltype(Counters::drops)>);

std::uint64_t Counters::dropped() const noexcept {
    std::uint64_t sum = 0;
    for (const std::uint64_t n : drops)
        sum += n;
    return sum;
}

std::string_view drop_reason_name(std::size_t i) noexcept {
    return i < detail::drop_reasons ? detail::to_string(static_cast<detail::DropReason>(i)) : std::string_view{};
}

namespace detail {

using async::no_throw;
using async::run_blocking;

namespace {

// co_spawn's completion for the endpoint's coroutines: an exception (an application's
// handler, out of a coroutine handler or the accept handler; memory) propagates out of
// the io_context's run(), never swallowed (asio::detached would drop it).
struct RethrowOutOfRun {
    void operator()(const std::exception_ptr& thrown) const {
        if (thrown)
            std::rethrow_exception(thrown);
    }
};

// The MessageBuffers of a call made with them (client).
struct CallBuffers {
    MessageBuffer* request = nullptr;
    MessageBuffer* response = nullptr;
};

// A call in its window slot (client).
struct PendingCall {
    bool busy = false;
    std::uint64_t request = 0;
    std::span<std::byte> response;
    CallBuffers buffers; // of a call made with them: the response's size() is set on success
    BufferHold sending;  // the request's MessageBuffer, while the window sends from it
    bool whole_posted = false; // its whole request's SEND was posted (not only stalled)
    // it offered memory for its response: the server may WRITE it, with an immediate
    bool may_be_written = false;
    // its descriptor handed out keys of its slot's memory windows (RcPath::ClientSlot)
    bool windows_bound = false;
    // its answer, held while its windows are revoked (it is then no longer in the
    // ClientWindow: it ends only as the revocation completes, or with its session)
    std::optional<Result<std::size_t>> revoking;
    Clock::time_point deadline{};
    StoredCall handler;
};

// A call waiting for its window slot (client), named by its ticket until it begins.
struct QueuedCall {
    std::uint64_t ticket = 0;
    std::uint8_t type = 0;
    std::span<const std::byte> request;   // a call with MessageBuffers takes both from them as it begins
    std::span<std::byte> response;
    CallBuffers buffers;
    Clock::time_point deadline{};
    StoredCall handler;
};

Error call_error(int errnum, std::string detail) { return Error::from_errno("rpc::Session::call", errnum, std::move(detail)); }

// Staging memory is allocated in powers of two from this size up (a slot that grows
// re-registers rarely; one that carries messages of a few KiB, as the default
// threshold sends over RC, keeps little).
constexpr std::size_t min_staging = 4 * 1024;

// The region `held` if it holds `size` bytes and no transfer may still touch it, else
// a new one of `access`. `retire_into`: a transfer may still touch `held`, which goes
// there rather than being freed (and is not reused).
Result<MemoryRegion*> staging(const ProtectionDomain& pd, std::optional<MemoryRegion>& held, std::size_t size,
                              Access access, std::vector<MemoryRegion>* retire_into) {
    if (held && held->size() >= size && retire_into == nullptr)
        return &*held;
    auto fresh = MemoryRegion::allocate(pd, std::max(min_staging, std::bit_ceil(size)), access);
    if (!fresh)
        return std::unexpected(std::move(fresh.error()));
    if (held && retire_into != nullptr)
        retire_into->push_back(std::move(*held));
    held.emplace(std::move(*fresh));
    return &*held;
}

// Where `bytes` start in `region`, if they lie wholly in it.
std::optional<std::size_t> offset_within(std::span<const std::byte> bytes, const MemoryRegion& region) {
    if (bytes.empty())
        return std::nullopt;
    const auto at = reinterpret_cast<std::uintptr_t>(bytes.data());
    const auto base = reinterpret_cast<std::uintptr_t>(region.data());
    if (at < base || at - base > region.size() || bytes.size() > region.size() - (at - base))
        return std::nullopt;
    return at - base;
}

// A server transfer's wr_id: the session (number and generation), the window slot
// (below max_window: 10 bits), READ or WRITE.
std::uint64_t transfer_id(SessionId id, std::uint32_t slot, RcTransport::Op op) noexcept {
    return std::uint64_t{id.number} << 43 | std::uint64_t{id.generation} << 11 | std::uint64_t{slot} << 1 |
           (op == RcTransport::Op::write ? 1 : 0);
}
static_assert(max_window <= 1024);

// The RC path's CQ entries, shared by every session's RC QP; the transfers the
// servers' sessions may have in flight on it at once (a quarter), and the receives for
// the immediates of responses WRITTEN to this end's calls (half): the rest is room for
// the late completions of QPs destroyed mid-transfer.
constexpr std::uint32_t rc_cq_depth = 8192;
constexpr std::uint32_t rc_budget = rc_cq_depth / 4;
constexpr std::uint32_t rc_receives = rc_cq_depth / 2;
// The calls of this end that may still get a response WRITTEN with an immediate (their
// own, or an abandoned call's earlier in their slot): at most half the receives, so the
// SRQ cannot run dry while immediates that came wait to be polled (it would NAK the
// server's WRITE, which fails after its RNR retries, and ends the session). A call past
// it offers no memory: its response comes in UD packets.
constexpr std::uint32_t rc_offers = rc_receives / 2;
// A request whose descriptor (with the request inline) is at most this many bytes, and
// more than one UD packet, is SENT whole over the RC QP (packet.hpp) rather than READ
// or sent in UD packets: into one of the server endpoint's rc_whole_receives buffers.
// The server keeps a session at most its window's worth of them (and 255) on their way,
// while it has buffers to spare: a session past them READs. A client has at most
// rc_sends SENDs in flight at once: one past them waits for its RTO, as a lost packet.
constexpr std::uint32_t whole_max_message = request_descriptor_bytes + 16 * 1024;
constexpr std::uint32_t rc_whole_receives = 256;
constexpr std::uint32_t rc_sends = 256;
// Lending through windows, the window work requests of this end's RC QPs that may
// complete at once: binds and revocations posted and not complete, and the revocation
// each bound window will need (RcPath::window_wrs). A call lends through windows only
// while its four (two windows, each bound and revoked) fit here and in its session's
// share of its QP's send queue (window_wrs_per_slot per window slot): else it goes by UD.
constexpr std::uint32_t rc_window_wrs = 1024;
constexpr std::uint32_t window_wrs_per_slot = 4;
static_assert(rc_receives + rc_whole_receives + rc_budget + rc_sends + rc_window_wrs < rc_cq_depth);
static_assert(whole_max_message <= 0xffff); // RcMessage::whole_max

// A client's SEND, window bind or revocation has a transfer's wr_id (its session and
// window slot) with one of these bits. A call's binds are posted with one doorbell,
// and so are its revocations, the last one signaled: its completion says the `wrs`
// work requests of the chain are done (bit 0, a transfer's READ or WRITE, says 1 or 2).
constexpr std::uint64_t client_send_bit = std::uint64_t{1} << 59;
constexpr std::uint64_t client_bind_bit = std::uint64_t{1} << 60;
constexpr std::uint64_t client_revoke_bit = std::uint64_t{1} << 61;
std::uint64_t client_id(SessionId id, std::uint32_t slot, std::uint64_t bit, std::size_t wrs = 1) noexcept {
    return transfer_id(id, slot, RcTransport::Op::read) | bit | (wrs - 1);
}
std::uint32_t chain_wrs(std::uint64_t client_id) noexcept { return 1 + static_cast<std::uint32_t>(client_id & 1); }

} // namespace

// The RC path of one session (endpoint.hpp tells the protocol).
struct RcPath {
    enum class State : std::uint8_t { none, offered, ready, unavailable };
    // client: per window slot, the request the server READs and the memory it may
    // WRITE the response into; `abandoned` (not 0): an abandoned call's transfer may
    // still reach them, so the next call takes fresh regions and these wait in `retired`
    // until a later call of the slot hears from the server (which serves a slot's calls
    // in order). Two such calls abandoned and the slot's next calls go by UD until one
    // is answered: a server that never answers a slot pins two calls' memory there, not
    // one per call (EndpointCore::wants_rdma).
    // A call made with MessageBuffers lends them instead (`lent`: the buffers the
    // server may READ and WRITE), retired the same way (`retired_lent`).
    struct ClientSlot {
        std::optional<MemoryRegion> request, response;
        // a whole request, a packet header's room in front; retired, not rewritten,
        // while a SEND may still read it
        std::optional<MemoryRegion> whole;
        std::uint32_t sends = 0; // the slot's SENDs in flight
        // the MessageBuffers whole requests were SENT from (their room in front), held
        // while a SEND may still read them: until `sends` is 0
        std::vector<BufferHold> sending;
        std::uint32_t offered = 0; // response bytes the slot's call offered
        // calls of the slot that offered memory, not heard from since: each may still
        // get a response WRITTEN (counted in EndpointCore::offers_unheard too)
        std::uint32_t offers_unheard = 0;
        bool rdma = false;         // its call is a descriptor call
        bool in_place = false;     // its response is WRITTEN into the call's MessageBuffer
        std::uint32_t abandoned = 0; // descriptor calls abandoned since the server was last heard
        // freed once neither the server (abandoned) nor a SEND of the slot may reach them
        std::vector<MemoryRegion> retired;
        std::array<BufferHold, 2> lent;
        std::vector<BufferHold> retired_lent;
        std::uint8_t bound = 0; // the slot's windows its call bound (bit i: SlotWindows::current[i])
        // its calls' chains of window binds posted whose completion has not come (an
        // abandoned call's among them): a call begun in the slot sends nothing until
        // they are all complete (ClientWindow::hold). Its own binds take effect before
        // the server may use their keys, and an abandoned call's windows, retired until
        // the server answers in the slot, are not destroyed under their binds.
        std::uint32_t bind_chains = 0;
    };
    // client, lending through windows (EndpointOptions::lend_through_windows): the memory a call offers is
    // reached only through its slot's windows, current[0] READ (the request) and
    // current[1] WRITTEN (the response), each bound on the session's RC QP to exactly
    // the call's bytes before its descriptor goes, and revoked (LOCAL_INV) before the
    // call finishes. An abandoned call's windows stay bound (its server may still READ
    // or WRITE, into memory the caller no longer holds: renew) and wait in `retired`
    // until the server is heard from in the slot; destroying a window revokes its key
    // at once.
    struct SlotWindows {
        std::array<std::optional<MemoryWindow>, 2> current;
        std::vector<MemoryWindow> retired;
    };
    // server: per window slot, the request READ into and the response WRITTEN from
    struct ServerSlot {
        enum class Phase : std::uint8_t { idle, reading, handling, writing };
        Phase phase = Phase::idle;
        std::uint64_t call = 0;
        std::uint8_t rpc_type = 0;
        RemoteMemory source{}, target{}; // the client's request, and the memory offered
        std::uint32_t response_size = 0;
        // a response that lies in `request` (a handler answering with the bytes READ,
        // or a part of them) is WRITTEN from there, uncopied: its offset; else none
        std::optional<std::size_t> response_in_request;
        std::optional<MemoryRegion> request, response;
        // the first packet of the slot's next call, come while this call's WRITE was
        // not yet complete (the client had its immediate first): taken once it is,
        // rather than dropped to come again after an RTO
        std::optional<PacketHeader> next;
        std::vector<std::byte> next_payload;
    };

    State state = State::none;
    Clock::time_point offered_at{};
    // offered, and no answer within setup_timeout: this end's large calls go by UD
    // meanwhile, and the QP stays for the answer, still taken when it comes (on a
    // both-ways session the peer that answered calls over the path: without this end's
    // QP connected each of its large calls would fail)
    bool offer_expired = false;
    // unavailable because this end's QP could not be made when it would have offered:
    // the peer was told nothing, so on a both-ways session its own first offer is
    // answered (unavailable), not taken for a second one
    bool peer_unaware = false;
    std::vector<ClientSlot> client_slots;
    std::vector<ServerSlot> server_slots;
    std::uint32_t transfers = 0; // server: posted, not completed
    // whole requests: the largest descriptor the server takes whole, and how many of the
    // session's may be on their way (client: what the server's answer said; server:
    // the receives it keeps for the session); 0: none
    std::uint32_t whole_max = 0, whole_grant = 0;
    std::uint32_t sends = 0; // client: SENDs in flight
    // client: binds and revocations posted and not complete, and the revocation each
    // bound window will need (an abandoned call's windows need none: they are destroyed
    // later); at most window_wrs_per_slot per window slot, the QP's send queue's share
    std::uint32_t window_wrs = 0;
    // client: of them, the binds and revocations posted and not complete, and when the
    // last completed (or, none posted before, the first was posted): windows_stalled
    std::uint32_t window_posted = 0;
    Clock::time_point window_progress_at{};
    // client: the calls that offered memory and ended without their immediate: each
    // may still get one (the server WROTE it before the call ended, or will), so many
    // immediates naming no call in progress an honest server may send; one more ends
    // the session (EndpointCore::misused)
    std::uint64_t late_writes = 0;
    // server: descriptor requests that came while this end's own offer was still out
    // (the peer was ready first; at most the window's): handled once the path is,
    // refused if the answer says it never is
    std::vector<HandlerCall> waiting;
    // destroyed first, before the memory it reaches
    std::optional<QueuePair> qp;
    // per client slot; destroyed before the QP they are bound through (Soft-RoCE's
    // destruction of a QP waits, for tens of seconds, for the windows bound through it)
    // and before the memory they are bound in (whose deregistration they would fail)
    std::vector<SlotWindows> windows;
};

// One session at this end: a ClientWindow and its calls where this end calls (the
// initiator; both ends of a both-ways session), a ServerWindow where it answers (the
// other end; both ends of a both-ways session). Both have the peer's address and the
// control connection whose end is theirs (it lives in the session's watcher
// coroutine).
struct SessionState {
    bool initiator = false; // this end set the session up (connect)
    SessionId local;
    SessionId remote;
    UdAddress peer;
    PeerSource source; // what the peer's UD packets carry: each is checked by it
    AddressHandle ah;
    SessionLimits limits;
    PacketLimits packets; // what decode() accepts for this session
    std::optional<ClientWindow> client;
    std::optional<ServerWindow> server;
    std::vector<PendingCall> calls; // client: by request % window
    std::span<RequestView> views;   // server: the request each slot's handler reads (request_views)
    std::deque<QueuedCall> queued;  // client: beyond the window, in order
    std::uint64_t next_ticket = 0;  // client: the next queued call's
    std::uint32_t in_flight = 0;    // client: busy entries of `calls`
    bool active = false;            // client: on the core's active list
    ControlChannel* control = nullptr;
    std::deque<std::array<std::byte, rc_message_bytes>> outbox; // to write on `control`, in order
    bool writing = false;                                       // a write_messages() runs
    // each Session::close() at this end (Endpoint::shutdown's too): its timer, cancelled
    // to wake it (this end's calls have finished, or the session ended); while there is
    // one, no call begins
    std::vector<asio::steady_timer*> closers;
    bool goodbye_sent = false;
    bool peer_closing = false; // the peer said goodbye: no call begins, the session ends once they finish
    asio::steady_timer* still_here = nullptr; // over RDMA CM: say_still_here()'s, cancelled as the session ends
    std::unique_ptr<CongestionControl> congestion; // client: its window's, if the endpoint has them
    RcPath rc;

    // No call of this end's in flight or queued (what leaves the active list, and what a
    // closing session waits for).
    bool calls_done() const noexcept { return in_flight == 0 && queued.empty(); }
    // The RC path carries requests of up to `whole_max` bytes whole (packet.hpp), at
    // most `grant` on their way at once; a grant of 0: none.
    void allow_whole(std::uint32_t grant, std::uint32_t whole_max) {
        rc.whole_grant = grant;
        rc.whole_max = grant > 0 ? whole_max : 0;
        packets = PacketLimits(packets.max_message(), packets.payload_per_packet(), rc.whole_max);
    }
};

// Coroutines outlive nothing: each holds the anchor and finds the core through it after
// every suspension; ~EndpointCore empties it.
using Anchor = std::shared_ptr<EndpointCore*>;

// A client's setup at the listener, until its reply is out (SetupUnderWay).
struct ListenerSetup {
    std::string host;                  // its control connection's (ControlChannel::peer_host)
    ControlChannel* channel = nullptr; // once serve_setup began
    bool heard = false;                // its client's request came
    async::PeerTurn* turn = nullptr;   // while it waits for its turn at the helpers
    bool evicted = false;              // closed to make room: winding down, uncounted

    // Whether closing it now is what an eviction needs: silent, or waiting for its
    // turn (not making its address handle, nor writing its reply).
    bool can_go() const noexcept { return !evicted && (!heard || turn != nullptr); }
};

struct EndpointCore {
    EndpointCore(asio::io_context& io, EndpointOptions options, std::source_location created)
        : executor(io.get_executor()), completions(&async::Completions::of(io)),
          options(std::move(options)), created(created), owner(std::this_thread::get_id()),
          anchor(std::make_shared<EndpointCore*>(this)), table(this->options.max_sessions, this->options.ring),
          request_views(this->options.max_sessions), ticker(io) {}
    ~EndpointCore();

    void check_thread(std::source_location where) const {
        require(std::this_thread::get_id() == owner, where,
                "rpc::Endpoint used from another thread than the one that created it (post to its io_context)");
    }
    // A destructor cannot name its caller's line: the message names the handle instead.
    void check_thread_destroying(const char* handle) const {
        require(std::this_thread::get_id() == owner, std::source_location::current(),
                "{} destroyed on another thread than its endpoint's (destroy it on the endpoint's thread: post it "
                "there through the io_context)",
                handle);
    }

    // packets. The inline members here are inlined where they are defined, into the
    // packet and call paths: each call boundary there is a prologue, an epilogue and
    // argument moves, and under emulation a round trip pays for every distinct
    // instruction it runs (bench/results/rpc-round-trip.md).
    static void deliver(void* self, UdSource from, std::span<const std::byte> packet) {
        static_cast<EndpointCore*>(self)->take(from, packet);
    }
    void take(UdSource from, std::span<const std::byte> packet);
    // The session a packet (UD, or a whole request) names and its header, checked with
    // that session's limits; nothing: dropped, counted by reason.
    struct Addressed {
        SessionState* session;
        PacketHeader header;
    };
    inline std::optional<Addressed> addressed(std::span<const std::byte> packet);
    inline void serve(SessionState& s, const PacketHeader& header, std::span<const std::byte> payload);
    bool hold_until_written(SessionState& s, const PacketHeader& header, std::span<const std::byte> payload);
    void drop(DropReason reason) noexcept { ++counters.drops[static_cast<std::size_t>(reason)]; }
    inline void send(SessionState& s, const Outgoing& out, const BufferHold* memory = nullptr);
    [[gnu::cold]] void send_failed(SessionState& s, const Error& error);
    void send_whole(SessionState& s, const Outgoing& out);
    // What may go, goes; `now`: the caller's reading of the clock (one per event).
    inline void pump(SessionState& s, Clock::time_point now);

    // client calls
    inline void start(SessionId id, std::uint8_t type, std::span<const std::byte> request,
                      std::span<std::byte> response, CallBuffers buffers, CallOptions options, StoredCall handler);
    inline bool try_begin(SessionState& s, std::uint8_t type, std::span<const std::byte> request,
                          std::span<std::byte> response, CallBuffers buffers, Clock::time_point deadline,
                          StoredCall& handler);
    inline void begin_queued(SessionState& s, Clock::time_point now);
    void expire_queued(SessionState& s, Clock::time_point now);
    inline void end_call(SessionState& s, const CallEnd& end);
    void finish(PendingCall& call, SessionState& s, Result<std::size_t> result);
    void fail(StoredCall handler, Error error);
    void cancel(const StoredCall::Target& target);
    inline void activate(SessionState& s);
    void arm_ticker();
    void tick();

    // server
    void replace_handler(std::uint8_t type, Handler handler);
    inline void handle(SessionState& s, const HandlerCall& call);
    inline void run_handler(SessionState& s, std::uint8_t type, std::uint64_t request,
                            std::span<const std::byte> message, std::span<const std::byte> lent = {});
    inline void respond(std::uint16_t number, std::uint32_t generation, std::uint64_t request, Status status,
                        std::span<const std::byte> response);

    // the RC path
    bool wants_rdma(const SessionState& s, std::size_t request, std::uint32_t capacity) const noexcept;
    struct Description {
        std::span<const std::byte> message;
        bool whole = false; // SENT whole over RC (from the call's MessageBuffer or staging memory)
    };
    Result<Description> describe(SessionState& s, std::span<const std::byte> request, std::uint32_t capacity,
                                 CallBuffers lend);
    // How memory the RC path may lend with `remote` rights is registered: with those
    // rights, or, where windows lend it, with none (its own key reaches nothing).
    Access lendable(Access remote) const noexcept {
        if (!windows)
            return remote;
        return has(remote, Access::remote_write) ? Access::local_write | Access::mw_bind : Access::mw_bind;
    }
    struct Lent {
        const MemoryRegion* region = nullptr;
        std::size_t offset = 0;
    };
    // Binds the slot's windows to what the call offers (`keys[i]`, whose length is not 0:
    // in `lent[i]`) with one doorbell and makes `keys` theirs; ClientSlot::bound names
    // those posted.
    // Runtime error: a window could not be made (none is bound), or a post failed (the
    // QP is broken: the session ends, and the call with it).
    Result<void> bind_windows(SessionState& s, std::uint32_t k, std::array<RemoteMemory*, 2> keys,
                              const std::array<Lent, 2>& lent);
    // Whether a call of session `s` may lend through windows now (rc_window_wrs).
    bool window_room(const SessionState& s) const noexcept;
    // Session `s`'s RcPath::window_wrs, and the endpoint's sum of them, grow by `n`.
    void add_window_wrs(SessionState& s, std::int32_t n) noexcept {
        s.rc.window_wrs += n;
        window_wrs += n;
    }
    // Posts the revocations of the windows call `call`'s slot bound, with one doorbell.
    // A failed post (the QP is broken) ends the session, which then finishes the call.
    void revoke_windows(SessionState& s, const PendingCall& call);
    // The chain of `wrs` binds or revocations of window slot `slot` completed.
    void windows_done(const WorkCompletion& completion, SessionId session, std::uint32_t slot, bool revoked,
                      std::uint32_t wrs);
    inline void call_left_slot(SessionState& s, std::uint64_t request, bool heard_from_server);
    // Call `call` (in progress, its answer not in) ends with `why` as its caller is gone
    // (cancelled, past its deadline): what it offered stays out of reach of its next
    // calls (renew_reachable, call_left_slot) unless none of its packets went.
    void abandon(SessionState& s, PendingCall& call, Error why);
    void renew_reachable(SessionState& s, const PendingCall& call);
    void tell_out_of_step(SessionState& s, const PacketHeader& request);
    void renew(SessionState& s, MessageBuffer& buffer, bool keep_bytes);
    Result<QueuePair> make_rc_qp(RcRole role, std::uint32_t depth);
    void offer_rc(SessionState& s);
    void rc_ready(SessionState& s);
    void rc_unavailable(SessionState& s);
    Result<std::optional<std::array<std::byte, rc_message_bytes>>> take_rc(SessionState& s, const RcMessage& message);
    bool post_transfer(SessionState& s, std::uint32_t slot);
    static void transfer_done(void* self, const WorkCompletion& completion) {
        static_cast<EndpointCore*>(self)->transfer_done(completion);
    }
    void transfer_done(const WorkCompletion& completion);
    void take_written(const WorkCompletion& completion);
    void take_whole(const WorkCompletion& completion);
    // Session `s`'s RC QP from now on (none: the old one is destroyed), and where
    // rc_session() finds it.
    void set_rc_qp(SessionState& s, std::optional<QueuePair> qp);
    // The live session whose RC QP is number `qpn`, or none (a QP gone with its session).
    SessionState* rc_session(std::uint32_t qpn);
    // A receive on an RC QP that no honest peer causes (`what`), counted as a drop by
    // `reason` if it has one: the session whose QP it came on ends. Unlike a UD packet,
    // it can only come from that session's peer (a reliable connection's other end); a
    // QP gone with its session: nothing more.
    void misused(const WorkCompletion& completion, std::optional<DropReason> reason, std::string_view what);
    void sent_whole(const WorkCompletion& completion, SessionId session, std::uint32_t slot);
    // Ends session `id` from the io_context's queue: a failure found where the caller
    // goes on with the session.
    void end_session_soon(SessionId id, std::string why);
    void post_waiting();

    // sessions
    SessionLimits most() const noexcept {
        return {.window = options.window,
                .credits = options.credits,
                .max_request = options.max_request,
                .max_response = options.max_response,
                .payload_per_packet = transport->mtu() - static_cast<std::uint32_t>(header_bytes)};
    }
    SessionState& attach(SessionId local, const SessionId& remote, const UdAddress& peer, AddressHandle ah,
                         const SessionLimits& limits, bool initiator, bool both_ways);
    void end_session(SessionId id, std::string_view why);
    void rc_receive_failed(const WorkCompletion& wc);
    // The calls waiting for a window slot end, not begun (connection reset: `why`).
    void fail_queued(SessionState& s, std::string_view why);
    // Sends `message` on the session's control connection, after those before it: one
    // write at a time (Asio's rule for a stream; a server's setup reply is one too),
    // from the outbox, once the session's watcher has the connection.
    void send_message(SessionState& s, const std::array<std::byte, rc_message_bytes>& message);
    void start_writer(SessionState& s);
    static asio::awaitable<void> write_messages(Anchor anchor, SessionId id);
    // Over RDMA CM, where an idle RC QP hears of no loss: a still-here every
    // peer_silence / 3 (rc_codec.hpp) while the session lives; the peer's watcher ends
    // the session after peer_silence without a message.
    static asio::awaitable<void> say_still_here(Anchor anchor, SessionId id);
    // A closing session's calls have all finished: its close() goes on, or (the peer
    // said goodbye) it ends.
    void calls_finished(SessionState& s);
    static asio::awaitable<Result<void>> close(Anchor anchor, SessionId id, std::chrono::milliseconds timeout);
    static asio::awaitable<Result<void>> shutdown(Anchor anchor, std::chrono::milliseconds timeout);

    static asio::awaitable<void> accept_loop(Anchor anchor, std::shared_ptr<ControlListener> listener);
    static asio::awaitable<void> serve_setup(Anchor anchor, ControlChannel channel,
                                             std::list<ListenerSetup>::iterator at);
    static asio::awaitable<void> watch(Anchor anchor, SessionId id, ControlChannel channel);
    static asio::awaitable<Result<Session>> connect(Anchor anchor, std::string host, std::uint16_t port,
                                                    std::chrono::milliseconds timeout);
    // test_access.hpp
    static QueuePair* rc_qp_of(const Session& session) noexcept;

    asio::io_context::executor_type executor;
    async::Completions* completions; // lib/async's service of the io_context
    EndpointOptions options;
    // Endpoint::create's caller: what ~Endpoint's programming error names (a
    // destructor cannot name its own caller's line)
    std::source_location created;
    std::thread::id owner;
    Anchor anchor;
    std::unique_ptr<UdTransport> transport; // before the table: the sessions' AHs go first
    const void* buffers_pd = nullptr;       // transport's ibv_pd, alloc_buffer's (BufferBlock::pd)
    std::unique_ptr<RcTransport> rc;        // made for the first RC QP; before the table too
    SessionTable<SessionState> table;
    // By session number, options.window each, made as the number first serves: a
    // session's RequestViews (SessionState::views), kept while the endpoint lives, as
    // Requests may be read after their session ended
    std::vector<std::unique_ptr<RequestView[]>> request_views;
    // Each handler where it stays while it runs (a std::function moved keeps a small
    // lambda inside itself: it would move under the running one)
    std::array<std::unique_ptr<Handler>, 256> handlers;
    // handlers replaced (set_handler) while a handler runs, perhaps the one replaced:
    // destroyed once none runs
    std::vector<std::unique_ptr<Handler>> replaced_handlers;
    std::uint32_t handlers_running = 0;
    std::shared_ptr<AcceptHandler> accept_handler; // set: sessions are both ways (shared with its run)
    Counters counters;
    // The endpoint's warnings, and its errors about sends: a few a second, whatever peers
    // do (a flood of failing setups, sessions whose RC QPs fail) or calls ask (a stream
    // of large ones that find no staging memory, of packets the device refuses); the
    // counters still count each
    rdmaxx::detail::LogBudget log_budget;
    std::shared_ptr<ControlListener> listener; // shared with its accept loop
    // an RDMA CM control connection of a session this end set up: the next one shares its
    // device context, PD and CQ (while it lives) rather than opening a context per session
    std::weak_ptr<ControlChannel::State> cm_sibling;
    bool shutting_down = false; // Endpoint::shutdown(): setups are refused, then the listener closes
    asio::steady_timer ticker;
    bool ticking = false;
    std::vector<SessionId> active; // client sessions with calls in flight or queued
    std::uint32_t handles = 0;     // Session handles alive
    // clients' setups under way at the listener (serve_setup, up to its reply), oldest
    // first, and their hosts' shares: at most max_sessions count (`setups`; the evicted
    // ones wind down uncounted), so that silent clients hold a bounded number of
    // descriptors (TCP) or QPs (RDMA CM). One more takes the place of a setup that can
    // go (ListenerSetup::can_go): the oldest of the host holding the most when that
    // holds at least two more than the newcomer's (HostShares), else its own host's
    // oldest silent one; or it is closed at once (make_setup_room). So one host opening
    // silent or unanswerable setups as fast as it likes keeps no other host out, nor a
    // client of its own behind its silent ones.
    std::list<ListenerSetup> listener_setups;
    rdmaxx::detail::HostShares setup_shares;
    std::uint32_t setups = 0;
    bool make_setup_room(const std::string& host);
    // the control connections of setups under way here, at the listener and in
    // connect() (SetupUnderWay): the endpoint's destruction closes them, and the setups
    // end at once, not at their setup_timeout (a silent client's socket or CM QP held
    // until then)
    std::vector<ControlChannel*> setting_up;
    // EndpointOptions::rdma_threshold, or one UD packet's payload at the port's MTU
    std::uint32_t rdma_threshold = 0;
    bool windows = false;         // EndpointOptions::lend_through_windows
    std::uint32_t window_wrs = 0; // client: the sessions' RcPath::window_wrs, summed (rc_window_wrs)
    std::vector<std::byte> descriptor; // the request descriptor being built (reused)
    std::uint32_t rc_in_flight = 0;    // server transfers posted on live sessions' QPs
    std::uint32_t offers_unheard = 0;  // client: the ClientSlots' offers_unheard, summed (rc_offers)
    std::uint32_t sends_in_flight = 0; // client: the sessions' RC sends, summed (rc_sends)
    std::uint32_t whole_granted = 0;   // server: the sessions' whole_grant, summed (rc_whole_receives)
    struct WaitingTransfer {
        SessionId session;
        std::uint32_t slot = 0;
    };
    std::deque<WaitingTransfer> rc_waiting; // for rc_budget
    // the live sessions' RC QPs by number: what a receive that names no call is
    // charged to (rc_session), found at once however many sessions there are and
    // however many such receives a flood leaves in the CQ
    std::unordered_map<std::uint32_t, SessionId> rc_qps;
    // its turns at the run_blocking helpers (peer_handle), whose waits its destructor ends
    std::vector<async::PeerTurn*> peer_turns;
    // The handle towards an address a peer announced (a client's setup, a session's RC
    // setup), made on a helper thread (run_blocking: a wait for its MAC) at its turn
    // (async::PeerTurn) in the lane of the host its control connection comes from
    // (`lane`: ControlChannel::peer_host); nothing if `deadline` passed before the turn
    // came, the wait was cancelled (a listener's setup evicted: `setup`, which names the
    // turn while it waits), or the endpoint is gone.
    static asio::awaitable<std::optional<Result<AddressHandle>>> peer_handle(const Anchor& anchor,
                                                                             const UdAddress& peer,
                                                                             std::string_view lane, Deadline deadline,
                                                                             ListenerSetup* setup = nullptr);
};

asio::awaitable<std::optional<Result<AddressHandle>>> EndpointCore::peer_handle(const Anchor& anchor,
                                                                                const UdAddress& peer,
                                                                                std::string_view lane,
                                                                                Deadline deadline,
                                                                                ListenerSetup* setup) {
    async::PeerTurn turn;
    (*anchor)->peer_turns.push_back(&turn);
    if (setup != nullptr)
        setup->turn = &turn;
    const bool taken = co_await turn.take(deadline, lane);
    EndpointCore* core = *anchor;
    if (core == nullptr) // perhaps handed over as the endpoint went (`setup` with it)
        co_return std::nullopt;
    std::erase(core->peer_turns, &turn);
    if (setup != nullptr)
        setup->turn = nullptr;
    if (!taken)
        co_return std::nullopt;
    auto make = core->transport->handle_maker(peer);
    co_return co_await run_blocking(make, "rpc::Endpoint");
}

EndpointCore::~EndpointCore() {
    *anchor = nullptr;
    if (listener)
        listener->close();
    for (ControlChannel* channel : setting_up)
        channel->close();
    for (async::PeerTurn* turn : peer_turns)
        turn->cancel();
    for (const SessionId id : table.live())
        end_session(id, "the endpoint was destroyed");
    ticker.cancel();
}

// ---------------------------------------------------------------------------------
// Packets

[[gnu::always_inline]]
std::optional<EndpointCore::Addressed> EndpointCore::addressed(std::span<const std::byte> packet) {
    const auto id = peek_session(packet);
    if (!id) {
        drop(DropReason::too_short);
        return std::nullopt;
    }
    SessionState* s = table.lookup(*id);
    if (s == nullptr) {
        drop(DropReason::stale_session);
        return std::nullopt;
    }
    const auto header = decode(packet, s->packets);
    if (!header) {
        drop(header.error());
        return std::nullopt;
    }
    return Addressed{.session = s, .header = *header};
}

void EndpointCore::take(UdSource from, std::span<const std::byte> packet) {
    const auto to = addressed(packet);
    if (!to)
        return;
    SessionState* s = to->session;
    const PacketHeader* header = &to->header;
    if (!s->source.sent(from))
        return drop(DropReason::wrong_source);
    const auto payload = packet.subspan(header_bytes);
    switch (header->kind) {
    case Kind::response:
    case Kind::credit_return:
    case Kind::in_progress: {
        if (!s->client)
            return drop(DropReason::wrong_kind);
        const auto now = Clock::now();
        const auto taken = s->client->receive(*header, payload, now);
        if (!taken)
            return drop(taken.error());
        if (*taken) {
            end_call(*s, **taken);
            begin_queued(*s, now);
        }
        return pump(*s, now);
    }
    case Kind::request:
    case Kind::request_for_response:
        if (!s->server)
            return drop(DropReason::wrong_kind);
        return serve(*s, *header, payload);
    case Kind::reset:
        // a session's end travels over its control connection; over UD only the
        // server's word that this end's numbers are out of step, about a call in flight
        if (s->client && header->status == Status::out_of_step) {
            const std::uint64_t r = header->request;
            const PendingCall& call = s->calls[r % s->calls.size()];
            if (!call.busy || call.request != r)
                return drop(DropReason::unsolicited);
            // only if no call of the window before it is in flight: a resend of one may
            // still reach the server (a link back after a blip) and bring it level
            for (const PendingCall& other : s->calls)
                if (other.busy && other.request < r && r - other.request < s->calls.size())
                    return drop(DropReason::too_far_ahead);
            return end_session_soon(s->local, fmt::format("the server dropped request {} as more than the window "
                                                          "past the highest it saw: a window of calls in a row was "
                                                          "lost, and the session's numbers are out of step",
                                                          header->request));
        }
        break;
    }
    drop(DropReason::wrong_kind);
}

[[gnu::always_inline]]
void EndpointCore::serve(SessionState& s, const PacketHeader& header, std::span<const std::byte> payload) {
    if (header.kind == Kind::request && header.message_size > s.limits.max_request)
        return drop(DropReason::too_large);
    const auto step = s.server->receive(header, payload);
    if (!step) {
        if (step.error() == DropReason::handler_running && hold_until_written(s, header, payload))
            return;
        if (step.error() == DropReason::too_far_ahead)
            tell_out_of_step(s, header);
        return drop(step.error());
    }
    if (const auto* out = std::get_if<Outgoing>(&*step))
        return send(s, *out);
    return handle(s, std::get<HandlerCall>(*step));
}

// A request number more than the window past the highest this server saw: its client
// lost a window of calls in a row (every packet of each), and its numbers are out of
// step with this end's for good, so that its calls could only time out. A reset naming
// the request tells it; the client, which has that call in flight, ends the session.
void EndpointCore::tell_out_of_step(SessionState& s, const PacketHeader& request) {
    send(s, {.header = {.kind = Kind::reset,
                        .rpc_type = request.rpc_type,
                        .status = Status::out_of_step,
                        .session = s.remote.number,
                        .generation = s.remote.generation,
                        .message_size = 0,
                        .request = request.request,
                        .index = 0},
             .payload = {}});
}

// A request packet whose payload lies in its call's MessageBuffer (`memory`) is
// gathered from there: header from the transport's send buffer, payload from the buffer.
[[gnu::always_inline]]
void EndpointCore::send(SessionState& s, const Outgoing& out, const BufferHold* memory) {
    std::array<std::byte, header_bytes> header;
    encode(out.header, header);
    const auto sent = memory == nullptr
                          ? transport->send(s.ah, s.peer, header, out.payload)
                          : transport->send_gather(s.ah, s.peer, header,
                                                   LocalSlice(const_cast<std::byte*>(out.payload.data()),
                                                              static_cast<std::uint32_t>(out.payload.size()),
                                                              memory->get()->lkey),
                                                   *memory);
    if (!sent)
        return send_failed(s, sent.error());
    if (!*sent)
        ++counters.send_stalls; // lost: the client's RTO sends it (or what asks for it) again
}

// A packet not sent is lost: the client's RTO sends it again. Unless the device refuses
// the endpoint's posts for good (EACCES: the process's credentials changed since it
// opened the device, lib/data's post error), when every call would wait out its
// timeout for nothing: the session ends, its calls fail now, saying why.
void EndpointCore::send_failed(SessionState& s, const Error& error) {
    log_budget.error(Clock::now(), "rdmaxx rpc: sending to session {}: {}", s.local.number, error);
    if (error.is_errno(EACCES))
        end_session_soon(s.local, fmt::format("the device refuses this endpoint's sends for good: {}", error.message()));
}

// A whole request goes from its call's MessageBuffer or its slot's staging memory, the
// header written into the room in front of the payload (a resend writes the same
// bytes). Past the server's receives for the session, or the endpoint's SENDs, it is
// not sent: lost, its RTO sends it again.
void EndpointCore::send_whole(SessionState& s, const Outgoing& out) {
    const auto k = static_cast<std::uint32_t>(out.header.request % s.calls.size());
    RcPath::ClientSlot& slot = s.rc.client_slots[k];
    if (!s.rc.qp || s.rc.sends >= s.rc.whole_grant || sends_in_flight >= rc_sends) {
        ++counters.send_stalls;
        return;
    }
    const BufferHold& lent = s.calls[k].sending;
    const MemoryRegion* memory = lent.get() != nullptr ? &lent.get()->region : slot.whole ? &*slot.whole : nullptr;
    const auto at = memory != nullptr ? offset_within(out.payload, *memory) : std::nullopt;
    require(at && *at == header_bytes, std::source_location::current(),
            "rpc: a whole request of session {} not a header's room into its memory", s.local.number);
    const LocalSlice message = memory->slice(0, header_bytes + out.payload.size());
    encode(out.header, std::span<std::byte, header_bytes>(message.data(), header_bytes));
    if (auto posted = RcTransport::send(*s.rc.qp, message, client_id(s.local, k, client_send_bit)); !posted) {
        end_session_soon(s.local, fmt::format("posting a whole request: {}", posted.error().message()));
        return;
    }
    if (lent.get() != nullptr && (slot.sending.empty() || slot.sending.back().get() != lent.get()))
        slot.sending.push_back(lent);
    s.calls[k].whole_posted = true;
    ++slot.sends;
    ++s.rc.sends;
    ++sends_in_flight;
    ++counters.rdma_sends;
}

void EndpointCore::end_session_soon(SessionId id, std::string why) {
    asio::post(executor, [anchor = anchor, id, why = std::move(why)] {
        if (EndpointCore* core = *anchor)
            core->end_session(id, why);
    });
}

[[gnu::always_inline]]
void EndpointCore::pump(SessionState& s, Clock::time_point now) {
    if (!s.client)
        return;
    while (transport->free_send_buffers() > 0) {
        const auto out = s.client->next_packet(now);
        if (!out)
            break;
        if (out->header.whole && !out->header.probe) { // a probe goes as a UD packet
            send_whole(s, *out);
            continue;
        }
        if (out->header.probe)
            ++counters.probes;
        const PendingCall& call = s.calls[out->header.request % s.calls.size()];
        const bool gathered = out->header.kind == Kind::request && call.sending.get() != nullptr &&
                              !out->payload.empty();
        send(s, *out, gathered ? &call.sending : nullptr);
    }
}

// ---------------------------------------------------------------------------------
// Client calls

void EndpointCore::fail(StoredCall handler, Error error) {
    ++counters.failed;
    std::move(handler).complete(std::unexpected(std::move(error)));
}

[[gnu::always_inline]]
void EndpointCore::start(SessionId id, std::uint8_t type, std::span<const std::byte> request,
                         std::span<std::byte> response, CallBuffers buffers, CallOptions call_options,
                         StoredCall handler) {
    ++counters.calls;
    SessionState* s = table.lookup(id);
    if (s == nullptr)
        return fail(std::move(handler), call_error(ECONNRESET, "the session has ended"));
    if (!s->closers.empty() || s->peer_closing)
        return fail(std::move(handler), call_error(ECONNRESET, s->peer_closing ? "the peer is closing the session"
                                                                               : "the session is closing"));
    if (request.size() > s->limits.max_request)
        return fail(std::move(handler), call_error(EMSGSIZE, fmt::format("a {}-byte request, the session's most is {}",
                                                                         request.size(), s->limits.max_request)));
    const auto now = Clock::now();
    const auto deadline = deadline_after(now, call_options.timeout);
    if (!s->queued.empty() || !try_begin(*s, type, request, response, buffers, deadline, handler)) {
        const std::uint64_t ticket = s->next_ticket++;
        handler.on_cancel({.core = this, .session = id.number, .generation = id.generation, .call = ticket,
                           .queued = true});
        s->queued.push_back({.ticket = ticket,
                             .type = type,
                             .request = request,
                             .response = response,
                             .buffers = buffers,
                             .deadline = deadline,
                             .handler = std::move(handler)});
    }
    activate(*s);
    pump(*s, now);
}

// A call with MessageBuffers lends those that nothing else may still touch (an earlier
// call's transfer or send): the others are copied, as spans are. It reads their memory as
// it is now: another call abandoned with the same request buffer may have given it new
// memory since this one was queued.
[[gnu::always_inline]]
bool EndpointCore::try_begin(SessionState& s, std::uint8_t type, std::span<const std::byte> request,
                             std::span<std::byte> response, CallBuffers buffers, Clock::time_point deadline,
                             StoredCall& handler) {
    if (buffers.request != nullptr) {
        request = buffers.request->hold_.get()->message().first(buffers.request->size_);
        response = buffers.response->hold_.get()->message();
    }
    const auto capacity = static_cast<std::uint32_t>(std::min<std::size_t>(response.size(), s.limits.max_response));
    if (s.calls[s.client->next_request() % s.calls.size()].busy)
        return false; // the window is full (begin() would say so)
    const CallBuffers lend{
        .request = buffers.request != nullptr && buffers.request->hold_.sole() ? buffers.request : nullptr,
        .response = buffers.response != nullptr && buffers.response->hold_.sole() ? buffers.response : nullptr};
    std::span<const std::byte> message = request;
    bool rdma = false, whole = false;
    if (wants_rdma(s, request.size(), capacity)) {
        if (s.rc.state == RcPath::State::none)
            offer_rc(s);
        if (s.rc.state == RcPath::State::offered)
            return false; // until the server answers (or the offer times out)
        if (s.rc.state == RcPath::State::ready) {
            if (auto described = describe(s, request, capacity, lend); described) {
                message = described->message;
                rdma = true;
                whole = described->whole;
            } else {
                log_budget.warn(Clock::now(), "rdmaxx rpc: staging a large call of session {} (it goes by UD): {}",
                                s.local.number, described.error());
            }
        }
    }
    // a call with MessageBuffers sends its request packets, or SENDs its whole request,
    // from its buffer; a whole request of spans from the staging memory describe()
    // copied it into
    const bool from_buffer = (!rdma || whole) && lend.request != nullptr;
    const auto keep = from_buffer || whole ? ClientWindow::Keep::borrow : ClientWindow::Keep::copy;
    const auto begun = s.client->begin(type, message, capacity, rdma, keep, whole);
    if (!begun)
        return false;
    if (!rdma && keep == ClientWindow::Keep::copy && !request.empty())
        ++counters.message_copies;
    bool offered = false, bound = false;
    if (!s.rc.client_slots.empty()) {
        RcPath::ClientSlot& slot = s.rc.client_slots[*begun % s.calls.size()];
        slot.rdma = rdma;
        // windows describe() bound, if it then failed too: the call revokes them as it
        // finishes (a failed post ends the session: end_session finishes it)
        bound = slot.bound != 0;
        if (slot.bind_chains > 0)
            s.client->hold(*begun); // until the slot's binds complete (windows_done)
        offered = rdma && slot.offered > 0;
        if (offered) {
            ++slot.offers_unheard;
            ++offers_unheard;
        }
    }
    PendingCall& call = s.calls[*begun % s.calls.size()];
    call.busy = true;
    call.request = *begun;
    call.response = response;
    call.buffers = buffers;
    call.sending = from_buffer ? lend.request->hold_ : BufferHold{};
    call.whole_posted = false;
    call.may_be_written = offered;
    call.windows_bound = bound;
    call.deadline = deadline;
    call.handler = std::move(handler);
    call.handler.on_cancel(
        {.core = this, .session = s.local.number, .generation = s.local.generation, .call = *begun, .queued = false});
    ++s.in_flight;
    return true;
}

// What can begin, begins, in order (a call at the head past its deadline ends instead).
// On the packet path: it looks at the head only.
[[gnu::always_inline]]
void EndpointCore::begin_queued(SessionState& s, Clock::time_point now) {
    while (!s.queued.empty()) {
        QueuedCall& next = s.queued.front();
        if (next.deadline <= now) {
            fail(std::move(next.handler), Error::timeout("rpc::Session::call", "waiting for a window slot"));
        } else if (!try_begin(s, next.type, next.request, next.response, next.buffers, next.deadline,
                              next.handler)) {
            return;
        }
        s.queued.pop_front();
    }
}

// Calls past their deadline leave the queue (timeout), wherever they wait in it: the
// ticker's scan, off the packet path.
void EndpointCore::expire_queued(SessionState& s, Clock::time_point now) {
    for (auto it = s.queued.begin(); it != s.queued.end();) {
        if (it->deadline > now) {
            ++it;
            continue;
        }
        fail(std::move(it->handler), Error::timeout("rpc::Session::call", "waiting for a window slot"));
        it = s.queued.erase(it);
    }
}

void EndpointCore::finish(PendingCall& call, SessionState& s, Result<std::size_t> result) {
    // counted as the call leaves its window (its immediate may come before it finishes)
    if (std::exchange(call.may_be_written, false))
        ++s.rc.late_writes;
    if (std::exchange(call.windows_bound, false)) [[unlikely]] {
        revoke_windows(s, call);
        call.revoking.emplace(std::move(result)); // finished as the revocation completes
        return;
    }
    call.revoking.reset();
    call.busy = false;
    --s.in_flight;
    if (result && call.buffers.response != nullptr)
        call.buffers.response->size_ = *result;
    call.buffers = {};
    call.sending = BufferHold{};
    if (result)
        ++counters.completed;
    else
        ++counters.failed;
    std::move(call.handler).complete(std::move(result));
}

[[gnu::always_inline]]
void EndpointCore::end_call(SessionState& s, const CallEnd& end) {
    PendingCall& call = s.calls[end.request % s.calls.size()];
    if (end.outcome == CallOutcome::timed_out)
        renew_reachable(s, call);
    call_left_slot(s, end.request, end.outcome != CallOutcome::timed_out);
    switch (end.outcome) {
    case CallOutcome::ok:
        if (end.rdma) {
            const RcPath::ClientSlot& slot = s.rc.client_slots[end.request % s.calls.size()];
            const auto size = decode_response_descriptor(end.response);
            if (!size)
                return finish(call, s, std::unexpected(size.error()));
            if (*size > slot.offered)
                return finish(call, s,
                              std::unexpected(Error::protocol(
                                  "rpc::Session::call", fmt::format("the server wrote a {}-byte response into {} bytes",
                                                                    *size, slot.offered))));
            if (!slot.in_place && *size > 0) {
                std::memcpy(call.response.data(), slot.response->data(), *size);
                ++counters.message_copies;
            }
            return finish(call, s, std::size_t{*size});
        }
        if (!end.response.empty()) {
            std::memcpy(call.response.data(), end.response.data(), end.response.size());
            ++counters.message_copies;
        }
        return finish(call, s, end.response_size);
    case CallOutcome::no_handler:
        return finish(call, s, std::unexpected(call_error(ENOENT, "the server has no handler for the call's type")));
    case CallOutcome::too_large:
        return finish(call, s,
                      std::unexpected(call_error(EMSGSIZE, "the response exceeded the session's max_response")));
    case CallOutcome::handler_dropped:
        return finish(call, s, std::unexpected(call_error(EPIPE, "the server's handler ended without answering")));
    case CallOutcome::transfer_failed:
        return finish(call, s, std::unexpected(call_error(EIO, "the server could not READ the request")));
    case CallOutcome::response_truncated:
        return finish(call, s, std::unexpected(call_error(
                                   ENOBUFS, fmt::format("a {}-byte response, the buffer holds {}", end.response_size,
                                                        call.response.size()))));
    case CallOutcome::timed_out:
        return finish(call, s,
                      std::unexpected(call_error(EHOSTUNREACH, "no answer after the most retransmission timeouts")));
    }
}

void EndpointCore::cancel(const StoredCall::Target& target) {
    SessionState* s = table.lookup({.number = target.session, .generation = target.generation});
    if (s == nullptr)
        return;
    if (target.queued) { // not begun: it leaves the queue, nothing was sent
        const auto it = std::ranges::find(s->queued, target.call, &QueuedCall::ticket);
        if (it != s->queued.end()) {
            fail(std::move(it->handler), Error::cancelled("rpc::Session::call", "before it began"));
            s->queued.erase(it);
        }
        return;
    }
    PendingCall& call = s->calls[target.call % s->calls.size()];
    if (!call.busy || call.request != target.call || call.revoking)
        return; // ended, or its answer is in (its windows being revoked)
    abandon(*s, call, Error::cancelled("rpc::Session::call"));
    const auto now = Clock::now();
    begin_queued(*s, now);
    pump(*s, now);
}

void cancel_call(const StoredCall::Target& target) noexcept { target.core->cancel(target); }

void EndpointCore::abandon(SessionState& s, PendingCall& call, Error why) {
    const bool unsent = s.client->abandon(call.request);
    // nothing of it went: the server can neither READ nor WRITE what it offered
    if (unsent && std::exchange(call.may_be_written, false)) {
        --s.rc.client_slots[call.request % s.calls.size()].offers_unheard;
        --offers_unheard;
    }
    // What went may be reached late; and a window bound (or being bound) to a buffer
    // unsent has a key the server can guess (the window's last, advanced by one), and
    // stays bound until the server is heard from in the slot (call_left_slot)
    if (!unsent || call.windows_bound)
        renew_reachable(s, call);
    call_left_slot(s, call.request, false);
    finish(call, s, std::unexpected(std::move(why)));
}

[[gnu::always_inline]]
void EndpointCore::activate(SessionState& s) {
    if (!s.active) {
        s.active = true;
        active.push_back(s.local);
    }
    arm_ticker();
}

void EndpointCore::arm_ticker() {
    if (ticking || active.empty())
        return;
    ticking = true;
    ticker.expires_after(options.tick);
    struct Tick {
        Anchor anchor;
        void operator()(std::error_code ec) const {
            EndpointCore* core = *anchor;
            if (core == nullptr)
                return;
            core->ticking = false;
            if (!ec)
                core->tick();
        }
    };
    ticker.async_wait(async::detail::with_memory(completions->handler_memory(), Tick{anchor}));
}

namespace {

// How long a session's window binds and revocations may go without one completing
// before its QP is taken for stalled and the session ended (which destroys the windows
// and delivers the answers they held back): local work requests take microseconds on a
// NIC and on Soft-RoCE, whose stalls lasted 40 s and more.
constexpr auto window_stall = std::chrono::seconds(5);

bool windows_stalled(const SessionState& s, Clock::time_point now) noexcept {
    return s.rc.window_posted > 0 && now - s.rc.window_progress_at > window_stall;
}

// Whether a call's deadline or an RTO has come by `now` in the client session `s`.
bool due(const SessionState& s, Clock::time_point now) {
    if (const auto rto = s.client->next_deadline(); rto && *rto <= now)
        return true;
    return std::ranges::any_of(
        s.calls, [now](const PendingCall& call) { return call.busy && !call.revoking && call.deadline <= now; });
}

} // namespace

// Every active client session, in one pass: calls past their deadline end (timeout),
// expired RTOs roll back (go-back-N) or end a call (the retry cap), then what may go,
// goes.
void EndpointCore::tick() {
    const auto now = Clock::now();
    bool polled = false;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < active.size(); ++i) {
        SessionState* s = table.lookup(active[i]);
        if (s == nullptr)
            continue;
        if (!polled && due(*s, now)) {
            // before the first session with something due, what has arrived is taken:
            // a response in the CQ (the driver's turn not yet come: a busy peer thread,
            // a loaded host) would otherwise be asked for again, or its call timed out,
            // with its answer a poll away. (Sessions it activates join the end of
            // `active`, and this pass.)
            polled = true;
            const std::uint64_t ended = counters.completed + counters.failed;
            transport->poll();
            counters.taken_by_timer += counters.completed + counters.failed - ended;
            // a request's handler, run by the poll, may have destroyed this Session
            s = table.lookup(active[i]);
            if (s == nullptr)
                continue;
        }
        if (s->rc.state == RcPath::State::offered && !s->rc.offer_expired &&
            now > deadline_after(s->rc.offered_at, options.setup_timeout)) {
            log_budget.warn(now,
                            "rdmaxx rpc: session {}: no answer to its RC offer in {} ms: large messages go by UD until "
                            "it comes",
                            s->local.number, options.setup_timeout.count());
            s->rc.offer_expired = true; // the calls waiting for it begin below
        }
        for (PendingCall& call : s->calls)
            if (call.busy && !call.revoking && call.deadline <= now)
                abandon(*s, call, Error::timeout("rpc::Session::call", "no response in time"));
        if (windows_stalled(*s, now)) [[unlikely]] {
            rc->poll(); // a completion the driver has not taken yet is no stall
            s = table.lookup(active[i]);
            if (s == nullptr)
                continue;
            if (windows_stalled(*s, now)) {
                end_session(s->local, fmt::format("its RC QP completed no window bind or revocation in {} s",
                                                  window_stall.count()));
                continue;
            }
        }
        const std::uint32_t before = s->client->in_flight();
        while (const auto end = s->client->expire(now))
            end_call(*s, *end);
        counters.retransmissions += before - s->client->in_flight();
        expire_queued(*s, now);
        begin_queued(*s, now);
        pump(*s, now);
        if (s->calls_done()) {
            s->active = false;
            if (!s->closers.empty() || s->peer_closing)
                calls_finished(*s);
            continue;
        }
        active[kept++] = active[i];
    }
    active.resize(kept);
    arm_ticker();
}

// ---------------------------------------------------------------------------------
// Server

[[gnu::always_inline]]
void EndpointCore::handle(SessionState& s, const HandlerCall& call) {
    if (!handlers[call.rpc_type])
        return send(s, s.server->respond(call.request, Status::no_handler, {}));
    const auto lent = call.lent ? call.message : std::span<const std::byte>{};
    if (!call.rdma)
        return run_handler(s, call.rpc_type, call.request, call.message, lent);
    if (s.rc.state == RcPath::State::offered) { // the peer is ready first: wait for our answer
        HandlerCall kept = call;
        if (call.lent) {
            kept.message = s.server->keep(call.request, call.message);
            kept.lent = false;
        }
        s.rc.waiting.push_back(kept);
        return;
    }
    const auto described = decode_request_descriptor(call.message, s.limits.max_request, s.limits.max_response);
    if (!described || s.rc.server_slots.empty()) { // no RC QP here, or a descriptor from the server
        logger()->debug("rdmaxx rpc: session {}: a large request not to be read: {}", s.local.number,
                        described ? std::string("the session has no RC QP") : described.error().message());
        return send(s, s.server->respond(call.request, Status::transfer_failed, {}));
    }
    const auto k = static_cast<std::uint32_t>(call.request % s.rc.server_slots.size());
    RcPath::ServerSlot& slot = s.rc.server_slots[k];
    slot.call = call.request;
    slot.rpc_type = call.rpc_type;
    slot.source = described->request;
    slot.target = described->response;
    if (slot.source.length == 0) {
        slot.phase = RcPath::ServerSlot::Phase::handling;
        return run_handler(s, call.rpc_type, call.request, described->inline_request, lent);
    }
    if (auto region = staging(transport->pd(), slot.request, slot.source.length, Access::local_write, nullptr);
        !region) {
        log_budget.warn(Clock::now(), "rdmaxx rpc: session {}: memory to READ a large request into: {}",
                        s.local.number, region.error());
        return send(s, s.server->respond(call.request, Status::transfer_failed, {}));
    }
    slot.phase = RcPath::ServerSlot::Phase::reading;
    post_transfer(s, k);
}

namespace {

// Whether the handler of `request` answered with a response the RC path WRITEs (the
// window learns of it when the WRITE completes).
bool writing_response(const SessionState& s, std::uint64_t request) noexcept {
    if (s.rc.server_slots.empty())
        return false;
    const RcPath::ServerSlot& slot = s.rc.server_slots[request % s.rc.server_slots.size()];
    return slot.phase == RcPath::ServerSlot::Phase::writing && slot.call == request;
}

} // namespace

// `lent`: the whole request message as the window lent it (`message` lies in it), to
// keep if the handler returns without answering.
[[gnu::always_inline]]
void EndpointCore::run_handler(SessionState& s, std::uint8_t type, std::uint64_t request,
                               std::span<const std::byte> message, std::span<const std::byte> lent) {
    ++counters.handled;
    const SessionId id = s.local;
    RequestView& view = s.views[request % s.views.size()];
    view = {.bytes = message, .generation = id.generation, .request = request};
    struct Running { // the handlers replaced meanwhile go once none runs, however it ends
        EndpointCore& core;
        explicit Running(EndpointCore& c) noexcept : core(c) { ++core.handlers_running; }
        ~Running() {
            if (--core.handlers_running == 0)
                core.replaced_handlers.clear();
        }
    };
    {
        const Running running(*this);
        try {
            (*handlers[type])(Request(type, view), Responder(this, id.number, id.generation, request));
        } catch (...) {
            // the application's: it leaves run() from a handler of its own, as a
            // coroutine handler's does, and the packet path it would cut short (a
            // batch's other packets, the ring's buffers, RC transfers) goes on. The
            // Responder answered as it was destroyed (handler_dropped), unless the
            // handler kept it before it threw: then its request is kept, as below
            asio::post(executor, [thrown = std::current_exception()] { std::rethrow_exception(thrown); });
        }
    }
    if (lent.empty())
        return;
    SessionState* still = table.lookup(id);
    if (still == nullptr || !still->server->awaiting(request) || writing_response(*still, request))
        return; // answered (or the session ended) while the packet was there to read
    const auto kept = still->server->keep(request, lent);
    still->views[request % still->views.size()].bytes =
        kept.subspan(static_cast<std::size_t>(message.data() - lent.data()), message.size());
}

[[gnu::always_inline]]
void EndpointCore::respond(std::uint16_t number, std::uint32_t generation, std::uint64_t request, Status status,
                           std::span<const std::byte> response) {
    SessionState* s = table.lookup({.number = number, .generation = generation});
    if (s == nullptr)
        return; // the session ended while its handler ran
    if (RequestView& view = s->views[request % s->views.size()]; view.request == request)
        view = {}; // its Request reads nothing from now on
    if (!s->rc.server_slots.empty()) {
        const auto k = static_cast<std::uint32_t>(request % s->rc.server_slots.size());
        RcPath::ServerSlot& slot = s->rc.server_slots[k];
        if (slot.phase == RcPath::ServerSlot::Phase::handling && slot.call == request) {
            slot.phase = RcPath::ServerSlot::Phase::idle;
            if (status == Status::ok && response.size() > rdma_threshold &&
                response.size() <= slot.target.length) {
                slot.response_size = static_cast<std::uint32_t>(response.size());
                slot.response_in_request =
                    slot.request ? offset_within(response, *slot.request) : std::nullopt;
                if (slot.response_in_request) {
                    // the slot's next READ comes only after this WRITE: its call is
                    // taken once the WRITE is complete (hold_until_written)
                    slot.phase = RcPath::ServerSlot::Phase::writing;
                    post_transfer(*s, k);
                    return;
                }
                auto region = staging(transport->pd(), slot.response, response.size(), Access::none, nullptr);
                if (region) {
                    std::memcpy((*region)->data(), response.data(), response.size());
                    ++counters.message_copies;
                    slot.phase = RcPath::ServerSlot::Phase::writing;
                    post_transfer(*s, k);
                    return;
                }
                log_budget.warn(Clock::now(),
                                "rdmaxx rpc: session {}: memory to WRITE a large response from (it goes by UD): {}",
                                s->local.number, region.error());
            }
        }
    }
    send(*s, s->server->respond(request, status, response));
}

// ---------------------------------------------------------------------------------
// The RC path

// Either end of a both-ways session calls over the RC path (their QPs have both roles);
// on a one-way session only the initiator calls.
bool EndpointCore::wants_rdma(const SessionState& s, std::size_t request, std::uint32_t capacity) const noexcept {
    if (s.rc.state == RcPath::State::unavailable || (s.rc.state == RcPath::State::offered && s.rc.offer_expired))
        return false;
    // descriptors travel as the messages (rc_codec.hpp): a session whose limits cannot
    // hold them keeps to UD (the peer may have agreed to any max_request or max_response)
    if (s.limits.max_request < request_descriptor_bytes || s.limits.max_response < response_descriptor_bytes)
        return false;
    // a session both ways does not lend through windows: its QP carries the server's
    // READs and WRITEs (Soft-RoCE stalled a QP mixing binds with wire operations:
    // EndpointOptions::lend_through_windows)
    if (windows && (s.server || !window_room(s)))
        return false;
    const std::uint32_t threshold = rdma_threshold;
    // a small request offers memory for a large response: inline, within the session's limit
    if (request <= threshold && (capacity <= threshold || request_descriptor_bytes + request > s.limits.max_request))
        return false;
    // two calls of the slot abandoned unheard: what they offered waits (RcPath), no more
    return s.rc.client_slots.empty() || s.rc.client_slots[s.client->next_request() % s.calls.size()].abandoned < 2;
}

// The descriptor of a call about to begin in the next slot (its window slot is free):
// a large request copied into the slot's staging memory, memory offered for a large
// response; or the call's MessageBuffers in `lend` themselves (a buffer above the
// threshold is registered for the remote access its use needs). A request the server
// takes whole goes inline, whole, instead of being READ (or sent in UD packets): from
// a lent MessageBuffer, its descriptor in the room in front of its bytes; else copied
// into the slot's staging memory.
Result<EndpointCore::Description> EndpointCore::describe(SessionState& s, std::span<const std::byte> request,
                                                        std::uint32_t capacity, CallBuffers lend) {
    const auto k = static_cast<std::uint32_t>(s.client->next_request() % s.calls.size());
    RcPath::ClientSlot& slot = s.rc.client_slots[k];
    std::vector<MemoryRegion>* retire = slot.abandoned > 0 ? &slot.retired : nullptr;
    const std::size_t inline_size = request_descriptor_bytes + request.size();
    // a request the threshold sends to the RC path is SENT whole when it fits (a READ of
    // it would cost a round trip more); so is one whose descriptor makes it more than a
    // UD packet
    // (not where windows lend: the client's QP then posts binds and revocations only,
    // EndpointOptions::lend_through_windows)
    const bool whole = !windows && s.rc.whole_grant > 0 && inline_size <= s.rc.whole_max &&
                       (request.size() > rdma_threshold || inline_size > s.limits.payload_per_packet);
    RemoteMemory read_from{}, write_into{};
    std::array<Lent, 2> offers{};
    slot.lent = {};
    if (request.size() > rdma_threshold && !whole) {
        if (lend.request != nullptr) {
            const BufferBlock& block = *lend.request->hold_.get();
            read_from = block.region.remote().slice(block.room, request.size());
            offers[0] = {&block.region, block.room};
            slot.lent[0] = lend.request->hold_;
        } else {
            auto region = staging(transport->pd(), slot.request, request.size(), lendable(Access::remote_read), retire);
            if (!region)
                return std::unexpected(std::move(region.error()));
            std::memcpy((*region)->data(), request.data(), request.size());
            ++counters.message_copies;
            read_from = (*region)->remote().slice(0, request.size());
            offers[0] = {*region, 0};
        }
    }
    slot.offered = 0;
    slot.in_place = false;
    if (capacity > rdma_threshold && offers_unheard < rc_offers) {
        if (lend.response != nullptr) {
            const BufferBlock& block = *lend.response->hold_.get();
            write_into = block.region.remote().slice(block.room, capacity);
            offers[1] = {&block.region, block.room};
            slot.lent[1] = lend.response->hold_;
            slot.in_place = true;
        } else {
            auto region = staging(transport->pd(), slot.response, capacity,
                                  Access::local_write | lendable(Access::remote_write), retire);
            if (!region)
                return std::unexpected(std::move(region.error()));
            write_into = (*region)->remote().slice(0, capacity);
            offers[1] = {*region, 0};
        }
        slot.offered = capacity;
    }
    if (windows && (read_from.length > 0 || write_into.length > 0))
        if (auto made = bind_windows(s, k, {&read_from, &write_into}, offers); !made)
            return std::unexpected(std::move(made.error()));
    const auto head = encode_request_head(read_from, write_into);
    if (whole && lend.request != nullptr) {
        // SENT from the buffer itself: the descriptor in the room in front of the request
        std::byte* at = lend.request->hold_.get()->message().data() - head.size();
        std::memcpy(at, head.data(), head.size());
        return Description{.message = {at, inline_size}, .whole = true};
    }
    if (whole) {
        auto region = staging(transport->pd(), slot.whole, header_bytes + inline_size, Access::none,
                              slot.abandoned > 0 || slot.sends > 0 ? &slot.retired : nullptr);
        if (!region)
            return std::unexpected(std::move(region.error()));
        std::byte* at = (*region)->data() + header_bytes;
        std::memcpy(at, head.data(), head.size());
        if (!request.empty())
            std::memcpy(at + head.size(), request.data(), request.size());
        ++counters.message_copies;
        return Description{.message = {at, inline_size}, .whole = true};
    }
    descriptor.assign(head.begin(), head.end());
    if (read_from.length == 0 && !request.empty()) {
        descriptor.insert(descriptor.end(), request.begin(), request.end());
        ++counters.message_copies;
    }
    return Description{.message = descriptor, .whole = false};
}

// A call left its window slot: with an answer from the server (which serves a slot's
// calls in order, so every transfer of the slot's earlier calls is over), or abandoned
// (a transfer of its own may still come).
[[gnu::always_inline]]
void EndpointCore::call_left_slot(SessionState& s, std::uint64_t request, bool heard_from_server) {
    const std::size_t k = request % s.calls.size();
    if (s.rc.client_slots.empty())
        return;
    RcPath::ClientSlot& slot = s.rc.client_slots[k];
    if (heard_from_server) {
        offers_unheard -= std::exchange(slot.offers_unheard, 0);
        slot.abandoned = 0;
        if (!s.rc.windows.empty())
            s.rc.windows[k].retired.clear(); // before the memory they are bound in
        if (slot.sends == 0)
            slot.retired.clear();
        slot.retired_lent.clear();
    } else if (slot.rdma) {
        ++slot.abandoned;
        for (BufferHold& lent : slot.lent)
            if (lent.get() != nullptr)
                slot.retired_lent.push_back(std::move(lent));
        if (std::exchange(s.calls[k].windows_bound, false)) {
            RcPath::SlotWindows& held = s.rc.windows[k];
            for (std::size_t i = 0; i < held.current.size(); ++i)
                if ((slot.bound & (1u << i)) != 0) {
                    held.retired.push_back(std::move(*std::exchange(held.current[i], std::nullopt)));
                    // revoked by its destruction, not by a work request (its bind's
                    // completion may still come)
                    add_window_wrs(s, -1);
                }
            slot.bound = 0;
        }
    }
    slot.lent = {};
    slot.rdma = false;
}

// An abandoned call's MessageBuffers that the NIC may still reach (the server's READ or
// WRITE, a UD send of the request still queued) get new memory: the old memory waits
// for the late transfer, which so never meets the caller's next bytes. A request's
// bytes move with it (a caller may well call again with it).
void EndpointCore::renew_reachable(SessionState& s, const PendingCall& call) {
    const RcPath::ClientSlot* slot =
        s.rc.client_slots.empty() ? nullptr : &s.rc.client_slots[call.request % s.calls.size()];
    const bool sends_queued = call.sending.get() != nullptr && call.sending.get()->holders > 2; // buffer, call, sends
    if (call.buffers.request != nullptr && (sends_queued || (slot != nullptr && slot->lent[0].get() != nullptr)))
        renew(s, *call.buffers.request, true);
    if (call.buffers.response != nullptr && slot != nullptr && slot->lent[1].get() != nullptr)
        renew(s, *call.buffers.response, false);
}

void EndpointCore::renew(SessionState& s, MessageBuffer& buffer, bool keep_bytes) {
    const BufferBlock& old_block = *buffer.hold_.get();
    const MemoryRegion& old = old_block.region;
    auto fresh = MemoryRegion::allocate(transport->pd(), old.size(), old.access(), {.zeroed = !keep_bytes});
    if (!fresh) {
        // The buffer keeps memory a late READ or WRITE may reach: the session's RC QP
        // takes none from now on (a QP in error drops what comes), and the session ends.
        ++counters.renewals_failed;
        if (s.rc.qp)
            if (auto stopped = s.rc.qp->to_error(); !stopped)
                logger()->error("rdmaxx rpc: stopping a session's RC QP: {}", stopped.error());
        end_session_soon(s.local, fmt::format("no new memory for an abandoned call's MessageBuffer: {}",
                                              fresh.error().message()));
        return;
    }
    if (keep_bytes && buffer.size_ > 0)
        std::memcpy(fresh->data() + old_block.room, old_block.message().data(), buffer.size_);
    buffer.hold_ = BufferHold(new BufferBlock(std::move(*fresh), old_block.room));
    ++counters.buffers_renewed;
}

Result<QueuePair> EndpointCore::make_rc_qp(RcRole role, std::uint32_t depth) {
    if (!rc) {
        auto made = RcTransport::create(executor.context(), transport->context(), transport->pd(),
                                        {.depth = rc_cq_depth,
                                         .receives = rc_receives,
                                         .whole_receives = rc_whole_receives,
                                         .whole_bytes = static_cast<std::uint32_t>(header_bytes) + whole_max_message},
                                        options.drive, &EndpointCore::transfer_done, this);
        if (!made)
            return std::unexpected(std::move(made.error()));
        rc = std::move(*made);
    }
    return rc->create_qp(role, depth, transport->port(), transport->gid_index());
}

namespace {

// The role of this end's RC QP on session `s`, and its send queue's depth (a server's
// transfers, at most the window; a client's SENDs, at most the server's grant, itself
// at most the window, or, lending through windows (`windows`, one way only), its window
// binds and revocations, RcPath::window_wrs).
std::pair<RcRole, std::uint32_t> rc_role(const SessionState& s, bool windows) noexcept {
    const std::uint32_t client = windows && !s.server ? window_wrs_per_slot * s.limits.window : s.limits.window;
    if (s.client && s.server)
        return {RcRole::both, s.limits.window + client};
    return s.initiator ? std::pair{RcRole::client, client} : std::pair{RcRole::server, s.limits.window};
}

} // namespace

void EndpointCore::offer_rc(SessionState& s) {
    const auto [role, depth] = rc_role(s, windows);
    auto qp = make_rc_qp(role, depth);
    if (!qp) {
        log_budget.warn(Clock::now(), "rdmaxx rpc: session {}: an RC QP (large messages go by UD): {}", s.local.number,
                        qp.error());
        rc_unavailable(s);
        s.rc.peer_unaware = true;
        return;
    }
    set_rc_qp(s, std::move(*qp));
    s.rc.state = RcPath::State::offered;
    s.rc.offered_at = Clock::now();
    const RcMessage offer{.kind = RcMessage::Kind::offer, .available = true, .qp = s.rc.qp->endpoint()};
    send_message(s, encode(offer));
}

void EndpointCore::send_message(SessionState& s, const std::array<std::byte, rc_message_bytes>& message) {
    s.outbox.push_back(message);
    if (s.control != nullptr)
        start_writer(s);
}

void EndpointCore::start_writer(SessionState& s) {
    if (s.writing || s.outbox.empty())
        return;
    s.writing = true;
    asio::co_spawn(executor, write_messages(anchor, s.local), RethrowOutOfRun{});
}

asio::awaitable<void> EndpointCore::write_messages(Anchor anchor, SessionId id) {
    for (;;) {
        EndpointCore* core = *anchor;
        SessionState* s = core == nullptr ? nullptr : core->table.lookup(id);
        if (s == nullptr)
            co_return;
        if (s->outbox.empty() || s->control == nullptr) {
            s->writing = false;
            co_return;
        }
        const auto message = s->outbox.front();
        s->outbox.pop_front();
        // a failed write ends the session through its watcher's read
        if (const Result<void> written = co_await s->control->write(message); !written)
            co_return;
    }
}

// An RC setup message from the peer: what to answer, or an Error: the peer broke the
// protocol. On a one-way session the initiator offers, once, and the other end answers.
// On a both-ways session the end that first needs the path offers; if both offer at
// once, the initiator's offer wins (the other end drops its own and answers; the
// initiator ignores the other's).
Result<std::optional<std::array<std::byte, rc_message_bytes>>> EndpointCore::take_rc(SessionState& s,
                                                                                     const RcMessage& message) {
    constexpr const char* call = "rpc session";
    const bool both_ways = s.client && s.server;
    const SessionId id = s.local; // rc_ready may end the session (a failed post, a handler)
    std::optional<std::array<std::byte, rc_message_bytes>> reply;
    // an honest peer's RC QPs use its UD QP's port and GID, whose MAC watch() resolved
    // off this thread: another address would make this thread wait for one
    // (blocking.hpp), up to a second each time a peer likes
    const bool has_qp = message.kind == RcMessage::Kind::offer || message.available;
    if (has_qp && (message.qp.gid != s.peer.endpoint.gid || message.qp.lid != s.peer.endpoint.lid))
        return std::unexpected(Error::protocol(call, "an RC QP at another address than the session's UD QP"));
    if (message.kind == RcMessage::Kind::offer) {
        if (s.initiator && !both_ways)
            return std::unexpected(Error::protocol(call, "an RC offer from a server"));
        const bool crossed = both_ways && s.rc.state == RcPath::State::offered;
        if (crossed && s.initiator)
            return std::nullopt; // ours wins: the other end answers it
        if (std::exchange(s.rc.peer_unaware, false))
            return encode(RcMessage{.kind = RcMessage::Kind::answer, .available = false, .qp = {}});
        if (s.rc.state != RcPath::State::none && !crossed)
            return std::unexpected(Error::protocol(call, "a second RC offer"));
        set_rc_qp(s, std::nullopt); // crossed: ours is dropped, its answer will be ignored
        RcMessage answer{.kind = RcMessage::Kind::answer, .available = false, .qp = {}};
        const auto [role, depth] = rc_role(s, windows);
        auto qp = make_rc_qp(role, depth);
        Result<void> up = qp ? qp->connect(message.qp) : std::unexpected(qp.error());
        if (up) {
            set_rc_qp(s, std::move(*qp));
            answer = {.kind = RcMessage::Kind::answer, .available = true, .qp = s.rc.qp->endpoint()};
            if (role == RcRole::server) {
                // receives for the session's whole requests, while the endpoint has them
                s.allow_whole(std::min({s.limits.window, 255u, rc_whole_receives - whole_granted}),
                              std::min(whole_max_message, s.limits.max_request));
                whole_granted += s.rc.whole_grant;
                answer.whole_max = static_cast<std::uint16_t>(s.rc.whole_max);
                answer.whole_receives = static_cast<std::uint8_t>(s.rc.whole_grant);
            }
            rc_ready(s);
        } else {
            log_budget.warn(Clock::now(), "rdmaxx rpc: session {}: no RC QP for the peer (it keeps to UD): {}",
                            s.local.number, up.error());
            rc_unavailable(s);
        }
        reply = encode(answer); // sent if the session lives on (watch)
    } else {
        if (!s.initiator && !both_ways)
            return std::unexpected(Error::protocol(call, "an RC answer from a client"));
        if (s.rc.state != RcPath::State::offered)
            return std::nullopt; // late: the offer crossed the peer's, which won
        if (!message.available) {
            rc_unavailable(s);
        } else if (auto up = s.rc.qp->connect(message.qp); !up && both_ways) {
            // the peer's QP is connected and takes its large calls over the path, which
            // this end could not serve: each would fail. Ended, both ends hear of it.
            end_session(id, fmt::format("connecting its RC QP, which the peer's large calls would use: {}",
                                        up.error().message()));
        } else if (!up) {
            log_budget.warn(Clock::now(), "rdmaxx rpc: session {}: connecting its RC QP (large messages go by UD): {}",
                            s.local.number, up.error());
            rc_unavailable(s);
        } else {
            // the server's receives for whole requests, within what this end sends at all
            // (a hostile answer's sizes bound only what this end sends it)
            s.allow_whole(std::min<std::uint32_t>(message.whole_receives, s.limits.window),
                          std::min({std::uint32_t{message.whole_max}, whole_max_message, s.limits.max_request}));
            rc_ready(s);
        }
    }
    // the calls that waited for the RC path's setup go
    if (SessionState* still = table.lookup(id); still != nullptr && still->client) {
        const auto now = Clock::now();
        begin_queued(*still, now);
        pump(*still, now);
    }
    return reply;
}

// The RC QP is connected: the slots of this end's calls and of the calls it serves;
// the descriptor requests that waited for it are handled (a failed post may end the
// session: `s` is then gone).
void EndpointCore::rc_ready(SessionState& s) {
    s.rc.state = RcPath::State::ready;
    if (s.client) {
        s.rc.client_slots.resize(s.limits.window);
        if (windows)
            s.rc.windows.resize(s.limits.window);
    }
    if (s.server)
        s.rc.server_slots.resize(s.limits.window);
    const SessionId id = s.local;
    const auto waiting = std::exchange(s.rc.waiting, {});
    for (const HandlerCall& call : waiting)
        if (SessionState* still = table.lookup(id))
            handle(*still, call);
}

// The session keeps to UD: the descriptor requests that waited are refused.
void EndpointCore::rc_unavailable(SessionState& s) {
    s.rc.state = RcPath::State::unavailable;
    set_rc_qp(s, std::nullopt);
    for (const HandlerCall& call : std::exchange(s.rc.waiting, {}))
        send(s, s.server->respond(call.request, Status::transfer_failed, {}));
}

// Posts the transfer the server slot's phase calls for (READ the request, WRITE the
// response), or queues it for the budget. False: posting failed and ended the session.
bool EndpointCore::post_transfer(SessionState& s, std::uint32_t k) {
    if (rc_in_flight >= rc_budget) {
        rc_waiting.push_back({.session = s.local, .slot = k});
        return true;
    }
    RcPath::ServerSlot& slot = s.rc.server_slots[k];
    const bool read = slot.phase == RcPath::ServerSlot::Phase::reading;
    const auto op = read ? RcTransport::Op::read : RcTransport::Op::write;
    const LocalSlice local = read                        ? slot.request->slice(0, slot.source.length)
                             : slot.response_in_request ? slot.request->slice(*slot.response_in_request, slot.response_size)
                                                        : slot.response->slice(0, slot.response_size);
    const RemoteMemory remote = read ? slot.source : slot.target.slice(0, slot.response_size);
    const auto window = static_cast<std::uint32_t>(s.rc.server_slots.size());
    const std::uint32_t imm =
        read ? 0 : encode_written({.session = s.remote.number, .slot = k, .round = round_of(slot.call, window)});
    if (auto posted = RcTransport::post(*s.rc.qp, op, local, remote, transfer_id(s.local, k, op), imm); !posted) {
        end_session(s.local, fmt::format("posting an RDMA transfer: {}", posted.error().message()));
        return false;
    }
    ++rc_in_flight;
    ++s.rc.transfers;
    ++(read ? counters.rdma_reads : counters.rdma_writes);
    return true;
}

void EndpointCore::transfer_done(const WorkCompletion& wc) {
    const std::uint64_t id = wc.wr_id();
    if (id == RcTransport::receive_id)
        return take_written(wc);
    if ((id & RcTransport::whole_receive_bit) != 0)
        return take_whole(wc);
    const SessionId session{.number = static_cast<std::uint16_t>(id >> 43),
                            .generation = static_cast<std::uint32_t>(id >> 11)};
    const auto k = static_cast<std::uint32_t>((id >> 1) & 0x3ff);
    if ((id & client_send_bit) != 0)
        return sent_whole(wc, session, k);
    if ((id & (client_bind_bit | client_revoke_bit)) != 0)
        return windows_done(wc, session, k, (id & client_revoke_bit) != 0, chain_wrs(id));
    SessionState* s = table.lookup(session);
    if (s == nullptr || !s->rc.qp || s->rc.qp->qpn() != wc.qp_num())
        return post_waiting(); // a completion of a QP gone with its session
    --rc_in_flight;
    --s->rc.transfers;
    if (!wc.ok()) {
        end_session(session, fmt::format("an RDMA transfer failed: {}", wc.error().message()));
        return post_waiting();
    }
    RcPath::ServerSlot& slot = s->rc.server_slots[k];
    if ((id & 1) == 0) {
        slot.phase = RcPath::ServerSlot::Phase::handling;
        if (handlers[slot.rpc_type])
            run_handler(*s, slot.rpc_type, slot.call, slot.request->bytes().first(slot.source.length));
        else // removed while the request was read (handle() found it)
            respond(s->local.number, s->local.generation, slot.call, Status::no_handler, {});
    } else {
        // the client has the response (its immediate's completion told it): it is the
        // call's answer now, what a resent request gets (the Outgoing is not sent)
        slot.phase = RcPath::ServerSlot::Phase::idle;
        (void)s->server->respond(slot.call, Status::ok, encode_response_descriptor(slot.response_size), true);
        if (slot.next) {
            const PacketHeader next = *std::exchange(slot.next, std::nullopt);
            serve(*s, next, slot.next_payload);
        }
    }
    post_waiting();
}

// The first packet of call r + W, come while the WRITE of call r's response (r: the
// slot's call) is posted or waits for the budget: the client began it on r's immediate,
// before this end polled the WRITE's completion. It is held, and taken at that
// completion: dropped, it would come again only after an RTO. Taken earlier, call r +
// W could be answered before r's WRITE is complete, and a client that had abandoned r
// would free the memory the WRITE still reaches.
bool EndpointCore::hold_until_written(SessionState& s, const PacketHeader& header,
                                      std::span<const std::byte> payload) {
    if (s.rc.server_slots.empty() || header.kind != Kind::request || header.index != 0)
        return false;
    RcPath::ServerSlot& slot = s.rc.server_slots[header.request % s.rc.server_slots.size()];
    if (slot.phase != RcPath::ServerSlot::Phase::writing || header.request != slot.call + s.rc.server_slots.size() ||
        slot.next)
        return false;
    slot.next = header;
    slot.next_payload.assign(payload.begin(), payload.end());
    ++counters.held_for_write;
    return true;
}

// A response WRITTEN to one of this end's calls: its immediate names the call
// (rc_codec.hpp), its byte_len the size. Untrusted: the first completion no honest
// server sends ends the session whose QP it came on (misused). An immediate for a
// call that ended without it (timed out, cancelled, answered by a resent request's
// UD packet first) is dropped, as many as there are such calls (RcPath::late_writes).
void EndpointCore::take_written(const WorkCompletion& wc) {
    if (!wc.ok())
        return rc_receive_failed(wc);
    const auto imm = wc.imm();
    if (!imm)
        return misused(wc, DropReason::wrong_kind, "a SEND into a client's receive");
    const WrittenResponse written = decode_written(*imm);
    SessionState* s = table.current(written.session);
    if (s == nullptr || !s->client || !s->rc.qp || s->rc.qp->qpn() != wc.qp_num())
        return misused(wc, DropReason::stale_session, "an immediate naming another session");
    const auto window = static_cast<std::uint32_t>(s->calls.size());
    if (written.slot >= window)
        return misused(wc, DropReason::too_far_ahead, "an immediate naming a slot past the window");
    PendingCall& call = s->calls[written.slot];
    const bool in_progress = call.busy && call.may_be_written && round_of(call.request, window) == written.round;
    const auto descriptor = encode_response_descriptor(wc.byte_len());
    const auto now = Clock::now();
    const auto end = in_progress ? s->client->written(call.request, descriptor, now)
                                 : std::unexpected(DropReason::stale_request);
    if (!end) {
        if (s->rc.late_writes == 0)
            return misused(wc, end.error(), "an immediate naming no call that could still get one");
        --s->rc.late_writes;
        return drop(end.error());
    }
    call.may_be_written = false; // this is its immediate
    end_call(*s, *end);
    begin_queued(*s, now);
    pump(*s, now);
}

// A whole request's SEND is complete: the slot's staging memory is this end's again
// once no SEND of the slot may read it (and the server is past what an abandoned call
// offered: abandoned). A failed SEND ends the session, as a failed transfer does.
void EndpointCore::sent_whole(const WorkCompletion& wc, SessionId session, std::uint32_t k) {
    SessionState* s = table.lookup(session);
    if (s == nullptr || !s->rc.qp || s->rc.qp->qpn() != wc.qp_num())
        return; // a QP gone with its session (whose end settled the counts)
    --sends_in_flight;
    --s->rc.sends;
    RcPath::ClientSlot& slot = s->rc.client_slots[k];
    if (!wc.ok())
        return end_session(session, fmt::format("a whole request's SEND failed: {}", wc.error().message()));
    if (--slot.sends == 0) {
        slot.sending.clear();
        if (slot.abandoned == 0)
            slot.retired.clear();
        // every SEND of the slot is complete, its call's own among them if it posted
        // one: the server has the request, an RTO asks by a probe
        if (const PendingCall& call = s->calls[k]; call.busy && call.whole_posted)
            s->client->delivered(call.request);
    }
}

namespace {

// `n` window binds or revocations posted on the session's QP (RcPath::window_posted).
void window_wrs_posted(RcPath& rc, std::size_t n) {
    if (rc.window_posted == 0)
        rc.window_progress_at = Clock::now();
    rc.window_posted += static_cast<std::uint32_t>(n);
}

} // namespace

Result<void> EndpointCore::bind_windows(SessionState& s, std::uint32_t k, std::array<RemoteMemory*, 2> keys,
                                       const std::array<Lent, 2>& lent) {
    RcPath::ClientSlot& slot = s.rc.client_slots[k];
    std::array<std::optional<MemoryWindow>, 2>& held = s.rc.windows[k].current;
    // every window the call needs is made before any is bound: a failure here leaves
    // the slot with none bound, and the call goes by UD
    for (std::size_t i = 0; i < keys.size(); ++i) {
        if (keys[i]->length == 0 || held[i])
            continue;
        auto made = MemoryWindow::allocate(transport->pd());
        if (!made)
            return std::unexpected(std::move(made.error()));
        held[i].emplace(std::move(*made));
    }
    // one chain, the last bind signaled; each names the chain (an unsignaled WR that
    // fails completes too)
    const std::size_t n = std::ranges::count_if(keys, [](const RemoteMemory* key) { return key->length > 0; });
    const std::uint64_t id = client_id(s.local, k, client_bind_bit, n);
    SendBatch<2> binds(*s.rc.qp);
    std::array<std::size_t, 2> window_of{}; // the window bind j binds
    for (std::size_t i = 0; i < keys.size(); ++i) {
        if (keys[i]->length == 0)
            continue;
        const Access rights = i == 0 ? Access::remote_read : Access::remote_write;
        window_of[binds.size()] = i;
        binds.bind(*held[i], *lent[i].region, lent[i].offset, keys[i]->length, rights,
                   {.wr_id = id, .signaled = binds.size() + 1 == n});
    }
    const auto posted = binds.post();
    ++counters.window_posts;
    for (std::size_t j = 0; j < binds.accepted(); ++j) {
        slot.bound |= static_cast<std::uint8_t>(1u << window_of[j]);
        *keys[window_of[j]] = binds.bound(j);
    }
    if (binds.accepted() > 0)
        ++slot.bind_chains;
    window_wrs_posted(s.rc, binds.accepted());
    add_window_wrs(s, 2 * static_cast<std::int32_t>(binds.accepted())); // the binds, and the revocations they will need
    if (!posted) {
        end_session_soon(s.local, fmt::format("binding a call's memory window: {}", posted.error().message()));
        return std::unexpected(posted.error());
    }
    return {};
}

bool EndpointCore::window_room(const SessionState& s) const noexcept {
    return s.rc.window_wrs + window_wrs_per_slot <= window_wrs_per_slot * s.limits.window &&
           window_wrs + window_wrs_per_slot <= rc_window_wrs;
}

void EndpointCore::revoke_windows(SessionState& s, const PendingCall& call) {
    const auto k = static_cast<std::uint32_t>(call.request % s.calls.size());
    const RcPath::ClientSlot& slot = s.rc.client_slots[k];
    const auto n = static_cast<std::size_t>(std::popcount(slot.bound)); // one chain, as the binds
    const std::uint64_t id = client_id(s.local, k, client_revoke_bit, n);
    SendBatch<2> revocations(*s.rc.qp);
    for (std::size_t i = 0; i < s.rc.windows[k].current.size(); ++i)
        if ((slot.bound & (1u << i)) != 0)
            revocations.invalidate(*s.rc.windows[k].current[i],
                                   {.wr_id = id, .signaled = revocations.size() + 1 == n});
    const auto posted = revocations.post();
    ++counters.window_posts;
    window_wrs_posted(s.rc, revocations.accepted());
    if (!posted) {
        // the send queue has room for them (window_wrs): the QP is broken. The call
        // keeps its answer until the session ends, which destroys the windows before
        // it finishes the call (end_session)
        end_session_soon(s.local, fmt::format("revoking a call's memory window: {}", posted.error().message()));
    }
}

// A call's windows are bound (its packets may go) or revoked (it finishes). A failed
// bind or revocation ends the session, as a failed transfer does.
void EndpointCore::windows_done(const WorkCompletion& wc, SessionId session, std::uint32_t k, bool revoked,
                                std::uint32_t wrs) {
    SessionState* s = table.lookup(session);
    if (s == nullptr || !s->rc.qp || s->rc.qp->qpn() != wc.qp_num())
        return; // a QP gone with its session (whose end settled the counts)
    if (!wc.ok())
        return end_session(session, fmt::format("{} a call's memory window failed: {}",
                                                revoked ? "revoking" : "binding", wc.error().message()));
    add_window_wrs(*s, -static_cast<std::int32_t>(wrs));
    s->rc.window_posted -= wrs;
    const auto now = Clock::now();
    s->rc.window_progress_at = now;
    if (revoked) {
        if (!s->calls[k].revoking)
            return; // not one whose answer is held: the session is ending
        // one chain revoked every window of the slot (if its post failed partway, the
        // session is ending: end_session finishes the call)
        s->rc.client_slots[k].bound = 0;
        PendingCall& call = s->calls[k];
        finish(call, *s, std::move(*call.revoking));
        begin_queued(*s, now);
    } else if (--s->rc.client_slots[k].bind_chains == 0) {
        s->client->resume(k); // the slot's call, held if it began with binds in flight
    }
    pump(*s, now);
}

// A whole request SENT into one of this end's receive buffers (the transport posts it
// again once this returns: what the handler keeps, the window copies). Untrusted as
// any packet, and it must come over its session's RC QP.
// An honest client SENDs only well-formed whole requests of its own session: the first
// other receive ends the session whose QP it came on (misused).
void EndpointCore::take_whole(const WorkCompletion& wc) {
    if (!wc.ok())
        return rc_receive_failed(wc);
    if (wc.imm())
        return misused(wc, DropReason::wrong_kind, "a WRITE with an immediate into a server's receive");
    const auto packet = rc->received(wc);
    const auto to = addressed(packet);
    if (!to)
        return misused(wc, std::nullopt, "a malformed whole request, or one naming no session");
    SessionState* s = to->session;
    const PacketHeader* header = &to->header;
    if (!s->rc.qp || s->rc.qp->qpn() != wc.qp_num())
        return misused(wc, DropReason::wrong_source, "a whole request naming another session");
    if (!s->server || header->kind != Kind::request || !header->whole || header->probe)
        return misused(wc, DropReason::wrong_kind, "a SEND other than a whole request");
    serve(*s, *header, packet.subspan(header_bytes));
}

void EndpointCore::set_rc_qp(SessionState& s, std::optional<QueuePair> qp) {
    if (s.rc.qp)
        rc_qps.erase(s.rc.qp->qpn());
    s.rc.windows.clear(); // before the QP they are bound through (RcPath::windows)
    s.rc.qp = std::move(qp);
    for (std::size_t k = 0; k < s.rc.client_slots.size(); ++k) // a new QP's binds are its own
        if (std::exchange(s.rc.client_slots[k].bind_chains, 0) > 0)
            s.client->resume(k);
    s.rc.window_posted = 0;
    add_window_wrs(s, -static_cast<std::int32_t>(s.rc.window_wrs));
    if (s.rc.qp)
        rc_qps[s.rc.qp->qpn()] = s.local;
}

SessionState* EndpointCore::rc_session(std::uint32_t qpn) {
    const auto it = rc_qps.find(qpn);
    return it == rc_qps.end() ? nullptr : table.lookup(it->second);
}

void EndpointCore::misused(const WorkCompletion& wc, std::optional<DropReason> reason, std::string_view what) {
    if (reason)
        drop(*reason);
    SessionState* s = rc_session(wc.qp_num());
    if (s == nullptr)
        return; // a QP gone with its session: its late completion
    ++counters.rc_misuses;
    const std::string why = fmt::format("its peer misused the RC QP: {}", what);
    log_budget.warn(Clock::now(), "rdmaxx rpc: session {}: {}", s->local.number, why);
    end_session(s->local, why);
}

// A receive of the RC path failed: the QP it was consumed on broke (a peer's SEND
// larger than the buffer, or into a zero-byte receive; a QP that failed mid-WRITE) and
// carries nothing more. Its session ends now, not at its next transfer or when its
// control connection closes (found by its QP's number; a peer that breaks its QP on
// purpose must set up a session again).
void EndpointCore::rc_receive_failed(const WorkCompletion& wc) {
    if (const SessionState* s = rc_session(wc.qp_num())) {
        const std::string why = fmt::format("a receive of its RC QP failed: {}", wc.error().message());
        log_budget.warn(Clock::now(), "rdmaxx rpc: session {}: {}", s->local.number, why);
        end_session(s->local, why);
    }
}

void EndpointCore::post_waiting() {
    while (rc_in_flight < rc_budget && !rc_waiting.empty()) {
        const WaitingTransfer next = rc_waiting.front();
        rc_waiting.pop_front();
        if (SessionState* s = table.lookup(next.session))
            post_transfer(*s, next.slot);
    }
}

// ---------------------------------------------------------------------------------
// Sessions

SessionState& EndpointCore::attach(SessionId local, const SessionId& remote, const UdAddress& peer, AddressHandle ah,
                                   const SessionLimits& limits, bool initiator, bool both_ways) {
    const Route route{.local = local, .remote = remote};
    SessionState state{.initiator = initiator,
                       .local = local,
                       .remote = remote,
                       .peer = peer,
                       .source = transport->source_of(peer),
                       .ah = std::move(ah),
                       .limits = limits,
                       .packets = PacketLimits(std::max(limits.max_request, limits.max_response),
                                               limits.payload_per_packet),
                       .client = {},
                       .server = {},
                       .calls = {},
                       .views = {},
                       .queued = {},
                       .in_flight = 0,
                       .active = false,
                       .control = nullptr,
                       .outbox = {},
                       .writing = false,
                       .closers = {},
                       .goodbye_sent = false,
                       .peer_closing = false,
                       .still_here = nullptr,
                       .congestion = {},
                       .rc = {}};
    if (initiator || both_ways) {
        if (options.congestion)
            state.congestion = options.congestion();
        state.client.emplace(ClientOptions{.window = limits.window,
                                           .credits = limits.credits,
                                           .rto = {},
                                           .congestion = state.congestion.get(),
                                           .credit_stalls = &counters.credit_stalls},
                             PacketLimits(limits.max_request, limits.payload_per_packet), route);
        state.calls.resize(limits.window);
    }
    if (!initiator || both_ways) {
        state.server.emplace(limits.window, PacketLimits(limits.max_response, limits.payload_per_packet), route,
                             &counters.request_copies);
        // agree() and check_reply() keep a session's limits within what this end asked
        require(limits.window <= options.window, std::source_location::current(),
                "a session's window of {} beyond its endpoint's {}", limits.window, options.window);
        std::unique_ptr<RequestView[]>& views = request_views[local.number];
        if (!views)
            views = std::make_unique<RequestView[]>(options.window);
        state.views = std::span(views.get(), limits.window);
    }
    return table.attach(local, std::move(state));
}

void EndpointCore::end_session(SessionId id, std::string_view why) {
    SessionState* s = table.lookup(id);
    if (s == nullptr)
        return;
    for (PendingCall& call : s->calls)
        if (call.busy) {
            renew_reachable(*s, call);
            // its windows are destroyed below, before its completion runs (posted): a
            // call whose windows were being revoked gets the answer it had
            call.windows_bound = false;
            finish(call, *s,
                   call.revoking ? std::move(*call.revoking)
                                 : std::unexpected(call_error(ECONNRESET, std::string(why))));
        }
    fail_queued(*s, why);
    if (s->control != nullptr)
        s->control->close();
    for (asio::steady_timer* closer : s->closers)
        closer->cancel();
    if (s->still_here != nullptr)
        s->still_here->cancel();
    rc_in_flight -= s->rc.transfers; // their completions, if they come, are a dead QP's
    const bool budget_freed = s->rc.transfers > 0;
    sends_in_flight -= s->rc.sends;
    whole_granted -= s->rc.whole_grant;
    for (const RcPath::ClientSlot& slot : s->rc.client_slots) // nothing comes to a QP destroyed
        offers_unheard -= slot.offers_unheard;
    set_rc_qp(*s, std::nullopt); // before the memory it reaches, as RcPath's own order has it
    std::ranges::fill(s->views, RequestView{}); // its handlers' Requests read nothing from now on
    table.release(id);
    // other sessions' transfers waiting for the budget go now: no completion of this
    // session's may come to start them (a destroyed QP need not flush its work). Posted,
    // not run here: end_session runs inside post_waiting's own loop, and the destructor's
    if (budget_freed && !rc_waiting.empty())
        asio::post(executor, [anchor = anchor] {
            if (EndpointCore* core = *anchor)
                core->post_waiting();
        });
}

void EndpointCore::fail_queued(SessionState& s, std::string_view why) {
    for (QueuedCall& queued : std::exchange(s.queued, {}))
        fail(std::move(queued.handler), call_error(ECONNRESET, std::string(why)));
}

void EndpointCore::calls_finished(SessionState& s) {
    if (s.peer_closing)
        return end_session(s.local, "the peer closed the session");
    for (asio::steady_timer* closer : s.closers)
        closer->cancel();
}

// Session::close(): no call begins from now on; once those begun or queued have
// finished (each with its own result), a goodbye tells the peer, which finishes its own
// calls through the session and closes the TCP connection: the session ends. What is
// left at the deadline ends as a destroyed Session's would. A second close() of the
// session waits for the same end (with its own deadline).
asio::awaitable<Result<void>> EndpointCore::close(Anchor anchor, SessionId id, std::chrono::milliseconds timeout) {
    constexpr const char* call = "rpc::Session::close";
    EndpointCore* core = *anchor;
    SessionState* s = core->table.lookup(id);
    if (s == nullptr)
        co_return Result<void>{}; // ended already
    asio::steady_timer timer(core->executor, deadline_after(Clock::now(), timeout));
    s->closers.push_back(&timer);
    struct Unregister { // the frame may be destroyed at a suspension (the io_context's end)
        const Anchor& anchor;
        SessionId id;
        asio::steady_timer* timer;
        ~Unregister() {
            if (EndpointCore* core = *anchor)
                if (SessionState* s = core->table.lookup(id))
                    std::erase(s->closers, timer);
        }
    } unregister{anchor, id, &timer};
    for (;;) {
        // nothing has suspended since `s` was found
        if (s->calls_done() && !s->goodbye_sent) {
            s->goodbye_sent = true;
            const RcMessage goodbye{.kind = RcMessage::Kind::goodbye, .available = false, .qp = {}};
            core->send_message(*s, encode(goodbye));
        }
        const auto [ec] = co_await timer.async_wait(no_throw); // cancelled: a wake (or a cancellation)
        const auto cancelled = (co_await asio::this_coro::cancellation_state).cancelled();
        if ((core = *anchor) == nullptr)
            co_return std::unexpected(Error::cancelled(call, "the endpoint was destroyed"));
        if (cancelled != asio::cancellation_type::none) {
            core->end_session(id, "its close() was cancelled");
            co_return std::unexpected(Error::cancelled(call));
        }
        if ((s = core->table.lookup(id)) == nullptr)
            co_return Result<void>{}; // ended (a wait that expired as it ended included)
        if (!ec) {
            const bool said = s->goodbye_sent;
            core->end_session(id, fmt::format("it was closed, and {} ms passed before {}", timeout.count(),
                                              said ? "the peer's end" : "its calls finished"));
            co_return std::unexpected(
                Error::timeout(call, said ? "the peer did not end the session in time" : "its calls did not finish in time"));
        }
    }
}

// Endpoint::shutdown(): every live session closes at once, each as Session::close (one
// closing already too: the close joins its end); the listener refuses setups meanwhile,
// then closes.
asio::awaitable<Result<void>> EndpointCore::shutdown(Anchor anchor, std::chrono::milliseconds timeout) {
    struct Closes {
        std::size_t left = 0;
        std::optional<Error> first_error;
        asio::steady_timer* waiter = nullptr;
    };
    EndpointCore* core = *anchor;
    core->shutting_down = true;
    const auto closes = std::make_shared<Closes>();
    for (const SessionId id : core->table.live()) {
        ++closes->left;
        asio::co_spawn(core->executor, close(anchor, id, timeout),
                       [closes](std::exception_ptr e, Result<void> closed) {
                           if (e)
                               std::rethrow_exception(e); // out of run(), as RethrowOutOfRun
                           if (!closed && !closes->first_error)
                               closes->first_error = std::move(closed.error());
                           if (--closes->left == 0 && closes->waiter != nullptr)
                               closes->waiter->cancel();
                       });
    }
    if (closes->left > 0) { // each close() ends within `timeout`: this wait with it
        asio::steady_timer waiter(core->executor, asio::steady_timer::time_point::max());
        closes->waiter = &waiter;
        co_await waiter.async_wait(no_throw);
        closes->waiter = nullptr;
        if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) {
            if ((core = *anchor) != nullptr) // the closes end at once, and so does this
                for (const SessionId id : core->table.live())
                    core->end_session(id, "the endpoint's shutdown() was cancelled");
            co_return std::unexpected(Error::cancelled("rpc::Endpoint::shutdown"));
        }
    }
    if ((core = *anchor) != nullptr && core->listener)
        core->listener->close();
    if (closes->first_error)
        co_return std::unexpected(std::move(*closes->first_error));
    co_return Result<void>{};
}

namespace {

// The control connection a session's watcher owns, known to the session while both live.
struct ChannelRegistration {
    Anchor anchor;
    SessionId id;
    ControlChannel* channel;
    bool registered = false; // false: the session had ended (or the endpoint gone) already
    ChannelRegistration(Anchor a, SessionId i, ControlChannel* c) : anchor(std::move(a)), id(i), channel(c) {
        if (EndpointCore* core = *anchor)
            if (SessionState* s = core->table.lookup(id)) {
                s->control = channel;
                registered = true;
            }
    }
    ChannelRegistration(const ChannelRegistration&) = delete;
    ChannelRegistration& operator=(const ChannelRegistration&) = delete;
    ~ChannelRegistration() {
        if (EndpointCore* core = *anchor)
            if (SessionState* s = core->table.lookup(id); s != nullptr && s->control == channel)
                s->control = nullptr;
    }
};

// A session message from `channel`: its prefix, then the rest it announces, by
// `deadline`. Errors: the channel's, and the prefix's (protocol).
template <class DecodePrefix>
asio::awaitable<Result<std::vector<std::byte>>> read_message(ControlChannel& channel, Deadline deadline,
                                                             DecodePrefix decode_prefix, std::uint16_t* version) {
    std::vector<std::byte> bytes(session_prefix_bytes);
    if (Result<void> got = co_await channel.read(bytes, deadline); !got)
        co_return std::unexpected(std::move(got.error()));
    const auto prefix = decode_prefix(std::span<const std::byte, session_prefix_bytes>(bytes.data(), session_prefix_bytes));
    if (!prefix)
        co_return std::unexpected(prefix.error());
    *version = prefix->version;
    bytes.resize(prefix->length);
    if (Result<void> got = co_await channel.read(std::span(bytes).subspan(session_prefix_bytes), deadline); !got)
        co_return std::unexpected(std::move(got.error()));
    co_return bytes;
}

} // namespace

asio::awaitable<void> EndpointCore::say_still_here(Anchor anchor, SessionId id) {
    asio::steady_timer timer((*anchor)->executor);
    for (;;) {
        EndpointCore* core = *anchor;
        SessionState* s = core == nullptr ? nullptr : core->table.lookup(id);
        if (s == nullptr)
            co_return;
        if (s->outbox.empty() && !s->writing) // else the message on its way says as much
            core->send_message(*s, encode(RcMessage{.kind = RcMessage::Kind::still_here, .available = false}));
        s->still_here = &timer;
        timer.expires_after(core->options.peer_silence / 3);
        co_await timer.async_wait(no_throw);
        if ((core = *anchor) == nullptr || (s = core->table.lookup(id)) == nullptr)
            co_return; // ended (end_session cancelled the wait), or the endpoint gone
        s->still_here = nullptr;
    }
}

// Until its control connection ends, then the session ends. The RC setup, the goodbye
// and the still-here (rc_codec.hpp) are all that may follow the session's setup on it:
// anything else breaks the session. Over RDMA CM, a peer silent for peer_silence ends
// it too.
asio::awaitable<void> EndpointCore::watch(Anchor anchor, SessionId id, ControlChannel channel) {
    const ChannelRegistration registration(anchor, id, &channel);
    if (!registration.registered)
        co_return; // the session ended before its watch began: the connection closes here
    (*anchor)->start_writer(*(*anchor)->table.lookup(id)); // what was sent before the watch began
    const bool heartbeat = !channel.over_tcp(); // TCP: the keepalive of watch_peer()
    const auto silence = (*anchor)->options.peer_silence;
    if (heartbeat)
        asio::co_spawn((*anchor)->executor, say_still_here(anchor, id), RethrowOutOfRun{});
    std::string why;
    // the peer's close (ECONNRESET) as its words; its silence as such; anything else (the
    // port gone down, a failed completion) as the connection said it
    const auto ended_by = [silence](const Error& e) {
        if (e.is_errno(ECONNRESET))
            return std::string("the peer closed the session (its control connection ended)");
        if (e.is_timeout())
            return fmt::format("the peer was silent for {} ms (EndpointOptions::peer_silence)", silence.count());
        return fmt::format("its control connection failed: {}", e.message());
    };
    for (;;) {
        const Deadline silent_by = heartbeat ? deadline_after(Clock::now(), silence) : no_deadline;
        std::array<std::byte, rc_message_bytes> bytes{};
        if (Result<void> got = co_await channel.read(std::span(bytes).first<rc_prefix_bytes>(), silent_by); !got) {
            why = ended_by(got.error());
            break;
        }
        if (auto prefix = decode_rc_prefix(std::span(bytes).first<rc_prefix_bytes>()); !prefix) {
            why = fmt::format("the peer broke the session's protocol: {}", prefix.error().message());
            break;
        }
        if (Result<void> got = co_await channel.read(std::span(bytes).subspan<rc_prefix_bytes>(), silent_by); !got) {
            why = ended_by(got.error());
            break;
        }
        EndpointCore* core = *anchor;
        if (core == nullptr)
            co_return;
        SessionState* s = core->table.lookup(id);
        if (s == nullptr || s->control != &channel)
            co_return;
        const auto message = decode_rc(bytes);
        if (!message) {
            why = fmt::format("the peer broke the session's protocol: {}", message.error().message());
            break;
        }
        if (message->kind == RcMessage::Kind::still_here)
            continue;
        if (message->kind == RcMessage::Kind::goodbye) {
            // its calls have finished; this end's in flight finish first (tick() ends the
            // session), and those waiting for a slot never begin
            s->peer_closing = true;
            core->fail_queued(*s, "the peer is closing the session");
            if (s->calls_done()) {
                why = "the peer closed the session";
                break;
            }
            continue;
        }
        // take_rc connects an RC QP towards the peer's UD address, only: its MAC, known
        // since the setup, is resolved again here, off this thread (the kernel may have
        // dropped it since: then RTR would wait for it, up to a second), at a peer's turn
        // (one a session: a second offer is a protocol error)
        if (message->kind == RcMessage::Kind::offer || message->available) {
            const UdAddress peer = s->peer;
            const std::string lane = channel.peer_host();
            const auto resolved = co_await peer_handle(anchor, peer, lane, Deadline::max());
            core = *anchor;
            if (core == nullptr || !resolved) // no turn: the endpoint went
                co_return;
            s = core->table.lookup(id);
            if (s == nullptr || s->control != &channel)
                co_return;
            if (!*resolved) {
                why = fmt::format("the peer's address no longer resolves: {}", resolved->error().message());
                break;
            }
        }
        const auto answer = core->take_rc(*s, *message);
        if (!answer) {
            why = fmt::format("the peer broke the session's protocol: {}", answer.error().message());
            break;
        }
        if (*answer)
            if (SessionState* still = core->table.lookup(id)) // take_rc may have ended it
                core->send_message(*still, **answer);
    }
    EndpointCore* core = *anchor;
    if (core == nullptr)
        co_return;
    if (SessionState* s = core->table.lookup(id); s != nullptr && s->control == &channel)
        core->end_session(id, why);
}

namespace {

// A setup under way, until its reply is out (or it failed): its control connection in
// `setting_up` (the endpoint's destruction closes it), and a listener's in
// `listener_setups` (put there by accept_loop, `at`).
class SetupUnderWay {
public:
    using Place = std::list<ListenerSetup>::iterator;
    SetupUnderWay(const Anchor& anchor, ControlChannel& channel, std::optional<Place> at)
        : anchor_(anchor), channel_(&channel), at_(at) {
        (*anchor_)->setting_up.push_back(channel_);
        if (at_)
            (*at_)->channel = channel_;
    }
    SetupUnderWay(const SetupUnderWay&) = delete;
    SetupUnderWay& operator=(const SetupUnderWay&) = delete;
    ~SetupUnderWay() { end(); }
    // A listener's setup: its place, to wait for its turn in (peer_handle).
    ListenerSetup* place() const noexcept { return at_ ? &**at_ : nullptr; }
    // The client's request came (or the read failed): no longer a silent client's.
    // False when the listener closed it meanwhile to make room (evicted: perhaps after
    // the read completed, before its coroutine resumed), or the endpoint is gone.
    bool heard() {
        EndpointCore* core = *anchor_;
        if (core == nullptr || channel_ == nullptr)
            return false;
        if (!at_)
            return true;
        (*at_)->heard = true;
        return !(*at_)->evicted;
    }
    // Before the connection moves on to the session's watcher.
    void end() {
        EndpointCore* core = *anchor_;
        if (core == nullptr || channel_ == nullptr)
            return;
        std::erase(core->setting_up, std::exchange(channel_, nullptr));
        if (!at_)
            return;
        if (!(*at_)->evicted) {
            core->setup_shares.remove((*at_)->host);
            --core->setups;
        }
        core->listener_setups.erase(*std::exchange(at_, std::nullopt));
    }

private:
    const Anchor& anchor_;
    ControlChannel* channel_;
    std::optional<Place> at_;
};

} // namespace

bool EndpointCore::make_setup_room(const std::string& host) {
    if (setups < options.max_sessions)
        return true;
    const auto yielding = setup_shares.yielding_to(host);
    const auto first = [&](auto pick) { return std::find_if(listener_setups.begin(), listener_setups.end(), pick); };
    auto it = listener_setups.end();
    if (yielding)
        it = first([&](const ListenerSetup& s) { return s.host == *yielding && s.can_go(); });
    if (it == listener_setups.end()) // a client of its own behind its silent ones
        it = first([&](const ListenerSetup& s) { return s.host == host && !s.heard && s.can_go(); });
    if (it == listener_setups.end())
        return false; // as many setups as sessions, each past its request or its turn
    // it gives its place back as its serve_setup ends: its read, or its turn's wait,
    // ends cancelled
    it->evicted = true;
    setup_shares.remove(it->host);
    --setups;
    ++counters.setups_evicted;
    if (it->turn != nullptr)
        it->turn->cancel();
    else if (it->channel != nullptr)
        it->channel->close();
    return true;
}

asio::awaitable<void> EndpointCore::accept_loop(Anchor anchor, std::shared_ptr<ControlListener> listener) {
    for (;;) {
        Result<ControlChannel> channel = co_await listener->accept();
        EndpointCore* core = *anchor;
        if (core == nullptr || !listener->is_open())
            co_return;
        if (!channel) {
            core->log_budget.warn(Clock::now(), "rdmaxx rpc: accepting a session: {}", channel.error());
            continue;
        }
        std::string host = channel->peer_host();
        if (!core->make_setup_room(host)) {
            ++core->counters.sessions_refused;
            continue; // closed
        }
        // counted here, not as serve_setup starts: the next accept sees it
        core->setup_shares.add(host);
        ++core->setups;
        core->listener_setups.push_back({.host = std::move(host)});
        const auto at = std::prev(core->listener_setups.end());
        asio::co_spawn(core->executor, serve_setup(anchor, std::move(*channel), at), RethrowOutOfRun{});
    }
}

// One client's setup, beside the listener (a silent client stalls nobody), then its
// session's life.
asio::awaitable<void> EndpointCore::serve_setup(Anchor anchor, ControlChannel channel,
                                                std::list<ListenerSetup>::iterator at) {
    if (*anchor == nullptr) // the endpoint went before this began, its setups with it
        co_return;
    SetupUnderWay under_way(anchor, channel, at);
    if (at->evicted) // before this began
        co_return;
    channel.watch_peer((*anchor)->options.peer_silence);
    const Deadline deadline = deadline_after(Clock::now(), (*anchor)->options.setup_timeout);
    std::uint16_t version = 0;
    const Result<std::vector<std::byte>> bytes = co_await read_message(channel, deadline, decode_request_prefix, &version);
    const bool still_ours = under_way.heard();
    EndpointCore* core = *anchor;
    if (core == nullptr || !bytes || !still_ours)
        co_return; // closed: a silent, malformed or evicted client
    std::optional<Admitted> admitted;
    bool both_ways = false; // as admitted: an accept handler set while the reply goes changes nothing
    SessionReply reply = SessionReply::refused(Refusal::version_unsupported);
    if (version == session_version) {
        const auto request = decode_request(*bytes);
        if (!request)
            co_return;
        both_ways = static_cast<bool>(core->accept_handler);
        const std::string lane = channel.peer_host(); // its turn at the helpers is its host's (PeerTurn)
        const auto admission = core->shutting_down
                                   ? std::expected<Admitted, Refusal>(std::unexpected(Refusal::shutting_down))
                                   : core->table.admit(*request, core->most(), both_ways);
        // the client's word: a wait for its MAC (blocking.hpp), off this thread
        if (!admission) {
            reply = SessionReply::refused(admission.error());
        } else if (auto ah = co_await peer_handle(anchor, request->client, lane, deadline, under_way.place());
                   (core = *anchor) == nullptr) {
            co_return; // the endpoint is gone, its table with the admission
        } else if (!ah || !*ah) { // no turn at the helpers before the setup's deadline, or no handle
            core->table.release(admission->session);
            if (ah)
                core->log_budget.warn(Clock::now(), "rdmaxx rpc: a session's address handle: {}", ah->error());
            co_return;
        } else if (core->shutting_down) { // since the admission: its shutdown() has passed the live sessions
            core->table.release(admission->session);
            reply = SessionReply::refused(Refusal::shutting_down);
        } else {
            admitted = *admission;
            core->attach(admission->session, request->session, request->client, std::move(**ah), admission->limits,
                         false, both_ways);
            reply = {.refusal = {},
                     .server = core->transport->address(),
                     .session = admission->session,
                     .limits = admission->limits,
                     .both_ways = both_ways};
        }
    }
    if (!admitted)
        ++core->counters.sessions_refused;
    const auto out = encode(reply);
    const ChannelRegistration registration(anchor, admitted ? admitted->session : SessionId{}, &channel);
    if (admitted) // the reply is the connection's write until it is out: messages queue behind it (watch() sends them)
        core->table.lookup(admitted->session)->writing = true;
    const Result<void> written = co_await channel.write(out, deadline);
    core = *anchor;
    if (core == nullptr || !admitted)
        co_return;
    if (SessionState* s = core->table.lookup(admitted->session))
        s->writing = false;
    if (!written) {
        core->end_session(admitted->session,
                          fmt::format("the client left during the setup: {}", written.error().message()));
        co_return;
    }
    under_way.end();
    // the server's handle, where the session was set up both ways (the handler now set,
    // if any: one cleared meanwhile leaves the session without a server's handle)
    if (const auto accept = core->accept_handler; accept && both_ways) {
        ++core->handles;
        (*accept)(Session(core, admitted->session.number, admitted->session.generation)); // it may replace itself
    }
    co_await watch(anchor, admitted->session, std::move(channel));
}

asio::awaitable<Result<Session>> EndpointCore::connect(Anchor anchor, std::string host, std::uint16_t port,
                                                      std::chrono::milliseconds timeout) {
    constexpr const char* call = "rpc::Endpoint::connect";
    EndpointCore* core = *anchor;
    const SessionLimits asked = core->most();
    // room for a both-ways session; what the server does not use goes back
    const auto reserved = core->table.reserve(2 * asked.credits);
    if (!reserved)
        co_return std::unexpected(
            Error::from_errno(call, EAGAIN, fmt::format("this endpoint: {}", to_string(reserved.error()))));
    const SessionId id = *reserved;
    // the reservation goes back on every way out but success
    struct Reservation {
        Anchor anchor;
        SessionId id;
        bool kept = false;
        ~Reservation() {
            if (EndpointCore* c = *anchor; c != nullptr && !kept && c->table.lookup(id) == nullptr)
                c->table.release(id);
        }
    } reservation{anchor, id};

    const std::string peer = fmt::format("{}:{}", host, port);
    const Deadline deadline = deadline_after(Clock::now(), timeout);
    auto channel = co_await ControlChannel::connect(core->executor, core->options.session_transport, std::move(host),
                                                    port, deadline, call, core->cm_sibling);
    if (*anchor == nullptr)
        co_return std::unexpected(Error::cancelled(call, "the endpoint was destroyed"));
    if (!channel)
        co_return std::unexpected(std::move(channel.error()));
    SetupUnderWay under_way(anchor, *channel, std::nullopt);
    channel->watch_peer(core->options.peer_silence);
    const SessionRequest request{.client = core->transport->address(), .session = id, .limits = asked};
    const auto out = encode(request);
    if (const Result<void> sent = co_await channel->write(out, deadline); !sent)
        co_return std::unexpected(
            setup_error(sent.error(), call, fmt::format("sending the session request to {}", peer)));
    std::uint16_t version = 0;
    const Result<std::vector<std::byte>> bytes = co_await read_message(*channel, deadline, decode_reply_prefix, &version);
    core = *anchor;
    if (core == nullptr)
        co_return std::unexpected(Error::cancelled(call, "the endpoint was destroyed"));
    if (!bytes)
        co_return std::unexpected(
            setup_error(bytes.error(), call, fmt::format("reading the session reply of {}", peer)));
    const auto reply = decode_reply(*bytes);
    if (!reply)
        co_return std::unexpected(reply.error());
    if (reply->refusal) {
        ++core->counters.sessions_refused;
        co_return std::unexpected(Error::from_errno(call, ECONNREFUSED,
                                                    fmt::format("{} refused: {}", peer, to_string(*reply->refusal))));
    }
    if (auto honest = check_reply(request, *reply); !honest)
        co_return std::unexpected(honest.error());
    auto handle_to_server = core->transport->handle_maker(reply->server);
    auto ah = co_await run_blocking(handle_to_server, call);
    core = *anchor;
    if (core == nullptr)
        co_return std::unexpected(Error::cancelled(call, "the endpoint was destroyed"));
    if (!ah)
        co_return std::unexpected(ah.error());
    core->table.reduce_credits(id, reply->both_ways ? 2 * reply->limits.credits : reply->limits.credits);
    core->attach(id, reply->session, reply->server, std::move(*ah), reply->limits, true, reply->both_ways);
    reservation.kept = true;
    if (core->cm_sibling.expired())
        core->cm_sibling = channel->as_sibling();
    under_way.end();
    asio::co_spawn(core->executor, watch(anchor, id, std::move(*channel)), RethrowOutOfRun{});
    ++core->handles;
    co_return Session(core, id.number, id.generation);
}

} // namespace detail

// ---------------------------------------------------------------------------------
// Public handles

Responder& Responder::operator=(Responder&& other) noexcept {
    if (this != &other) {
        this->~Responder();
        new (this) Responder(std::move(other));
    }
    return *this;
}

Responder::~Responder() {
    if (core_ == nullptr)
        return;
    core_->check_thread_destroying("an rpc::Responder that did not answer");
    core_->respond(session_, generation_, request_, detail::Status::handler_dropped, {});
}

void Responder::respond(std::span<const std::byte> response, std::source_location where) {
    require(core_ != nullptr, where, "Responder::respond: answered already (or moved from)");
    core_->check_thread(where);
    std::exchange(core_, nullptr)->respond(session_, generation_, request_, detail::Status::ok, response);
}

Session& Session::operator=(Session&& other) noexcept {
    if (this != &other) {
        this->~Session();
        new (this) Session(std::move(other));
    }
    return *this;
}

Session::~Session() {
    if (core_ == nullptr)
        return;
    core_->check_thread_destroying("an rpc::Session");
    core_->end_session({.number = number_, .generation = generation_}, "the Session was destroyed");
    --core_->handles;
}

void Session::start(std::uint8_t type, std::span<const std::byte> request, std::span<std::byte> response,
                    CallOptions options, detail::StoredCall handler, std::source_location where) {
    require(core_ != nullptr, where, "Session::call on a moved-from Session");
    core_->check_thread(where);
    core_->start({.number = number_, .generation = generation_}, type, request, response, {}, options,
                 std::move(handler));
}

void Session::start(std::uint8_t type, MessageBuffer& request, MessageBuffer& response, CallOptions options,
                    detail::StoredCall handler, std::source_location where) {
    require(core_ != nullptr, where, "Session::call on a moved-from Session");
    core_->check_thread(where);
    require(request.hold_.get() != nullptr && response.hold_.get() != nullptr, where,
            "Session::call with a moved-from MessageBuffer");
    require(request.use() == BufferUse::request && response.use() == BufferUse::response, where,
            "Session::call: the request must be a BufferUse::request buffer, the response a BufferUse::response one");
    // another endpoint's would be refused by the device (its PD's keys): a broken UD QP
    // or an ended session, where the caller's mistake is plain here
    require(request.hold_.get()->pd == core_->buffers_pd && response.hold_.get()->pd == core_->buffers_pd, where,
            "Session::call with a MessageBuffer of another endpoint (this session's Endpoint::alloc_buffer makes "
            "them)");
    core_->start({.number = number_, .generation = generation_}, type,
                 request.hold_.get()->message().first(request.size_), response.hold_.get()->message(), {.request = &request, .response = &response}, options,
                 std::move(handler));
}

asio::awaitable<Result<void>> Session::close(std::chrono::milliseconds timeout, std::source_location where) {
    require(core_ != nullptr, where, "Session::close on a moved-from Session");
    core_->check_thread(where);
    return detail::EndpointCore::close(core_->anchor, {.number = number_, .generation = generation_}, timeout);
}

detail::CallSite Session::call_site(std::source_location where) const {
    require(core_ != nullptr, where, "Session::call on a moved-from Session");
    return {core_->executor, core_->completions};
}

namespace detail {

QueuePair* EndpointCore::rc_qp_of(const Session& session) noexcept {
    if (session.core_ == nullptr)
        return nullptr;
    SessionState* s = session.core_->table.lookup({.number = session.number_, .generation = session.generation_});
    return s != nullptr && s->rc.qp ? &*s->rc.qp : nullptr;
}

QueuePair* rc_qp_of(const Session& session) noexcept { return EndpointCore::rc_qp_of(session); }

} // namespace detail

SessionInfo Session::info(std::source_location where) const {
    require(core_ != nullptr, where, "Session::info on a moved-from Session");
    const detail::SessionState* s = core_->table.lookup({.number = number_, .generation = generation_});
    if (s == nullptr)
        return {};
    return {.window = s->limits.window,
            .credits = s->limits.credits,
            .max_request = s->limits.max_request,
            .max_response = s->limits.max_response,
            .payload_per_packet = s->limits.payload_per_packet};
}

Endpoint::Endpoint(std::unique_ptr<detail::EndpointCore> core) noexcept : core_(std::move(core)) {}

Endpoint::~Endpoint() {
    if (core_ && core_->handles != 0)
        rdmaxx::detail::programming_error(
            fmt::format("the rpc::Endpoint created here destroyed while {} of its Sessions live", core_->handles),
            core_->created);
    if (core_ && core_->handlers_running != 0) // the packet path it returns to is gone
        rdmaxx::detail::programming_error("the rpc::Endpoint created here destroyed inside one of its request handlers",
                                          core_->created);
}

Result<std::unique_ptr<Endpoint>> Endpoint::create(asio::io_context& io, EndpointOptions options,
                                                   std::source_location where) {
    require(options.ring > 0 && options.send_depth > 0 && options.window > 0 && options.credits > 0 &&
                options.max_sessions > 0,
            where, "rpc::Endpoint: ring {}, send_depth {}, window {}, credits {}, max_sessions {}: none may be 0",
            options.ring, options.send_depth, options.window, options.credits, options.max_sessions);
    require(options.setup_timeout.count() > 0 && options.setup_timeout <= std::chrono::hours(1) &&
                options.peer_silence >= std::chrono::seconds(1),
            where,
            "rpc::Endpoint: a setup_timeout of {} ms (from 1 ms to an hour), a peer_silence of {} ms (at least 1 s)",
            options.setup_timeout.count(), options.peer_silence.count());
    // a connect reserves twice its credits of ring buffers (a both-ways session's), and
    // a server's session its credits: fewer and no session could ever be set up
    require(options.ring >= 2 * std::uint64_t{options.credits}, where,
            "rpc::Endpoint: a ring of {} buffers for sessions of {} credits (at least twice as many)", options.ring,
            options.credits);
    require(options.window <= detail::max_window && options.credits <= detail::max_credits &&
                options.max_sessions <= detail::max_table_sessions,
            where, "rpc::Endpoint: window {} (most {}), credits {} (most {}), max_sessions {} (most {})",
            options.window, detail::max_window, options.credits, detail::max_credits, options.max_sessions,
            detail::max_table_sessions);
    auto core = std::make_unique<detail::EndpointCore>(io, std::move(options), where);
    const EndpointOptions& o = core->options;
    auto transport = detail::UdTransport::create(
        io,
        {.device = o.device, .port = o.port, .gid_index = o.gid_index, .ring = o.ring, .send_depth = o.send_depth,
         .qkey = detail::UdOptions{}.qkey, .drive = o.drive},
        &detail::EndpointCore::deliver, core.get(), where);
    if (!transport)
        return std::unexpected(std::move(transport.error()));
    core->transport = std::move(*transport);
    core->buffers_pd = core->transport->pd().get(where);
    const std::uint32_t payload = core->transport->mtu() - static_cast<std::uint32_t>(detail::header_bytes);
    core->rdma_threshold = o.rdma_threshold.value_or(payload);
    if (o.lend_through_windows && !core->transport->context().attributes().type2_windows)
        return std::unexpected(Error::unsupported(
            "rpc::Endpoint", fmt::format("lend_through_windows: {} has no type 2 memory windows",
                                         core->transport->context().name())));
    core->windows = o.lend_through_windows;
    require(detail::packet_count(std::max(o.max_request, o.max_response), payload) <= detail::max_packets, where,
            "rpc::Endpoint: a max_request {} / max_response {} takes more than {} packets of {} bytes", o.max_request,
            o.max_response, detail::max_packets, payload);
    if (o.listen_port != 0) {
        auto listener = detail::ControlListener::listen(io.get_executor(), o.session_transport, o.listen_address,
                                                        o.listen_port, o.setup_timeout);
        if (!listener)
            return std::unexpected(std::move(listener.error()));
        core->listener = std::move(*listener);
        asio::co_spawn(io, detail::EndpointCore::accept_loop(core->anchor, core->listener), detail::RethrowOutOfRun{});
    }
    return std::unique_ptr<Endpoint>(new Endpoint(std::move(core)));
}

Result<MessageBuffer> Endpoint::alloc_buffer(std::size_t capacity, BufferUse use, std::source_location where) {
    core_->check_thread(where);
    const EndpointOptions& o = core_->options;
    const std::size_t most = use == BufferUse::request ? o.max_request : o.max_response;
    require(capacity > 0 && capacity <= most, where,
            "rpc::Endpoint::alloc_buffer: a capacity of {} bytes (from 1 to the endpoint's max_{}, {})", capacity,
            use == BufferUse::request ? "request" : "response", most);
    const bool remote = capacity > core_->rdma_threshold; // the RC path may reach it
    const Access access = use == BufferUse::request
                              ? (remote ? core_->lendable(Access::remote_read) : Access::none)
                              : Access::local_write | (remote ? core_->lendable(Access::remote_write) : Access::none);
    // a request buffer's room in front: a whole request's packet header and descriptor
    const std::uint32_t room =
        use == BufferUse::request ? static_cast<std::uint32_t>(detail::header_bytes + detail::request_descriptor_bytes)
                                  : 0;
    auto region = MemoryRegion::allocate(core_->transport->pd(), room + capacity, access, {}, where);
    if (!region)
        return std::unexpected(std::move(region.error()));
    return MessageBuffer(detail::BufferHold(new detail::BufferBlock(std::move(*region), room)), use);
}

std::span<std::byte> MessageBuffer::bytes(std::source_location where) {
    require(hold_.get() != nullptr, where, "use of a moved-from MessageBuffer");
    return hold_.get()->message().first(size_);
}

std::span<const std::byte> MessageBuffer::bytes(std::source_location where) const {
    require(hold_.get() != nullptr, where, "use of a moved-from MessageBuffer");
    return hold_.get()->message().first(size_);
}

void MessageBuffer::resize(std::size_t size, std::source_location where) {
    require(hold_.get() != nullptr, where, "use of a moved-from MessageBuffer");
    require(size <= capacity(), where, "MessageBuffer::resize to {} bytes, its capacity is {}", size, capacity());
    size_ = size;
}

void detail::EndpointCore::replace_handler(std::uint8_t type, Handler handler) {
    auto kept = handler ? std::make_unique<Handler>(std::move(handler)) : nullptr;
    if (handlers_running > 0) // perhaps the one running: it may still use its captures
        replaced_handlers.push_back(std::move(handlers[type]));
    handlers[type] = std::move(kept);
}

void Endpoint::set_handler(std::uint8_t type, Handler handler, std::source_location where) {
    core_->check_thread(where);
    core_->replace_handler(type, std::move(handler));
}

void Endpoint::set_coroutine_handler(std::uint8_t type, CoroutineHandler handler, std::source_location where) {
    core_->check_thread(where);
    if (!handler)
        return core_->replace_handler(type, nullptr);
    // A coroutine made by a lambda reads its captures where the lambda is, in `handler`:
    // each coroutine keeps it alive, however the handlers are replaced meanwhile.
    struct Spawn {
        std::shared_ptr<const CoroutineHandler> coroutine;
        asio::io_context::executor_type executor;
        static asio::awaitable<void> keeping(std::shared_ptr<const CoroutineHandler> coroutine, Request request,
                                             Responder responder) {
            co_await (*coroutine)(request, std::move(responder));
        }
        void operator()(Request request, Responder responder) const {
            asio::co_spawn(executor, keeping(coroutine, request, std::move(responder)), detail::RethrowOutOfRun{});
        }
    };
    core_->replace_handler(type, Spawn{std::make_shared<const CoroutineHandler>(std::move(handler)), core_->executor});
}

void Endpoint::set_accept_handler(AcceptHandler handler, std::source_location where) {
    core_->check_thread(where);
    core_->accept_handler = handler ? std::make_shared<AcceptHandler>(std::move(handler)) : nullptr;
}

asio::awaitable<Result<void>> Endpoint::shutdown(std::chrono::milliseconds timeout, std::source_location where) {
    core_->check_thread(where);
    return detail::EndpointCore::shutdown(core_->anchor, timeout);
}

asio::awaitable<Result<Session>> Endpoint::connect(std::string host, std::uint16_t port, ConnectOptions options,
                                                  std::source_location where) {
    core_->check_thread(where);
    require(options.timeout.count() >= 0, where, "Endpoint::connect with a negative timeout");
    return detail::EndpointCore::connect(core_->anchor, std::move(host), port,
                                         options.timeout.count() > 0 ? options.timeout : core_->options.setup_timeout);
}

std::uint16_t Endpoint::listen_port() const noexcept {
    return core_->listener && core_->listener->is_open() ? core_->options.listen_port : 0;
}
std::uint32_t Endpoint::mtu() const noexcept { return core_->transport->mtu(); }
const Counters& Endpoint::counters() const noexcept {
    core_->counters.copies = core_->transport->copies();
    core_->counters.drops[static_cast<std::size_t>(detail::DropReason::receive_failed)] =
        core_->transport->failed_receives();
    return core_->counters;
}
std::uint32_t Endpoint::sessions() const noexcept { return core_->table.sessions(); }

} // namespace rdmaxx::rpc
