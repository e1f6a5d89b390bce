/// @file
/// RPC over RDMA, after eRPC: messages over an endpoint's UD QP (split into packets of
/// the path MTU, any MTU from 256 to 4096), on an Asio io_context beside the program's
/// sockets and timers. Reliability is the client's: go-back-N with an adaptive
/// retransmission timeout and per-session credits; the server runs each request's
/// handler at most once and keeps its response for resends.
///
/// @code
/// asio::io_context io;
/// auto server = rdmaxx::rpc::Endpoint::create(io, {.listen_port = 31850});
/// (*server)->set_handler(kGet, [](rdmaxx::rpc::Request request, rdmaxx::rpc::Responder responder) {
///     responder.respond(lookup(request.bytes()));     // now, or later from a coroutine
/// });
///
/// auto client = rdmaxx::rpc::Endpoint::create(io, {});
/// // in a coroutine on io:
/// auto session = co_await (*client)->connect("10.0.0.2", 31850);
/// rdmaxx::Result<std::size_t> got = co_await session->call(kGet, request, response, {.timeout = 100ms});
/// @endcode
///
/// One Endpoint per thread (per io_context): it owns one UD QP, its receive ring, its
/// send buffers and its sessions. A session is set up over a control connection to the
/// server's listener, TCP or RDMA CM (EndpointOptions::session_transport): a versioned,
/// checked exchange of UD addresses and limits (window, credits, largest request and
/// response, payload per packet: the smaller MTU of the two ports), and the control
/// connection stays open for the session's life: its end is the session's end (a peer
/// process that dies ends its sessions at once, with no heartbeat; a host that vanishes,
/// within EndpointOptions::peer_silence). Ending a session: destroy its
/// Session (at once), or Session::close (gracefully: both ends' calls finish first);
/// Endpoint::shutdown closes every session so.
///
/// Errors. A call ends with `Result<std::size_t>`, the response's size, or an Error:
/// @code{.unparsed}
///   timeout                  no response within CallOptions::timeout (Error::is_timeout)
///   peer unreachable         the retry cap: RtoConfig::max_timeouts retransmission
///                            timeouts in a row without progress (errno EHOSTUNREACH)
///   session reset            the session ended: its control connection closed (the peer
///                            closed it or died) or failed (the detail says how, as the
///                            connection told it: a port gone down, a failed
///                            completion), or the Session handle was destroyed; or it is
///                            closing (Session::close at either end: no call begins);
///                            or the server told it that a window of calls in a row was
///                            lost, every packet of each, so that its numbers and the
///                            server's are out of step for good; or the device refused
///                            one of its sends for good (EACCES on Soft-RoCE or siw:
///                            the process's credentials changed since it opened the
///                            device) (errno ECONNRESET)
///   no handler               the server has no handler for the type (errno ENOENT)
///   message too large        a request above the session's agreed max_request, or a
///                            response the server could not send in its max_response
///                            (errno EMSGSIZE)
///   response truncated       the response is larger than the response buffer: nothing
///                            is copied, the Error's detail says the size (errno ENOBUFS)
///   handler dropped          the server's handler ended without answering (errno EPIPE)
///   transfer failed          the server could not READ a large request (errno EIO)
///   cancelled                an Asio cancellation (Error::is_cancelled): terminal or
///                            partial at any time; total only while the call waits
///                            for a window slot, unsent (once sent, the server may
///                            have run it)
/// @endcode
/// A call that ends early (timeout, cancelled) frees its slot: a late response to it is
/// dropped and counted, never copied anywhere.
///
/// Input from the network is never trusted: every packet is validated and a bad one is
/// counted by reason (Counters::drops) and dropped; a malformed or hostile session setup
/// gets a refusal or an Error, and the endpoint serves the next peer. A UD packet
/// counts as the session's only with its peer's QP number and its peer's address (the
/// source GID, or IPv4 address on RoCE v2 over IPv4, of its GRH; the LID on InfiniBand
/// without one): "wrong source" otherwise. Even so it may be forged (an IP source
/// address can be), so one ends a session only where nothing else could go on: the
/// server's word that the client's numbers are out of step (see "session reset"), about
/// a call in flight with none of the window before it in flight.
/// What comes over a session's RC QP can only
/// come from its peer, and the first receive there that no honest peer causes ends that
/// session (Counters::rc_misuses): a server's immediate that names no call of this end
/// that could still get one (per call that offered memory and ended without its
/// immediate, one late immediate is honest), or names another session; a client's SEND
/// that is not a well-formed whole request of its own session. So a peer flooding the
/// receives all its endpoint's sessions share loses its session at once, and the others'
/// transfers go on. Not caught: a server's READ or WRITE (which no receive of this end
/// sees) of memory a large call lent or offered, after the call ended
/// (message_buffer.hpp, "Rights"). What peers or a stream of calls make an endpoint log
/// (its warnings, its errors about sends) goes at most 10 lines a second, the number
/// held back said before the next (rdmaxx/wrap/log.hpp); the counters count each event.
///
/// Large messages (above EndpointOptions::rdma_threshold: by default, those of more
/// than one UD packet) take the session's RC path:
/// a client's first large call sends an offer of an RC QP over the session's control
/// connection and waits (in the queue of calls beyond the window) for the server's QP
/// (on a both-ways session, either end's first large call; the QPs then carry both
/// ends' calls);
/// from then on a large request is copied into registered staging memory of its window
/// slot and READ by the server into a buffer its handler reads in place, and a response
/// above the threshold is WRITTEN by the server into staging memory the call offered,
/// with an immediate whose completion at the client is the response: one round trip,
/// no UD packet. (The server makes it the call's answer in its UD window once the
/// WRITE completed: a resent request gets the response's size by UD, never a second
/// WRITE; and the slot's next call is taken only then.) Each immediate takes a receive
/// of the endpoint's one SRQ for them (4,096): so that it never runs dry, at most 2,048
/// calls of an endpoint may still get a response WRITTEN (an abandoned call's until its
/// slot hears from the server again), and a call beyond offers no memory: its response
/// comes in UD packets.
/// A request the server takes whole (up to 16 KiB with its 40-byte descriptor, and
/// above rdma_threshold or, with its descriptor, more than one UD packet) is not READ,
/// nor sent in UD packets: it is SENT, as one
/// message, from the call's MessageBuffer (its header and descriptor in the room in
/// front: message_buffer.hpp) or else copied into the slot's staging memory and SENT
/// from there, over the RC QP into one of the
/// server endpoint's 256 receive buffers for them, where its handler reads it in place
/// (a call ~ UCX's eager protocol: one SEND, then the response). The server keeps
/// each session at most its window's worth of those buffers (and 255), while it has
/// them to spare, and says so in its answer to the offer; a session past them (or a
/// both-ways session, whose QPs take their receives from the immediates' SRQ) sends
/// its requests as before.
/// Staging memory allows only what its role needs (remote READ of requests, remote
/// WRITE of responses, neither for a whole request's SEND), and a slot's memory that an
/// abandoned call's transfer, or a SEND not yet complete, may still touch is retired,
/// not reused, until the server has provably moved past that call and the SEND is
/// complete.
/// If the server cannot set up an RC QP, the session carries large messages as UD
/// packets; so do the calls meanwhile if its answer takes longer than setup_timeout,
/// and an answer that comes later still sets the path up (on a both-ways session the
/// end that answered calls over it at once). A client that cannot make or connect its
/// own QP keeps to UD packets too. On a both-ways session an end that could not make
/// its QP answers the peer's later offer "unavailable" (both keep to UD); one that
/// cannot connect its QP to the QP the peer answered with (connected already) ends
/// the session (its calls: session reset), as each of the peer's large calls over the
/// path would fail. An RC transfer, SEND or receive
/// that fails ends the session (its calls: session reset): a peer that breaks its RC
/// QP (a SEND larger than a receive buffer) ends its own session at once. Staging
/// memory is per window slot, sized by the largest message the slot has carried (in
/// powers of two from 4 KiB) and kept for the session's life: at most window x
/// (max_request + max_response + 32 KiB for whole requests) per session at each end.
///
/// Copies: a call with spans copies its request into its session's window (or staging
/// memory) as it begins (a resend needs it), each packet into a send buffer
/// (Counters::copies), and its response out of the window (or staging memory) into the
/// caller's buffer (Counters::message_copies counts the whole-message copies). A call
/// with MessageBuffers (message_buffer.hpp) copies neither its request nor a response
/// above rdma_threshold. At the server, a one-packet request
/// (a whole one included) is not copied unless its handler returns without answering;
/// the packets of a longer one are (Counters::request_copies). A large response is copied into staging memory for its
/// WRITE, unless it lies in the large request the server READ (an echo, a forwarded
/// part): it is then WRITTEN from there.
///
/// @threadsafety None, as the io_context's one thread. Its calls, a Session's and a
/// Responder's check that they run on the thread that created the endpoint, and abort
/// naming the caller's line if not (eRPC loses such requests silently); a Responder is
/// answered on that thread too (asio::post to the io_context from elsewhere). Destroying
/// a live Session or an unanswered Responder elsewhere aborts too (naming the handle).
///
/// Lifetimes: Sessions and Responders must not outlive their Endpoint, nor the Endpoint
/// its io_context (programming errors). While an endpoint lives its completion queue is
/// driven, so io_context::run() does not return.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/execution/context.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/query.hpp>
#include <asio/associated_allocator.hpp>
#include <asio/use_awaitable.hpp>

