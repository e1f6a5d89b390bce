// The request slots of one session, client side (ClientWindow) and server side
// (ServerWindow): eRPC's protocol (go-back-N, credits, at-most-once), made safe. Pure
// logic: the windows decide what to send and what to accept; an endpoint (its UD QP,
// receive ring and timers) moves the packets. Both take what decode() (packet.hpp)
// accepted with the window's own PacketLimits, the header and the payload after it (a
// programming error otherwise: the windows rely on decode()'s checks of index, size
// and length), and trust nothing else in them.
//
// A session has a window of W slots. Calls are numbered 0, 1, 2, ... in the order the
// client begins them; call r lives in slot r % W, so a call waits while the call W
// before it is still in its slot (WindowFull) even when other slots are free. The price
// buys a bound: an honest client's numbers are dense, so the server drops any request
// number more than W beyond the highest it has seen. A call abandoned before any packet
// of it went gives its number back: the next call begun takes it (and its slot), so
// cancellations, a credit stall or binds still in flight (lib/rpc's windows) leave no
// gap. (A client whose W consecutive calls ended with every packet of theirs lost has
// desynchronised its session: the server answers its next request, too far ahead, with
// a reset (Status::out_of_step), and the client ends the session.)
//
// One call's packets (n_req request packets, n_resp response packets), each client
// packet answered by one server packet:
//
//   position p       client sends                       server answers
//   0 .. n_req-2     request packet p                   credit_return, index p
//   n_req-1          request packet n_req-1 (the last)  response packet 0 (after the handler)
//   n_req-1+k        request_for_response, index k      response packet k   (1 <= k < n_resp)
//
// A whole request (a descriptor sent as one packet over the session's RC QP: packet.hpp)
// has n_req = 1, whatever its size.
//
// The client learns n_resp from response packet 0 (its message size), so it asks for
// packets 1.. only then. It counts positions: `sent` (num_tx) and `received` (num_rx, in
// order). It takes an answer only for position `received`, and only while
// received < sent; anything else is dropped with a reason. Go-back-N: when a slot's RTO
// expires, sent goes back to received and the packets from there go again. A slot's
// RTO runs from its last send or in-order answer; a call's 8th expiry in a row
// (RtoConfig::max_timeouts) without progress ends it (timed_out).
//
// Credits: at most C packets of the session are in flight (sent, not yet answered), so
// the server's receive queue is never overrun by one session. The unanswered packets of
// a rolled-back or ended call count as lost: their credits come back at once. An answer
// that arrives later is taken only for a position sent again since (the answer to that
// resend is then a duplicate), so every credit comes back once. A session with a
// congestion controller has at most its window in flight (between 1 and C).
//
// The server runs a request's handler once (at-most-once): it keeps the response in the
// slot until the client begins call r + W there, and answers a retransmitted request
// packet or a request_for_response from it. While a handler runs, the slot is its: the
// packets of call r + W are dropped (handler_running) and come again after an RTO, so
// the handler's view of its request never changes under it; and a resent last packet
// of call r is answered in_progress: the client then counts no timeout (a handler may
// take longer than the retry cap's RTOs), returns the credit, and asks again one RTO
// later, and twice as long after each in_progress in a row, up to the RTO's ceiling (the
// server sends the response when it is ready, and the client takes it then, without
// waiting to ask: the question is for a lost one; a whole
// request asks by a probe, its header alone over UD: packet.hpp; so does one whose RC
// SEND completed, delivered(), until a probe goes unanswered). The
// call's own deadline still bounds it, and the session's liveness is its TCP
// connection's.
//
// Both ends number a session's calls from 0; a session set up again in the same table
// entry has a new generation, so packets of the old one are dropped (stale_session).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <source_location>
#include <span>
#include <variant>
#include <vector>

#include <rdmaxx/rpc/congestion.hpp>
#include <rdmaxx/wrap/deadline.hpp>

