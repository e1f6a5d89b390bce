// An endpoint's sessions, client and server alike, in one table: the session numbers
// its peers' packets carry (packet.hpp: 16 bits), a generation per number, the
// endpoint's per-session state T, and the receive ring's budget.
//
// Numbers and generations. An entry is free, reserved (a SessionId, no T yet) or live
// (a T). Each reservation of a number gives it the next generation (1, 2, ...; 0 is
// skipped when it wraps, so 0 names no session), so a packet of an ended session that
// arrives after its number was taken again is recognised: lookup() gives nullptr for a
// free entry, a reserved one and a stale generation alike. Numbers are reused in the
// order they were released (oldest first), which keeps a just-released number idle as
// long as the table allows.
//
// The receive ring. The endpoint's UD receive queue holds `ring_buffers` buffers, and
// every packet a peer sends to it takes one until the endpoint reposts it. A session
// with C credits has at most C packets in flight to this endpoint (a server session:
// C requests from its client; a client session: the C answers to its C packets in
// flight), so each session reserves its C buffers while it lives and the ring is never
// overrun: the credits of the reserved and live sessions never add up to more than
// ring_buffers.
//
// How an endpoint drives it:
//  - server, when a SessionRequest arrives on a new control connection (session_codec.hpp):
//    a version it does not speak -> reply version_unsupported; shutting down -> reply
//    shutting_down; else admit(request, its maxima): a Refusal -> reply with it and
//    close; an Admitted -> attach() its state (a ServerWindow on Route{admitted.session,
//    request.session} and the agreed limits, the AH to request.client, the control
//    connection), then reply accepted with its UD address, admitted.session and
//    admitted.limits. If making that state fails (the AH), release() and close.
//  - client, to open a session: reserve(credits it asks): a Refusal is its caller's
//    Error; send a SessionRequest with that SessionId; on the reply: a refusal, an
//    Error or a failing check_reply() -> release(); accepted -> reduce_credits() to the
//    agreed credits, attach() its state (a ClientWindow on Route{id, reply.session}).
//  - on each packet: lookup(SessionId{header.session, header.generation}); nullptr:
//    drop it (stale_session).
//  - when the session ends (its control connection's end, a close): release().
//
// Thread safety: distinct objects: safe; shared: unsafe.
#pragma once

#include <cstdint>
#include <deque>
#include <expected>
#include <optional>
#include <source_location>
#include <utility>
#include <vector>

#include <rdmaxx/wrap/error.hpp>

#include "packet.hpp"
#include "session_codec.hpp"

namespace rdmaxx::rpc::detail {

// The most sessions a table holds: numbers 0..65534 (the header's 16 bits).
inline constexpr std::uint32_t max_table_sessions = 0xffff;

// What the server agreed to for an admitted request.
struct Admitted {
    SessionId session; // the server's: the client's packets carry it
    SessionLimits limits;
    friend bool operator==(const Admitted&, const Admitted&) = default;
};

// The limits a server agrees to for `asked`, given the most it serves: each the smaller
// of the two, the sizes also cut to max_packets packets of the agreed payload per packet
// (which a smaller MTU than the client's may have lowered). Never above `asked`.
// Programming error: either outside check_limits()'s bounds.
SessionLimits agree(const SessionLimits& asked, const SessionLimits& most,
                    std::source_location where = std::source_location::current());

// The table. T is the endpoint's per-session state; it needs no default constructor.
template <class T>
class SessionTable {
public:
    // Programming error: max_sessions outside 1..max_table_sessions, ring_buffers 0.
    SessionTable(std::uint32_t max_sessions, std::uint32_t ring_buffers,
                 std::source_location where = std::source_location::current())
        : ring_buffers_(ring_buffers) {
        require(max_sessions >= 1 && max_sessions <= max_table_sessions, where,
                "SessionTable: {} sessions (1..{})", max_sessions, max_table_sessions);
        require(ring_buffers >= 1, where, "SessionTable: a receive ring of 0 buffers");
        entries_.resize(max_sessions);
        for (std::uint32_t n = 0; n < max_sessions; ++n)
            free_.push_back(static_cast<std::uint16_t>(n));
    }

    // The server's accept path in one call: the limits agreed with `request` (agree()
    // with `most`, the server's maxima) and a reserved entry with their credits (twice
    // `both_ways`: requests come in from the client and answers to the server's own
    // calls), or why not: too_many_sessions (no free number), then ring_full (fewer free
    // buffers than that). attach() the session's state next.
    // Programming error: `request` or `most` outside check_limits()'s bounds (a
    // decoded request never is).
    std::expected<Admitted, Refusal> admit(const SessionRequest& request, const SessionLimits& most,
                                           bool both_ways = false,
                                           std::source_location where = std::source_location::current()) {
        const SessionLimits agreed = agree(request.limits, most, where);
        const auto session = reserve(both_ways ? 2 * agreed.credits : agreed.credits, where);
        if (!session)
            return std::unexpected(session.error());
        return Admitted{.session = *session, .limits = agreed};
    }