#include <rdmaxx/async/completions.hpp>
#include <rdmaxx/ctrl/connection.hpp>
#include <rdmaxx/rpc/congestion.hpp>
#include <rdmaxx/rpc/message_buffer.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::rpc {

/// How an Endpoint is made: its device, listener, buffers and the limits it offers.
struct EndpointOptions {
    std::string device = {};                     ///< empty: the first
    std::uint8_t port = 1;                       ///< the device's port
    std::optional<std::uint32_t> gid_index = {}; ///< default: Context::choose_gid
    std::uint16_t listen_port = 0;               ///< 0: no listener (a client only)
    std::string listen_address = "0.0.0.0";      ///< what the listener binds
    /// The sessions' control connections, listened for and connected with: TCP, or RDMA
    /// CM (lib/ctrl's protocol on an RC QP of small messages, through lib/async: no IP
    /// stack needed beyond address resolution, a dead peer's kernel ends its connections
    /// as with TCP). Both ends must use the same one. RDMA CM costs an RC QP per session
    /// at each end; the QPs of a listener's sessions share one device context, PD and CQ,
    /// and so do those of the sessions an endpoint sets up through one device (the one
    /// each address resolves to, not necessarily `device`).
    Transport session_transport = Transport::tcp;
    std::uint32_t ring = 1024;       ///< receive buffers of the UD QP (40 + MTU bytes each), and 15 spares
    std::uint32_t send_depth = 256;  ///< send buffers
    /// Sessions at once, client and server; also the most clients' setups under way
    /// at the listener at once. One more takes the place of a setup that would hold it
    /// until setup_timeout, one still waiting for its client's request (a silent
    /// client) or for its turn at the helpers (below; Counters::setups_evicted): the
    /// oldest of the host holding the most, when that holds at least two more than the
    /// newcomer's host; else the oldest silent one of the newcomer's own host. Otherwise
    /// it is closed at once, a refusal. So one host opening setups as fast as it likes
    /// keeps no other host out: they end up level. A setup makes the handle towards the
    /// address its client announced on a helper thread (rdmaxx/async/blocking.hpp: a
    /// second for an address nobody answers for) at a peer's turn (async::PeerTurn: two
    /// at a time per io_context, every endpoint's setups and RC setups on it together),
    /// the others host by host, the host whose turn is oldest first (a host: the address
    /// the client's control connection comes from, an IPv6 address's /64), each host's
    /// in order (closed once their setup_timeout passes): one host's clients delay
    /// another's setup by a turn, however many they are, and the io_context's other two
    /// helpers stay free for the application's own calls (its connects).
    std::uint32_t max_sessions = 256;
    /// @name Per-session limits
    /// Per session, at most (a server agrees to the smaller of its own and the client's):
    /// @{
    std::uint32_t window = 8;        ///< calls in flight; more wait for a slot
    std::uint32_t credits = 16;      ///< packets in flight; each session reserves this many ring buffers
    std::uint32_t max_request = 64 * 1024;  ///< bytes of a request
    std::uint32_t max_response = 64 * 1024; ///< bytes of a response
    /// @}
    /// A request above this many bytes, or a response buffer above it, takes the
    /// session's RC path (set up over its control connection when first needed): the
    /// server takes the request whole (up to 16 KiB) or READs it from the client's
    /// memory, and WRITEs a response above it into memory the client offered. Below, and
    /// when the RC path is unavailable, messages travel as UD packets. Unset (the
    /// default): one UD packet's payload at the port's MTU (its MTU less 32 bytes), so
    /// a message of more than one packet takes the RC path, where a round trip is the
    /// faster from 1 KiB on (on Soft-RoCE, 2-3x; bench/results/rpc-sizes.md). A larger
    /// threshold keeps more sessions free of an RC QP and its staging memory (eRPC's
    /// choice: everything over UD); UINT32_MAX: UD only. 0: every message on the RC
    /// path, a call one SEND and one WRITE_WITH_IMM (UCX's choice for small messages on
    /// a connected endpoint): on Soft-RoCE the faster and steadier small round trip (32 B:
    /// 0.5-0.8x the UD path's, bench/results/rpc.md), for an RC QP and staging memory per
    /// session. A session whose max_request is below 40 bytes or max_response below 4
    /// (too small for the RC path's descriptors) keeps to UD. The memory an abandoned
    /// call offered stays registered until the server answers a later call in its window
    /// slot (its late READ or WRITE may still come); a slot whose last two such calls
    /// were abandoned so takes its next calls by UD until one is answered.
    std::optional<std::uint32_t> rdma_threshold = std::nullopt;
    /// How this endpoint's calls lend their memory to the server on the RC path
    /// (message_buffer.hpp, "Rights"). false (the default): by the keys of its
    /// registrations, valid beyond the call and from every RC QP of the endpoint: for
    /// servers it trusts. true: through memory windows (type 2) bound through the
    /// session's QP to exactly the call's bytes before its descriptor goes and revoked
    /// before the call ends, so a server reaches a call's memory while it is in flight
    /// only. The cost, per call that lends: two local work requests (binds, one post,
    /// one completion) before its descriptor goes (its packets wait for them; the
    /// session's other calls go on), two more (revocations, the same) before its answer
    /// is delivered; and requests the server would take
    /// whole (up to 16 KiB) are READ instead, so the client's QP posts binds and
    /// revocations only (Soft-RoCE in Linux 6.1 stalled a QP whose binds and
    /// revocations were mixed with SENDs once the wire lost packets: tests/device/
    /// rpc_pair_test.cpp at 5 % loss). For the same reason a both-ways session's own
    /// large calls go by UD (its QP carries the peer's READs and WRITEs). A call goes
    /// by UD too where its four work requests would not fit beside those in flight: its
    /// session's QP holds four per window slot, the endpoint 1,024 (calls abandoned with
    /// their binds in flight take room until the binds complete). A call whose answer is
    /// in waits for its revocations, past its deadline if need be: a session whose binds
    /// and revocations go 5 s without one completing has its QP taken for stalled, and
    /// ends (a call whose answer was in still gets it: the windows are destroyed first).
    /// Runtime error of Endpoint::create:
    /// true on a device without type 2 windows (DeviceAttributes::type2_windows).
    bool lend_through_windows = false;
    /// Congestion control of the sessions this endpoint calls through (congestion.hpp):
    /// empty (the default) for none, the credits alone limit a session.
    CongestionFactory congestion = {};
    async::DriveOptions drive = {};  ///< how its completion queues are driven (UD and RC)
    std::chrono::milliseconds setup_timeout{5000}; ///< connect, and a client's setup at the listener
    /// A session whose peer's host is silent about this long (powered off, cut off: no
    /// process left to close its control connection) ends, idle or not. Over TCP by
    /// keepalive probes on the control connection (whole seconds apart, so not much
    /// under 2 s). Over RDMA CM, whose idle RC QP hears of no loss, each end sends a
    /// still-here message every peer_silence / 3 and ends the session once it has heard
    /// none for peer_silence (so a peer whose thread does not run its io_context that
    /// long is taken for gone too). At least 1 s.
    std::chrono::milliseconds peer_silence{30'000};
    /// How often an endpoint with calls in flight checks their retransmission timeouts
    /// and deadlines (one steady_timer; the RTO's floor is 500 us).
    std::chrono::microseconds tick{500};
};

/// How one Endpoint::connect goes.
struct ConnectOptions {
    /// The whole setup's bound (resolving, connecting, the server's answer); 0: the
    /// endpoint's EndpointOptions::setup_timeout.
    std::chrono::milliseconds timeout{0};
};

/// How one call goes.
struct CallOptions {
    /// The whole call's bound, its wait for a window slot included: then an Error of
    /// kind timeout. milliseconds::max() sets none (the retry cap still ends a call
    /// whose server is gone), as it does for ConnectOptions::timeout and close()'s.
    std::chrono::milliseconds timeout{1000};
};

/// The counters of an endpoint, for a program's progress line and the tests.
struct Counters {
    std::uint64_t calls = 0;           ///< begun
    std::uint64_t completed = 0;       ///< ended with a response
    std::uint64_t failed = 0;          ///< ended with an Error
    std::uint64_t handled = 0;         ///< requests given to a handler (server)
    std::uint64_t retransmissions = 0; ///< packets written off as an RTO expired: go-back-N
                                       ///< sends them again, unless their call ended then
    std::uint64_t taken_by_timer = 0;  ///< calls ended by packets the timer took from the CQ
                                       ///< (the driver's turn not yet come) before judging
                                       ///< their RTOs: counted in completed or failed too;
                                       ///< their completions run one io_context turn later
    std::uint64_t send_stalls = 0;     ///< packets not sent for want of a send buffer (sent again later)
    std::uint64_t credit_stalls = 0;   ///< times a session had a packet to send and no credit
                                       ///< (or congestion window) free: once per wait
    std::uint64_t copies = 0;          ///< packets whose payload was copied into a send buffer
    std::uint64_t message_copies = 0;  ///< whole messages copied: at a client, a request into
                                       ///< its session's window or staging memory as its call
                                       ///< begins, a response out of them (message_buffer.hpp
                                       ///< tells when a call with MessageBuffers copies); at a
                                       ///< server, a large response into staging memory for
                                       ///< its WRITE (none when it lies in the request READ)
    std::uint64_t request_copies = 0;  ///< request packets copied into a window (server; a
                                       ///< one-packet request answered by its handler: none)
    std::uint64_t rdma_reads = 0;      ///< large requests READ from clients (server)
    std::uint64_t rdma_writes = 0;     ///< large responses WRITTEN into clients' memory (server)
    std::uint64_t rdma_sends = 0;      ///< requests SENT whole over a session's RC QP (client)
    std::uint64_t probes = 0;          ///< whole requests asked about again by a probe, their
                                       ///< header alone over UD, once the server had them and
                                       ///< their handler still ran (client)
    std::uint64_t held_for_write = 0;  ///< requests of a slot's next call held until the WRITE
                                       ///< of the slot's last response completed (server: the
                                       ///< client had the response first), not dropped
    std::uint64_t buffers_renewed = 0; ///< MessageBuffers given new memory after their call was
                                       ///< abandoned (message_buffer.hpp)
    std::uint64_t renewals_failed = 0; ///< MessageBuffers of abandoned calls no new memory
                                       ///< was had for: each ended its session (message_buffer.hpp)
    std::uint64_t window_posts = 0;    ///< posts of window binds and revocations (client lending
                                       ///< through windows): a call's binds go with one
                                       ///< doorbell, its revocations with another
    std::uint64_t sessions_refused = 0; ///< session setups refused: by this server, to this client
    /// setups closed by this server's listener to make room for a newer client when
    /// max_sessions setups are under way (EndpointOptions::max_sessions says which)
    std::uint64_t setups_evicted = 0;
    std::uint64_t rc_misuses = 0;      ///< sessions ended because their peer used its RC QP as
                                       ///< no honest peer does (see Endpoint: input)
    std::array<std::uint64_t, 24> drops = {}; ///< by reason: drop_reason_name(i)
    /// All the packets dropped: the sum of drops.
    std::uint64_t dropped() const noexcept;
};
/// What Counters::drops[i] counts ("" past the last reason).
std::string_view drop_reason_name(std::size_t i) noexcept;

class Endpoint;
class Session;

namespace detail {
struct EndpointCore;

// What a call's completion needs of its endpoint: the executor of its io_context, and
// lib/async's service of that io_context (the memory its handler is kept in, and where
// it completes).
struct CallSite {
    asio::io_context::executor_type executor;
    async::Completions* completions;
};

// A call's completion handler while its call is in flight: type-erased, in the
// endpoint's handler memory (no heap once warm), completed on its executor, never
// inline (the endpoint may be inside a completion batch).
class StoredCall {
public:
    // Where a cancellation of the call goes.
    struct Target {
        EndpointCore* core = nullptr;
        std::uint16_t session = 0;
        std::uint32_t generation = 0;
        std::uint64_t call = 0; // its request number, or while `queued` its ticket
        bool queued = false;
    };