#include "packet.hpp"
#include "retransmit.hpp"

namespace rdmaxx::rpc::detail {

using Clock = std::chrono::steady_clock;

// A session at both ends: packets to this window carry `local`, its packets `remote`.
struct Route {
    SessionId local;
    SessionId remote;
};

// A packet to transmit: header_bytes of encode(header), then `payload`. The payload
// lies in the window's buffers: valid until the next call on that window.
struct Outgoing {
    PacketHeader header;
    std::span<const std::byte> payload;
};

// ---------------------------------------------------------------------------------
// Client

struct ClientOptions {
    std::uint32_t window = 8;   // W: calls in flight (eRPC's default)
    std::uint32_t credits = 32; // C: packets in flight (eRPC's default)
    RtoConfig rto{};
    // If not null: the session's congestion window (at most C packets in flight, at
    // least 1), told of every in-order answer and every RTO expiry (congestion.hpp).
    CongestionControl* congestion = nullptr;
    // If not null: counts the times a call had a packet to send and no room (credits
    // or congestion window) to send it in, once per wait.
    std::uint64_t* credit_stalls = nullptr;
};

// How a call ended.
enum class CallOutcome : std::uint8_t {
    ok,                 // the response is in CallEnd::response
    no_handler,         // the server's status (nothing delivered)
    too_large,          // the server's status (nothing delivered)
    handler_dropped,    // the server's status (nothing delivered)
    transfer_failed,    // the server's status (nothing delivered)
    response_truncated, // the response (CallEnd::response_size bytes) exceeds the call's
                        // response capacity: nothing delivered
    timed_out,          // RtoConfig::max_timeouts expiries in a row: the server or the
                        // path is gone (the session probably is too)
};

struct CallEnd {
    std::uint64_t request = 0;
    CallOutcome outcome = CallOutcome::ok;
    // ok: the response's size; response_truncated: the size it needed; else 0
    std::uint32_t response_size = 0;
    // ok: the response, valid until the next begin() (a single-packet response: the
    // packet's payload, valid while the packet is); else empty
    std::span<const std::byte> response;
    // ok: the response is a descriptor (its bytes came by RDMA)
    bool rdma = false;
};

// begin()'s answer when the call's slot is taken: begin again once the call
// `waits_for` has ended (CallEnd) or was abandoned.
struct WindowFull {
    std::uint64_t waits_for = 0;
};

// The calls of one client session. The driver:
//  - begin() a call, then send what next_packet() returns until it returns nothing;
//  - on each packet of this session from the server: receive(), then next_packet()
//    again (an answer returns a credit); a CallEnd goes to the caller;
//  - after each of these, (re)arms its timer for next_deadline(); when it fires,
//    expire() until it returns nothing (each CallEnd goes to the caller), then
//    next_packet() (what rolled back goes again);
//  - abandon() a call whose caller is gone (cancelled, destroyed).
// Thread safety: distinct objects: safe; shared: unsafe.
class ClientWindow {
public:
    // Programming error: window 0, credits 0, an RtoConfig RtoEstimator refuses.
    ClientWindow(const ClientOptions& options, PacketLimits limits, Route route,
                 std::source_location where = std::source_location::current());

    // How begin() keeps a request: a copy (the caller's buffer is free at once), or
    // the caller's bytes themselves, which must then stay valid and unchanged until
    // the call ends or is abandoned (the packets point into them).
    enum class Keep : std::uint8_t { copy, borrow };

    // Starts a call of handler `rpc_type` with the message `request` that accepts a
    // response of up to `response_capacity` bytes; `rdma`: the message is a
    // descriptor (packet.hpp), and so may the response be; `whole`: the descriptor goes
    // whole, as one packet (over RC: the driver sends a packet with the whole flag
    // there). Returns its request number, which names it from now on.
    // Programming error: a request above limits.max_message(); whole without rdma.
    std::expected<std::uint64_t, WindowFull> begin(std::uint8_t rpc_type, std::span<const std::byte> request,
                                                   std::uint32_t response_capacity, bool rdma = false,
                                                   Keep keep = Keep::copy, bool whole = false,
                                                   std::source_location where = std::source_location::current());