    // A free number with its next generation, and `credits` buffers of the ring; or
    // too_many_sessions, then ring_full. The entry has no state until attach().
    // Programming error: credits 0.
    std::expected<SessionId, Refusal> reserve(std::uint32_t credits,
                                              std::source_location where = std::source_location::current()) {
        require(credits >= 1, where, "SessionTable::reserve: 0 credits");
        if (free_.empty())
            return std::unexpected(Refusal::too_many_sessions);
        if (credits > free_buffers())
            return std::unexpected(Refusal::ring_full);
        const std::uint16_t number = free_.front();
        free_.pop_front();
        Entry& entry = entries_[number];
        entry.generation = entry.generation == 0xffffffff ? 1 : entry.generation + 1;
        entry.credits = credits;
        reserved_buffers_ += credits;
        return SessionId{.number = number, .generation = entry.generation};
    }

    // Gives back the buffers above `credits` (a client whose server agreed to fewer
    // credits than it reserved).
    // Programming error: `session` is not reserved or live; more credits than it holds, or 0.
    void reduce_credits(SessionId session, std::uint32_t credits,
                        std::source_location where = std::source_location::current()) {
        Entry& entry = taken(session, "reduce_credits", where);
        require(credits >= 1 && credits <= entry.credits, where,
                "SessionTable::reduce_credits: {} credits (1..{}, what it holds)", credits, entry.credits);
        reserved_buffers_ -= entry.credits - credits;
        entry.credits = credits;
    }

    // The reserved session's state, in place: lookup() finds it from now on.
    // Programming error: `session` is not reserved (free, stale, or attached already).
    T& attach(SessionId session, T state, std::source_location where = std::source_location::current()) {
        Entry& entry = taken(session, "attach", where);
        require(!entry.state, where, "SessionTable::attach: session {}/{} has its state already", session.number,
                session.generation);
        return entry.state.emplace(std::move(state));
    }

    // The live session `session` names (a number and generation from a packet: any
    // value), or nullptr: out of range, free, reserved without state, another generation.
    // Always inlined: every packet and call looks its session up.
    [[gnu::always_inline]] T* lookup(SessionId session) noexcept {
        return holds(session) && entries_[session.number].state ? &*entries_[session.number].state : nullptr;
    }
    const T* lookup(SessionId session) const noexcept {
        return holds(session) && entries_[session.number].state ? &*entries_[session.number].state : nullptr;
    }

    // The live session numbered `number` (any value), whatever its generation, or
    // nullptr: for what names a session by number only (an RC immediate), whose caller
    // then checks it is the session meant.
    T* current(std::uint16_t number) noexcept {
        return number < entries_.size() && entries_[number].state ? &*entries_[number].state : nullptr;
    }

    // Ends the session: its state is destroyed, its buffers and number come back.
    // Programming error: `session` is not reserved or live (free, stale: released already).
    void release(SessionId session, std::source_location where = std::source_location::current()) {
        Entry& entry = taken(session, "release", where);
        entry.state.reset();
        reserved_buffers_ -= entry.credits;
        entry.credits = 0;
        free_.push_back(session.number);
    }

    // The live sessions (with state), in number order: for an endpoint that ends them all.
    std::vector<SessionId> live() const {
        std::vector<SessionId> ids;
        for (std::size_t n = 0; n < entries_.size(); ++n)
            if (entries_[n].state)
                ids.push_back({.number = static_cast<std::uint16_t>(n), .generation = entries_[n].generation});
        return ids;
    }

    std::uint32_t max_sessions() const noexcept { return static_cast<std::uint32_t>(entries_.size()); }
    // Entries reserved or live.
    std::uint32_t sessions() const noexcept { return max_sessions() - static_cast<std::uint32_t>(free_.size()); }
    std::uint32_t ring_buffers() const noexcept { return ring_buffers_; }
    // Ring buffers no session has reserved.
    std::uint32_t free_buffers() const noexcept { return ring_buffers_ - reserved_buffers_; }

private:
    struct Entry {
        std::uint32_t generation = 0; // the latest reservation's; 0: never reserved
        std::uint32_t credits = 0;    // 0: free
        std::optional<T> state;
    };

    // Whether `session` names a reserved or live entry, in its generation (inlined, as
    // lookup()).
    [[gnu::always_inline]] bool holds(SessionId session) const noexcept {
        return session.number < entries_.size() && entries_[session.number].credits != 0 &&
               entries_[session.number].generation == session.generation;
    }
    Entry& taken(SessionId session, const char* call, std::source_location where) {
        require(holds(session), where, "SessionTable::{}: session {}/{} is not reserved or live (free or stale)", call,
                session.number, session.generation);
        return entries_[session.number];
    }

    std::vector<Entry> entries_;
    std::deque<std::uint16_t> free_; // oldest released first
    std::uint32_t ring_buffers_;
    std::uint32_t reserved_buffers_ = 0;
};

} // namespace rdmaxx::rpc::detail