    template <class H>
    static StoredCall store(H&& handler, const CallSite& site);

    StoredCall() = default;
    StoredCall(StoredCall&& other) noexcept : box_(std::exchange(other.box_, nullptr)), table_(other.table_) {}
    StoredCall& operator=(StoredCall&& other) noexcept {
        std::swap(box_, other.box_);
        std::swap(table_, other.table_);
        return *this;
    }
    ~StoredCall() {
        if (box_)
            table_->destroy(box_);
    }
    explicit operator bool() const noexcept { return box_ != nullptr; }

    // Lets an Asio cancellation of the handler (terminal, partial or total) reach the core.
    void on_cancel(Target target) { table_->on_cancel(box_, target); }
    // Posts the handler with `result`; this is empty afterwards.
    void complete(Result<std::size_t> result) && { table_->complete(std::exchange(box_, nullptr), std::move(result)); }

private:
    struct Table {
        void (*complete)(void* box, Result<std::size_t>&& result);
        void (*destroy)(void* box) noexcept;
        void (*on_cancel)(void* box, Target target);
    };
    template <class H>
    struct Box {
        H handler;
        CallSite site;
        static void complete(void* box, Result<std::size_t>&& result);
        static void destroy(void* box) noexcept;
        static void free(Box* box) noexcept;
        static void on_cancel(void* box, Target target);
        static constexpr Table table{&complete, &destroy, &on_cancel};
    };