    // The call's caller is gone: its slot is free, whatever the server still sends for
    // it is dropped (stale_request), its packets in flight are written off. True: no
    // packet of it went (the server cannot know of it), and its number goes to the next
    // call begun. Programming error: `request` is not a call in progress (never begun,
    // ended, abandoned).
    bool abandon(std::uint64_t request, std::source_location where = std::source_location::current());

    // Call `request`'s packets wait until its slot is resumed: binds of memory windows
    // posted in its slot are in flight (its own, whose keys its server may use once a
    // packet arrives, or an abandoned call's, whose windows its answer would free). The
    // window's other calls go on. Programming error: `request` is not a call in progress.
    void hold(std::uint64_t request, std::source_location where = std::source_location::current());
    // The call in slot `slot` (its request number modulo the window), if held, may send.
    void resume(std::size_t slot) noexcept { slots_[slot].held = false; }

    // The next packet to send, if a call has one and a credit is free. It counts as
    // sent at `now` (its RTO runs from there).
    std::optional<Outgoing> next_packet(Clock::time_point now);

    // A packet the server sent to this session (decoded; the payload follows the
    // header). A value: taken (with the call's end when it was the last); an error: dropped.
    std::expected<std::optional<CallEnd>, DropReason> receive(const PacketHeader& header,
                                                              std::span<const std::byte> payload,
                                                              Clock::time_point now);

    // The server's answer to descriptor call `request` came over the session's RC path
    // (a WRITE_WITH_IMM into the memory it offered, rc_codec.hpp) rather than as
    // response packet 0: `descriptor` is the response descriptor that packet would carry
    // (valid while the CallEnd is). It ends the call as that packet would, and also while
    // the call's request packets are rolled back or it waits after in_progress: the
    // server had the whole request. An error: dropped (stale_request: not a call in
    // progress; inconsistent: not a descriptor call).
    std::expected<CallEnd, DropReason> written(std::uint64_t request, std::span<const std::byte> descriptor,
                                               Clock::time_point now);

    // Call `request`'s whole request is in the server's receive buffer (its RC SEND is
    // complete): a resend after an RTO asks by a probe, as after in_progress, rather than
    // SENDing it again. A probe that is not answered either rolls back to the whole
    // request (the server may have dropped it: a probe names only a call it has). Nothing
    // for a call no longer in progress, or not whole.
    void delivered(std::uint64_t request) noexcept;

    // When the earliest RTO of a call with packets in flight expires; nothing when none has.
    std::optional<Clock::time_point> next_deadline() const noexcept;

    // Rolls back every call whose RTO expired by `now` (go-back-N; next_packet() resends)
    // and ends the first that reached the retry cap: call again until it returns nothing.
    std::optional<CallEnd> expire(Clock::time_point now);

    // The number the next call begun will have (its slot: next_request() % window): the
    // lowest given back by a call abandoned unsent, else a new one.
    std::uint64_t next_request() const noexcept { return given_back_.empty() ? next_request_ : given_back_.front(); }