    void* box_ = nullptr;
    const Table* table_ = nullptr;
};

// The core's entry for a cancellation (endpoint.cpp).
void cancel_call(const StoredCall::Target& target) noexcept;

// Where a handler's Request finds its bytes: the endpoint keeps one per session number
// and window slot for its whole life, names in it the request it shows, and empties it
// as that request is answered or its session ends. A Request read later (a coroutine
// handler resumed after its client left) so finds nothing, not memory given back.
struct RequestView {
    std::span<const std::byte> bytes;
    std::uint32_t generation = 0; // of the request's session (0 names none)
    std::uint64_t request = 0;    // its number
};

} // namespace detail

/// A handler's view of a request: its type and bytes. Zero-copy: a one-packet request is
/// read where it arrived, in the receive ring, while the handler runs; if the handler
/// returns without answering, the endpoint copies it into the session's window then
/// (Counters::request_copies) and bytes() shows the copy. A large request is read in
/// the buffer the server READ it into. Once its Responder has answered or is
/// destroyed, or its session has ended (its client gone, say, while a coroutine
/// handler waited), bytes() is empty.
/// @threadsafety Read on the endpoint's thread (unchecked), while the Endpoint lives.
class Request {
public:
    /// Made by the endpoint for its handler: `view` shows the request now.
    explicit Request(std::uint8_t type, const detail::RequestView& view) noexcept
        : type_(type), view_(&view), generation_(view.generation), request_(view.request) {}
    /// The type the client called (the handler's key).
    std::uint8_t type() const noexcept { return type_; }
    /// The request's bytes, where they are now; empty once answered or its session ended.
    std::span<const std::byte> bytes() const noexcept {
        return view_->generation == generation_ && view_->request == request_ ? view_->bytes
                                                                              : std::span<const std::byte>{};
    }

private:
    std::uint8_t type_;
    const detail::RequestView* view_;
    std::uint32_t generation_;
    std::uint64_t request_;
};

/// The answer to one request, move-only: respond() once, now or later (from a coroutine
/// on the endpoint's thread). Destroyed without answering: the caller gets "handler
/// dropped". Answering after the session ended does nothing.
/// @threadsafety One thread, the endpoint's: respond() checks it and aborts on
/// another, naming the caller's line (asio::post to the io_context from elsewhere);
/// destroying it unanswered on another thread aborts too.
class Responder {
public:
    /// Takes over `other`'s request; `other` is left as if answered.
    Responder(Responder&& other) noexcept
        : core_(std::exchange(other.core_, nullptr)), session_(other.session_), generation_(other.generation_),
          request_(other.request_) {}
    /// Ends this one's request, as the destructor does, then takes over `other`'s.
    Responder& operator=(Responder&& other) noexcept;
    Responder(const Responder&) = delete;
    Responder& operator=(const Responder&) = delete;
    /// Without an answer given, answers "handler dropped".
    ~Responder();

    /// Sends `response` (copied: the buffer is free at return). One larger than the
    /// session's max_response reaches the caller as "message too large".
    /// @misuse Answered already (or moved from); not the endpoint's thread.
    void respond(std::span<const std::byte> response, std::source_location where = std::source_location::current());

private:
    friend struct detail::EndpointCore;
    Responder(detail::EndpointCore* core, std::uint16_t session, std::uint32_t generation, std::uint64_t request) noexcept
        : core_(core), session_(session), generation_(generation), request_(request) {}

    detail::EndpointCore* core_;
    std::uint16_t session_;
    std::uint32_t generation_;
    std::uint64_t request_;
};

/// Runs for each request of its type that arrived whole, on the endpoint's thread. An
/// exception that escapes it propagates out of the io_context's run(), from a handler
/// posted for it (the packets and transfers it interrupted are taken as if it had
/// returned); a Responder it did not keep answers as it is destroyed (unanswered).
using Handler = std::function<void(Request, Responder)>;
/// The same as a coroutine, spawned on the endpoint's io_context for each request (it
/// may co_await anything before it responds; the request was copied into the session's
/// window, as for any handler that returns unanswered). An exception that escapes it
/// propagates out of the io_context's run(), as Asio's co_spawn does.
using CoroutineHandler = std::function<asio::awaitable<void>(Request, Responder)>;

/// Runs for each session a client set up, on the endpoint's thread, with the server's
/// handle of it. An exception that escapes it propagates out of the io_context's run().
using AcceptHandler = std::function<void(Session)>;

/// The limits both ends of a session agreed to.
struct SessionInfo {
    std::uint32_t window = 0, credits = 0, max_request = 0, max_response = 0, payload_per_packet = 0;
    /// @var window
    /// Calls in flight.
    /// @var credits
    /// Packets in flight.
    /// @var max_request
    /// Bytes of a request.
    /// @var max_response
    /// Bytes of a response.
    /// @var payload_per_packet
    /// Message bytes a packet carries (from the smaller MTU of the two ports).
};

/// A session's handle at either end: at the client, from Endpoint::connect; at a server
/// with an accept handler, given to it for each session a client set up (the session is
/// then both ways: the server calls the client through it, with the same limits). An
/// RAII handle: destroying it ends the session at once (its calls in flight end with
/// "session reset", the peer hears of it through the control connection); close() ends it
/// gracefully, letting both ends' calls finish first. A server without an accept
/// handler keeps no handle: its sessions end when their clients end them.
/// @threadsafety One thread, the endpoint's: call() checks it and aborts on another,
/// naming the caller's line; destroying it on another thread aborts too.
class Session {
public:
    /// Takes over `other`'s session; `other` is left moved-from.
    Session(Session&& other) noexcept
        : core_(std::exchange(other.core_, nullptr)), number_(other.number_), generation_(other.generation_) {}
    /// Ends this one's session, as the destructor does, then takes over `other`'s.
    Session& operator=(Session&& other) noexcept;
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    /// Ends the session: its calls in flight end with "session reset".
    ~Session();