    // Packets sent and not answered yet (at most ClientOptions::credits).
    std::uint32_t in_flight() const noexcept { return in_flight_; }
    // The session's current retransmission timeout, for statistics.
    std::chrono::nanoseconds rto() const noexcept { return rto_.rto(); }

private:
    struct Slot {
        bool busy = false;
        std::uint64_t request = 0;
        std::uint8_t rpc_type = 0;
        std::vector<std::byte> request_bytes;   // a copied request
        std::span<const std::byte> request_view; // the request: request_bytes, or borrowed
        bool request_rdma = false, response_rdma = false; // descriptors
        bool request_whole = false;          // one packet, over RC
        bool probing = false;                // whole, and the server has it: resends are probes
        bool last_was_probe = false;         // the last packet sent
        std::uint32_t request_packets = 0;   // n_req
        std::uint32_t response_capacity = 0;
        std::uint32_t response_packets = 0;  // n_resp; 0 until response packet 0 arrives
        std::vector<std::byte> response_bytes;
        bool on_wire = false;       // a packet of it went: the server may know its number
        bool held = false;          // hold(): no packet goes until resume()
        std::uint32_t sent = 0;     // positions sent (num_tx)
        std::uint32_t received = 0; // positions answered, in order (num_rx)
        std::uint32_t timeouts = 0; // consecutive, since the call last made progress
        Transmissions transmissions = Transmissions::once;
        Clock::time_point last_sent{};
        Clock::time_point deadline{}; // while sent > received
        Clock::time_point resend_at{}; // told in_progress: the last request packet goes again then
        std::uint32_t told_in_progress = 0; // times so far: each doubles the wait until resend_at
    };

    // Inline, as ServerWindow's below: slots.cpp, their only caller, inlines them into
    // the call path (each call boundary there is a prologue, an epilogue and argument
    // moves, and under emulation a round trip pays for every distinct instruction it
    // runs: bench/results/rpc-round-trip.md).
    // The positions the call has to send as far as it knows: n_req until response
    // packet 0 tells n_resp, then n_req + n_resp - 1; 0 for a free slot.
    static inline std::uint32_t sendable(const Slot& slot) noexcept;
    inline Outgoing packet_at(const Slot& slot, std::uint32_t position) const noexcept;
    inline std::expected<std::optional<CallEnd>, DropReason> take(Slot& slot, const PacketHeader& header,
                                                                  std::span<const std::byte> payload,
                                                                  Clock::time_point now);
    inline CallEnd end(Slot& slot, CallOutcome outcome, std::uint32_t response_size,
                       std::span<const std::byte> response = {}) noexcept;
    // The slot's next position (received) was answered in order at `now`: its credit
    // back, the RTO sampled when nothing else of it is in flight (Karn), and told to
    // the congestion controller.
    inline void answered(Slot& slot, Clock::time_point now) noexcept;
    inline void write_off(Slot& slot) noexcept; // its unanswered packets: lost
    inline void release(Slot& slot) noexcept;   // written off and free

    PacketLimits limits_;
    Route route_;
    std::uint32_t credits_;
    CongestionControl* congestion_;
    std::uint64_t* credit_stalls_;
    bool stalled_ = false; // next_packet() found no room for a packet, none sent since
    RtoEstimator rto_;
    std::vector<Slot> slots_;
    std::uint64_t next_request_ = 0; // the lowest number not yet begun
    // numbers of calls abandoned before a packet of theirs went, lowest first (at most
    // the window's; their slots stay free for them): begin() takes them before new ones
    std::vector<std::uint64_t> given_back_;
    std::uint32_t in_flight_ = 0;
    std::size_t cursor_ = 0; // next_packet() serves the slots round-robin from here
    // Slots with a packet to send (sent < sendable(), resend_at or not): next_packet()
    // scans the window only when there is one (pump() asks until it gets nothing: a
    // scan of the window per event, twice per call, without it). Kept by begin(),
    // next_packet(), take() (a response's size learnt), write_off() and release().
    std::uint32_t unsent_slots_ = 0;
};

// ---------------------------------------------------------------------------------
// Server

// The handler must run for a request that arrived whole: respond(request, ...) when it
// has. `message` stays valid until then, unless it is `lent`: a one-packet request is
// not copied into the window but lent where it arrived (the payload given to
// receive()), valid only as long as that is; keep() copies it when the handler needs
// it longer.
struct HandlerCall {
    std::uint64_t request = 0;
    std::uint8_t rpc_type = 0;
    std::span<const std::byte> message;
    bool rdma = false; // the message is a descriptor (packet.hpp)
    bool lent = false;
};

// What a packet from the client asks the server's driver to do.
using ServerStep = std::variant<Outgoing, HandlerCall>;

// The requests of one server session. The driver:
//  - on each request or request_for_response of this session: receive(); an Outgoing
//    goes back to the client at once; a HandlerCall runs the handler (now or later);
//  - when the handler answers (or there is none for the rpc type: no_handler, or it
//    ended without an answer: handler_dropped): respond(), and sends what it returns.
// The server keeps no timer: the client retransmits, the server answers again.
// Thread safety: distinct objects: safe; shared: unsafe.
class ServerWindow {
public:
    // `copies`, if not null: counts the request packets copied into the window (every
    // packet of a multi-packet request, and a lent request kept).
    // Programming error: window 0.
    ServerWindow(std::uint32_t window, PacketLimits limits, Route route, std::uint64_t* copies = nullptr,
                 std::source_location where = std::source_location::current());