    /// Calls the handler of `type` at the server with `request` (copied when the call
    /// begins); its response lands in `response`. Completion signature
    /// `void(Result<std::size_t>)` (the response's size); any Asio completion token, by
    /// default use_awaitable. Calls beyond the window (and large calls while the
    /// session's RC path is being set up) wait, in order, before they begin. Asio's rule
    /// for buffers: the caller keeps `request` and `response` valid until the
    /// completion runs (a coroutine that awaits the call does so by itself).
    /// The completion tokens to pick from for speed: a callback costs least; an
    /// rdmaxx::async::Task awaiting the call through async::use_task (rdmaxx/async/task.hpp)
    /// about as little, its coroutine resumed as the callback would run; an
    /// asio::awaitable through use_awaitable ~350 distinct instructions more per round
    /// trip (Asio 1.22 starts each awaited operation in a coroutine frame of its own:
    /// bench/results/rpc-round-trip.md), for Asio's cancellation of the call, which a
    /// Task lacks (its calls end by their timeouts).
    /// @errors As the table at the top of endpoint.hpp says: timeout (within
    /// options.timeout, its wait for a slot included), peer unreachable (EHOSTUNREACH),
    /// session reset (ECONNRESET), no handler (ENOENT), message too large (EMSGSIZE),
    /// response truncated (ENOBUFS), handler dropped (EPIPE), transfer failed (EIO),
    /// cancelled; a malformed RC response descriptor (protocol).
    /// @misuse A moved-from Session; not the endpoint's thread.
    template <class Token = asio::use_awaitable_t<>>
    auto call(std::uint8_t type, std::span<const std::byte> request, std::span<std::byte> response,
              CallOptions options = {}, Token&& token = {},
              std::source_location where = std::source_location::current());

    /// The same with registered buffers, without copies (message_buffer.hpp): the
    /// request is request.bytes(); the response lands in response's capacity, and on
    /// success response.size() is set to its size. The caller keeps both buffers (and
    /// their bytes) as they are until the completion runs; a call that ends without
    /// its response may give them new memory (spans from bytes() taken before it are
    /// then stale).
    /// @errors As the call with spans.
    /// @misuse A buffer of the wrong use (BufferUse), of another endpoint, or moved
    /// from; a moved-from Session; not the endpoint's thread.
    template <class Token = asio::use_awaitable_t<>>
    auto call(std::uint8_t type, MessageBuffer& request, MessageBuffer& response, CallOptions options = {},
              Token&& token = {}, std::source_location where = std::source_location::current());

    /// Ends the session gracefully, within `timeout`: from now on no call begins at
    /// either end (a call made through the session ends with "session reset"), the calls
    /// begun or queued at this end finish, each with its own result; then the peer is
    /// told, finishes its own calls through the session (on a both-ways session; its
    /// calls still waiting for a window slot end at once, not begun: session reset) and
    /// ends it, and the session ends here: the result is success. Closing a session that
    /// has ended already (the peer closed it, its process died) also succeeds, at once;
    /// a close() while another runs (Endpoint::shutdown's) waits for the same end, with
    /// its own timeout. The handle stays, ended: destroy it as any other.
    /// @errors timeout: calls still in flight at either end, or a peer that does not end
    /// the session, when `timeout` passes: the session ends there and then, as the
    /// destructor ends it (this end's calls: session reset); cancelled (a terminal Asio
    /// cancellation of the awaiting coroutine, which ends the session likewise, or the
    /// endpoint destroyed meanwhile).
    /// @misuse A moved-from Session; not the endpoint's thread.
    asio::awaitable<Result<void>> close(std::chrono::milliseconds timeout = std::chrono::milliseconds{1000},
                                        std::source_location where = std::source_location::current());

    /// What the server agreed to (all zero once the session has ended).
    /// @misuse A moved-from Session.
    SessionInfo info(std::source_location where = std::source_location::current()) const;

private:
    friend struct detail::EndpointCore;
    Session(detail::EndpointCore* core, std::uint16_t number, std::uint32_t generation) noexcept
        : core_(core), number_(number), generation_(generation) {}
    void start(std::uint8_t type, std::span<const std::byte> request, std::span<std::byte> response,
               CallOptions options, detail::StoredCall handler, std::source_location where);
    void start(std::uint8_t type, MessageBuffer& request, MessageBuffer& response, CallOptions options,
               detail::StoredCall handler, std::source_location where);
    detail::CallSite call_site(std::source_location where) const;

    detail::EndpointCore* core_;
    std::uint16_t number_;
    std::uint32_t generation_;
};

/// An RPC endpoint: one UD QP, its receive ring, its send buffers and its sessions, on
/// one io_context (the top of endpoint.hpp). Made by create(); neither copied nor moved.
/// @threadsafety None: one thread, the one that created it (its io_context's). Its
/// calls that take a source_location check it and abort on another thread, naming the
/// caller's line.
class Endpoint {
public:
    /// Opens the device, creates the UD QP and its ring, listens if asked.
    /// @errors The device's (no device, resources), the listening port's (in use; an
    /// invalid listen_address: EINVAL).
    /// @misuse Options out of range (0 ring, send_depth, window, credits or
    /// max_sessions; a ring of fewer than twice the credits, as a connect reserves; a
    /// setup_timeout not from 1 ms to an hour, a peer_silence under 1 s; a window above 1024, credits above 4096,
    /// max_sessions above 65,535; a max_request or max_response of more than 65,536
    /// packets of the port's MTU).
    static Result<std::unique_ptr<Endpoint>> create(asio::io_context& io, EndpointOptions options = {},
                                                    std::source_location where = std::source_location::current());
    Endpoint(const Endpoint&) = delete;
    Endpoint& operator=(const Endpoint&) = delete;
    /// Ends every session (their calls: session reset), closes the listener and the
    /// control connections of setups under way (a connect's ends cancelled).
    /// @misuse A Session of it still exists; inside one of its request handlers (a
    /// plain Handler as it runs; a coroutine handler's coroutine, a call's completion
    /// may). The message names the line that created the endpoint: a destructor cannot
    /// name its caller.
    ~Endpoint();

    /// The handler of requests of `type`; an empty one removes it (its requests are
    /// answered "no handler"). May be called from a handler, even of the one it
    /// replaces: a handler replaced while handlers run is destroyed once none runs.
    /// @misuse Not the endpoint's thread.
    void set_handler(std::uint8_t type, Handler handler, std::source_location where = std::source_location::current());
    /// A coroutine handler of requests of `type` (an empty one removes it). The handler
    /// (a lambda's captures, which its coroutines read where the lambda is) lives as
    /// long as a coroutine it began, however it is replaced meanwhile.
    /// @misuse Not the endpoint's thread.
    void set_coroutine_handler(std::uint8_t type, CoroutineHandler handler,
                               std::source_location where = std::source_location::current());

    /// From now on, sessions clients set up are both ways: `handler` gets each one's
    /// Session, to call the client back (the client's handlers answer). Large messages
    /// take the session's RC path either way: its QPs, set up by the end that first
    /// needs them, serve both ends' calls. Each end of such a session reserves twice
    /// its credits in its receive ring. An empty handler: sessions from now on are the
    /// client's only.
    /// @misuse Not the endpoint's thread.
    void set_accept_handler(AcceptHandler handler, std::source_location where = std::source_location::current());

    /// A session to the endpoint listening at host:port, within options.timeout (by
    /// default the endpoint's setup_timeout).
    /// @errors Resolving and connecting (errno), a silent server (timeout), a malformed
    /// or dishonest answer (protocol), a refusal (errno ECONNREFUSED, the reason in the
    /// detail: too many sessions, ring full, ...), no table entry or ring room here
    /// (errno EAGAIN); this endpoint destroyed meanwhile (cancelled).
    /// @misuse Not the endpoint's thread; a negative timeout.
    asio::awaitable<Result<Session>> connect(std::string host, std::uint16_t port, ConnectOptions options = {},
                                             std::source_location where = std::source_location::current());

    /// Closes every session now live gracefully, as Session::close(timeout) each, at
    /// once: at a server, each client finishes its calls (the server serves them) and
    /// ends its session; the listener answers new setups with a refusal ("shutting
    /// down", errno ECONNREFUSED at the client) meanwhile, then closes (listen_port() is
    /// then 0). The endpoint stays usable as a client.
    /// @errors The first close()'s Error (timeout: a session whose calls or peer did not
    /// finish within `timeout`, ended there and then); cancelled (a terminal Asio
    /// cancellation ends every session at once).
    /// @misuse Not the endpoint's thread.
    asio::awaitable<Result<void>> shutdown(std::chrono::milliseconds timeout = std::chrono::milliseconds{1000},
                                           std::source_location where = std::source_location::current());

    /// A registered buffer of `capacity` bytes for calls' requests or responses, with
    /// the rights `use` needs (message_buffer.hpp).
    /// @errors Allocating or registering it.
    /// @misuse Capacity 0 or above the largest message (max_request for a request,
    /// max_response for a response); not the endpoint's thread.
    Result<MessageBuffer> alloc_buffer(std::size_t capacity, BufferUse use,
                                       std::source_location where = std::source_location::current());