    // A packet the client sent to this session (decoded; the payload follows the header).
    // An error: dropped, nothing to send.
    std::expected<ServerStep, DropReason> receive(const PacketHeader& header, std::span<const std::byte> payload);

    // The handler's answer to `request`: its response packet 0 to send. The response is
    // copied and kept for resends; one above limits.max_message() becomes status
    // too_large with no bytes. `rdma`: the response is a descriptor (the bytes went by
    // RDMA into the memory the request's descriptor offered).
    // Whether `request` awaits its handler's answer (a HandlerCall named it, respond() has not).
    bool awaiting(std::uint64_t request) const noexcept;

    // The lent request `lent` (the HandlerCall's message, still valid) copied into the
    // window, valid until respond(): for a handler that answers later.
    // Programming error: `request` is not a lent request awaiting its handler, or
    // `lent` is not its size.
    std::span<const std::byte> keep(std::uint64_t request, std::span<const std::byte> lent,
                                    std::source_location where = std::source_location::current());

    // Programming error: `request` is not awaiting its handler (no HandlerCall named it,
    // or respond() ran already); a status that is not a response's (session_unknown,
    // server_busy); a response with bytes and a status other than ok; `rdma` with a
    // status other than ok, or for a request that was not a descriptor.
    Outgoing respond(std::uint64_t request, Status status, std::span<const std::byte> response, bool rdma = false,
                     std::source_location where = std::source_location::current());

private:
    enum class Phase : std::uint8_t { unused, receiving, handling, answered };
    struct Slot {
        Phase phase = Phase::unused;
        std::uint64_t request = 0;
        std::uint8_t rpc_type = 0;
        bool request_rdma = false, response_rdma = false; // descriptors
        bool request_whole = false;
        bool lent = false;          // the request is the handler's loan, not in request_bytes
        std::uint32_t request_size = 0;
        std::vector<std::byte> request_bytes;
        std::uint32_t request_packets = 0;
        std::uint32_t received = 0; // request packets, in order
        Status status = Status::ok;
        std::vector<std::byte> response_bytes;
    };

    inline std::expected<ServerStep, DropReason> take_request(Slot& slot, const PacketHeader& header,
                                                              std::span<const std::byte> payload);
    std::expected<ServerStep, DropReason> take_request_for_response(const Slot& slot, const PacketHeader& header) const;
    Outgoing credit_return(const Slot& slot, std::uint16_t index) const noexcept;
    Outgoing in_progress(const Slot& slot) const noexcept;
    inline Outgoing response_packet(const Slot& slot, std::uint16_t index) const noexcept;

    PacketLimits limits_;
    Route route_;
    std::vector<Slot> slots_;
    std::uint64_t seen_below_ = 0; // 1 + the highest new request number seen within the bound
    std::uint64_t* copies_;
};

} // namespace rdmaxx::rpc::detail