    /// The port the listener is bound to (a TCP or an RDMA CM port: session_transport;
    /// 0: none); the OS's choice for listen_port 0 is not offered: a listener needs a port.
    std::uint16_t listen_port() const noexcept;
    /// The port's active MTU, in bytes (the most a packet carries, header included).
    std::uint32_t mtu() const noexcept;
    /// Its counters, as they are now.
    const Counters& counters() const noexcept;
    /// Live sessions, client and server.
    std::uint32_t sessions() const noexcept;

private:
    explicit Endpoint(std::unique_ptr<detail::EndpointCore> core) noexcept;
    std::unique_ptr<detail::EndpointCore> core_;
};

// ---------------------------------------------------------------------------------

template <class Token>
auto Session::call(std::uint8_t type, std::span<const std::byte> request, std::span<std::byte> response,
                   CallOptions options, Token&& token, std::source_location where) {
    return asio::async_initiate<Token, void(Result<std::size_t>)>(
        [this, type, request, response, options, where](auto handler) {
            start(type, request, response, options, detail::StoredCall::store(std::move(handler), call_site(where)),
                  where);
        },
        token);
}

template <class Token>
auto Session::call(std::uint8_t type, MessageBuffer& request, MessageBuffer& response, CallOptions options,
                   Token&& token, std::source_location where) {
    return asio::async_initiate<Token, void(Result<std::size_t>)>(
        [this, type, &request, &response, options, where](auto handler) {
            start(type, request, response, options, detail::StoredCall::store(std::move(handler), call_site(where)),
                  where);
        },
        token);
}

namespace detail {

// The execution context `executor` runs its work in (Asio's executors answer the
// context query, older ones context()), or nullptr if it does not tell.
template <class Executor>
const asio::execution_context* context_of(const Executor& executor) noexcept {
    if constexpr (asio::can_query_v<const Executor&, asio::execution::context_t>)
        return &static_cast<const asio::execution_context&>(asio::query(executor, asio::execution::context));
    else if constexpr (requires { executor.context(); })
        return &static_cast<const asio::execution_context&>(executor.context());
    else
        return nullptr;
}

template <class H>
StoredCall StoredCall::store(H&& handler, const CallSite& site) {
    using B = Box<std::decay_t<H>>;
    async::detail::HandlerAllocator<B> alloc(site.completions->handler_memory());
    B* box = alloc.allocate(1);
    new (box) B{std::forward<H>(handler), site};
    StoredCall stored;
    stored.box_ = box;
    stored.table_ = &B::table;
    return stored;
}

template <class H>
void StoredCall::Box<H>::free(Box* box) noexcept {
    async::detail::HandlerAllocator<Box> alloc(box->site.completions->handler_memory());
    box->~Box();
    alloc.deallocate(box, 1);
}

// Asio's rule: the handler's memory is free before it runs (it may start the next call).
template <class H>
void StoredCall::Box<H>::complete(void* raw, Result<std::size_t>&& result) {
    auto* box = static_cast<Box*>(raw);
    asio::get_associated_cancellation_slot(box->handler).clear();
    H handler(std::move(box->handler));
    const CallSite site = box->site;
    free(box);
    struct Call {
        H handler;
        Result<std::size_t> result;
        void operator()() { std::move(handler)(std::move(result)); }
    };
    using Executor = std::decay_t<decltype(asio::get_associated_executor(handler, site.executor))>;
    const Executor executor = asio::get_associated_executor(handler, site.executor);
    if constexpr (std::is_same_v<asio::associated_allocator_t<H>, std::allocator<void>>) {
        Call call{std::move(handler), std::move(result)};
        // The service's memory is the endpoint's thread's: a call that completes in
        // another context (another io_context, a future's) is posted in Asio's own.
        if (context_of(executor) != &static_cast<const asio::execution_context&>(site.executor.context()))
            return asio::post(executor, std::move(call));
        // On the endpoint's io_context, the call completes through lib/async's service:
        // run as the driver handler that took its response ends, or posted in the
        // service's memory (a coroutine's handler names its executor type-erased,
        // any_io_executor, whose post wraps the call in memory of Asio's own cache: two
        // allocations per call when that cache holds blocks of other sizes). An
        // executor of its own there (a strand) gets the call in that memory.
        bool on_site = false;
        if constexpr (std::is_same_v<Executor, asio::io_context::executor_type>) {
            on_site = executor == site.executor;
        } else if constexpr (requires { executor.template target<asio::io_context::executor_type>(); }) {
            const auto* io = executor.template target<asio::io_context::executor_type>();
            on_site = io != nullptr && *io == site.executor;
        }
        if (on_site)
            return site.completions->post_completion(std::move(call));
        asio::post(executor, async::detail::with_memory(site.completions->handler_memory(), std::move(call)));
    } else { // the handler's own allocator, as Asio's rule asks
        asio::post(executor, Call{std::move(handler), std::move(result)});
    }
}

template <class H>
void StoredCall::Box<H>::destroy(void* raw) noexcept {
    auto* box = static_cast<Box*>(raw);
    asio::get_associated_cancellation_slot(box->handler).clear();
    free(box);
}

template <class H>
void StoredCall::Box<H>::on_cancel(void* raw, Target target) {
    auto slot = asio::get_associated_cancellation_slot(static_cast<Box*>(raw)->handler);
    if (!slot.is_connected())
        return;
    struct Cancel {
        Target target;
        void operator()(asio::cancellation_type type) const noexcept {
            // total asks for no side effect: only a call not yet sent ends (a begun one
            // may have run at the server); terminal and partial allow them
            constexpr auto with_effects = asio::cancellation_type::terminal | asio::cancellation_type::partial;
            if ((type & with_effects) != asio::cancellation_type::none ||
                (target.queued && (type & asio::cancellation_type::total) != asio::cancellation_type::none))
                cancel_call(target);
        }
    };
    slot.template emplace<Cancel>(Cancel{target});
}

} // namespace detail
} // namespace rdmaxx::rpc
