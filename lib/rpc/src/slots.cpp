#include "slots.hpp"

#include <algorithm>
#include <cstring>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::rpc::detail {
namespace {

bool addressed_to(const PacketHeader& header, const SessionId& session) noexcept {
    return header.session == session.number && header.generation == session.generation;
}

// A packet of `kind` for the peer's end of the route, about message `size` of call `request`.
PacketHeader header_for(const Route& route, Kind kind, std::uint64_t request, std::uint8_t rpc_type,
                        std::uint32_t size, std::uint32_t index, Status status = Status::ok,
                        bool rdma = false) noexcept {
    return {.kind = kind,
            .rpc_type = rpc_type,
            .status = status,
            .session = route.remote.number,
            .generation = route.remote.generation,
            .message_size = size,
            .request = request,
            .index = static_cast<std::uint16_t>(index),
            .rdma = rdma};
}

// Packet `index` of `message`: its bytes (a whole message's one packet: all).
std::span<const std::byte> share(std::span<const std::byte> message, std::uint32_t index,
                                 std::uint32_t payload_per_packet, bool whole = false) noexcept {
    if (whole)
        return message;
    const auto size = static_cast<std::uint32_t>(message.size());
    return message.subspan(std::size_t{index} * payload_per_packet, payload_bytes(size, index, payload_per_packet));
}

// Copies packet `index`'s payload into its place in `message` (sized for the whole).
void place(std::vector<std::byte>& message, std::uint32_t index, std::uint32_t payload_per_packet,
           std::span<const std::byte> payload) noexcept {
    if (!payload.empty())
        std::memcpy(message.data() + std::size_t{index} * payload_per_packet, payload.data(), payload.size());
}

CallOutcome outcome_of(Status status) noexcept {
    switch (status) {
    case Status::no_handler: return CallOutcome::no_handler;
    case Status::too_large: return CallOutcome::too_large;
    case Status::handler_dropped: return CallOutcome::handler_dropped;
    case Status::transfer_failed: return CallOutcome::transfer_failed;
    case Status::ok:
    case Status::session_unknown:
    case Status::server_busy:
    case Status::out_of_step: break; // decode() lets none of the last three into a response
    }
    return CallOutcome::ok;
}

} // namespace

// ---------------------------------------------------------------------------------
// ClientWindow

ClientWindow::ClientWindow(const ClientOptions& options, PacketLimits limits, Route route, std::source_location where)
    : limits_(limits), route_(route), credits_(options.credits), congestion_(options.congestion),
      credit_stalls_(options.credit_stalls), rto_(options.rto, where), slots_(options.window) {
    require(options.window > 0, where, "ClientWindow: a window of 0 slots");
    require(options.credits > 0, where, "ClientWindow: 0 credits");
    given_back_.reserve(options.window);
}

std::expected<std::uint64_t, WindowFull> ClientWindow::begin(std::uint8_t rpc_type, std::span<const std::byte> request,
                                                             std::uint32_t response_capacity, bool rdma, Keep keep,
                                                             bool whole, std::source_location where) {
    require(request.size() <= limits_.max_message(), where, "ClientWindow::begin: a {}-byte request, the most is {}",
            request.size(), limits_.max_message());
    require(!whole || rdma, where, "ClientWindow::begin: a whole request that is not a descriptor");
    const std::uint64_t number = next_request();
    Slot& slot = slots_[number % slots_.size()];
    if (slot.busy)
        return std::unexpected(WindowFull{slot.request});
    if (number == next_request_) [[likely]]
        ++next_request_;
    else
        given_back_.erase(given_back_.begin());
    slot.busy = true;
    slot.request = number;
    slot.rpc_type = rpc_type;
    if (keep == Keep::copy) {
        slot.request_bytes.assign(request.begin(), request.end());
        slot.request_view = slot.request_bytes;
    } else {
        slot.request_view = request;
    }
    slot.request_rdma = rdma;
    slot.request_whole = whole;
    slot.probing = false;
    slot.last_was_probe = false;
    slot.response_rdma = false;
    slot.request_packets = packets_of(static_cast<std::uint32_t>(request.size()), whole, limits_.payload_per_packet());
    slot.response_capacity = response_capacity;
    slot.response_packets = 0;
    slot.response_bytes.clear();
    slot.on_wire = false;
    slot.held = false;
    slot.sent = 0;
    slot.received = 0;
    slot.timeouts = 0;
    slot.transmissions = Transmissions::once;
    slot.resend_at = {};
    slot.told_in_progress = 0;
    ++unsent_slots_; // request_packets >= 1
    return slot.request;
}

bool ClientWindow::abandon(std::uint64_t request, std::source_location where) {
    Slot& slot = slots_[request % slots_.size()];
    require(slot.busy && slot.request == request, where, "ClientWindow::abandon: call {} is not in progress", request);
    const bool unsent = !slot.on_wire;
    if (unsent) // the server never heard of it: its number goes to the next call
        given_back_.insert(std::ranges::upper_bound(given_back_, request), request);
    release(slot);
    return unsent;
}

void ClientWindow::hold(std::uint64_t request, std::source_location where) {
    Slot& slot = slots_[request % slots_.size()];
    require(slot.busy && slot.request == request, where, "ClientWindow::hold: call {} is not in progress", request);
    slot.held = true;
}

[[gnu::always_inline]]
std::uint32_t ClientWindow::sendable(const Slot& slot) noexcept {
    if (!slot.busy)
        return 0;
    return slot.response_packets == 0 ? slot.request_packets : slot.request_packets + slot.response_packets - 1;
}

[[gnu::always_inline]]
Outgoing ClientWindow::packet_at(const Slot& slot, std::uint32_t position) const noexcept {
    if (position < slot.request_packets) {
        Outgoing out{header_for(route_, Kind::request, slot.request, slot.rpc_type,
                                static_cast<std::uint32_t>(slot.request_view.size()), position, Status::ok,
                                slot.request_rdma),
                     slot.probing ? std::span<const std::byte>{}
                                  : share(slot.request_view, position, limits_.payload_per_packet(), slot.request_whole)};
        out.header.whole = slot.request_whole;
        out.header.probe = slot.probing;
        return out;
    }
    return {header_for(route_, Kind::request_for_response, slot.request, slot.rpc_type,
                       static_cast<std::uint32_t>(slot.response_bytes.size()), position - slot.request_packets + 1),
            {}};
}

std::optional<Outgoing> ClientWindow::next_packet(Clock::time_point now) {
    if (unsent_slots_ == 0)
        return std::nullopt;
    const std::uint32_t room =
        congestion_ == nullptr ? credits_ : std::clamp(congestion_->window(), std::uint32_t{1}, credits_);
    const std::size_t n = slots_.size();
    // round-robin from the cursor without a division per slot
    for (std::size_t i = 0, k = cursor_; i < n; ++i, k = k + 1 == n ? 0 : k + 1) {
        Slot& slot = slots_[k];
        if (slot.sent >= sendable(slot) || now < slot.resend_at || slot.held)
            continue;
        if (in_flight_ >= room) {
            if (!stalled_ && credit_stalls_ != nullptr)
                ++*credit_stalls_;
            stalled_ = true;
            return std::nullopt;
        }
        stalled_ = false;
        cursor_ = k + 1 == n ? 0 : k + 1;
        const Outgoing out = packet_at(slot, slot.sent);
        slot.last_was_probe = out.header.probe;
        slot.on_wire = true;
        if (++slot.sent == sendable(slot))
            --unsent_slots_;
        ++in_flight_;
        slot.last_sent = now;
        slot.deadline = now + rto_.rto();
        return out;
    }
    return std::nullopt;
}

std::expected<std::optional<CallEnd>, DropReason> ClientWindow::receive(const PacketHeader& header,
                                                                        std::span<const std::byte> payload,
                                                                        Clock::time_point now) {
    if (!addressed_to(header, route_.local))
        return std::unexpected(DropReason::stale_session);
    if (header.kind != Kind::credit_return && header.kind != Kind::response && header.kind != Kind::in_progress)
        return std::unexpected(DropReason::wrong_kind);
    Slot& slot = slots_[header.request % slots_.size()];
    if (!slot.busy || slot.request != header.request)
        return std::unexpected(DropReason::stale_request);
    return take(slot, header, payload, now);
}

[[gnu::always_inline]]
std::expected<std::optional<CallEnd>, DropReason> ClientWindow::take(Slot& slot, const PacketHeader& header,
                                                                     std::span<const std::byte> payload,
                                                                     Clock::time_point now) {
    const bool is_response = header.kind == Kind::response;
    // an answer about the request names it as it was sent (whole or in packets)
    if (header.rpc_type != slot.rpc_type ||
        (!is_response && (header.message_size != slot.request_view.size() || header.whole != slot.request_whole)))
        return std::unexpected(DropReason::inconsistent);
    const std::uint32_t position = is_response ? slot.request_packets - 1 + header.index : header.index;
    if (position < slot.received)
        return std::unexpected(DropReason::duplicate);
    if (position > slot.received)
        return std::unexpected(DropReason::out_of_order);
    // Told in_progress, a call waits to ask again (its last request packet written off
    // until resend_at), but the server sends the response as soon as the handler
    // answers: that is the answer the question would get, taken as if it had been asked.
    const bool after_in_progress =
        is_response && header.index == 0 && slot.told_in_progress > 0 && position + 1 == slot.request_packets;
    if (position >= slot.sent && !after_in_progress)
        return std::unexpected(DropReason::unsolicited);
    if (header.kind == Kind::in_progress) {
        // the server has the whole request and works on it: no progress, but an answer
        // (a round trip, and the path alive). The last request packet goes again, as a
        // question whether the response is ready (a whole request's: its header alone,
        // a probe), after an RTO doubled for each in_progress before: the server sends
        // the response once it is ready, so the question is only for a lost one
        rto_.measured(now - slot.last_sent, slot.transmissions);
        write_off(slot);
        slot.probing = slot.request_whole;
        slot.timeouts = 0;
        slot.resend_at = now + rto_.backed_off(slot.told_in_progress++);
        return std::nullopt;
    }
    // header.index >= 1: response packet 0 set the size, an ok status and n_resp > 1
    if (is_response && header.index >= 1 &&
        (header.message_size != slot.response_bytes.size() || header.status != Status::ok ||
         header.rdma != slot.response_rdma))
        return std::unexpected(DropReason::inconsistent);
    // a descriptor answers only a descriptor (it names memory the request offered)
    if (is_response && header.rdma && !slot.request_rdma)
        return std::unexpected(DropReason::inconsistent);

    if (position == slot.sent) { // after_in_progress: the last request packet is back in flight, answered ...
        if (++slot.sent == sendable(slot))
            --unsent_slots_;
        ++in_flight_;
        slot.resend_at = {}; // ... so the rest of the response is asked for now ...
        slot.transmissions = Transmissions::retransmitted; // ... and it is no RTO sample: the handler's time is in it
    }
    answered(slot, now);
    if (!is_response)
        return std::nullopt;
    if (header.index == 0) {
        if (header.status != Status::ok)
            return end(slot, outcome_of(header.status), 0);
        if (header.message_size > slot.response_capacity)
            return end(slot, CallOutcome::response_truncated, header.message_size);
        slot.response_rdma = header.rdma;
        slot.response_packets = packet_count(header.message_size, limits_.payload_per_packet());
        if (slot.response_packets == 1) // the whole response: it goes on from where it lies
            return end(slot, CallOutcome::ok, header.message_size, payload);
        ++unsent_slots_; // all its request was sent: now the rest of the response is asked for
        slot.response_bytes.resize(header.message_size);
    }
    place(slot.response_bytes, header.index, limits_.payload_per_packet(), payload);
    if (slot.received == sendable(slot))
        return end(slot, CallOutcome::ok, static_cast<std::uint32_t>(slot.response_bytes.size()));
    return std::nullopt;
}

std::expected<CallEnd, DropReason> ClientWindow::written(std::uint64_t request, std::span<const std::byte> descriptor,
                                                         Clock::time_point now) {
    Slot& slot = slots_[request % slots_.size()];
    if (!slot.busy || slot.request != request)
        return std::unexpected(DropReason::stale_request);
    if (!slot.request_rdma)
        return std::unexpected(DropReason::inconsistent);
    // the last request packet in flight, all before it answered: the answer to it, as
    // response packet 0 would be (anything else in flight is written off by end())
    if (slot.sent == slot.request_packets && slot.received + 1 == slot.sent)
        answered(slot, now);
    slot.response_rdma = true;
    return end(slot, CallOutcome::ok, static_cast<std::uint32_t>(descriptor.size()), descriptor);
}

[[gnu::always_inline]]
void ClientWindow::answered(Slot& slot, Clock::time_point now) noexcept {
    ++slot.received;
    --in_flight_;
    slot.timeouts = 0;
    slot.deadline = now + rto_.rto();
    const bool sample = slot.received == slot.sent;
    if (sample)
        rto_.measured(now - slot.last_sent, slot.transmissions);
    if (congestion_ != nullptr)
        congestion_->answered(sample && slot.transmissions == Transmissions::once
                                  ? std::optional(now - slot.last_sent)
                                  : std::nullopt);
}

[[gnu::always_inline]]
CallEnd ClientWindow::end(Slot& slot, CallOutcome outcome, std::uint32_t response_size,
                          std::span<const std::byte> response) noexcept {
    release(slot);
    CallEnd ended{.request = slot.request, .outcome = outcome, .response_size = response_size, .response = {}};
    if (outcome == CallOutcome::ok) {
        // a single-packet response is the packet's payload (`response`), a longer one was assembled
        ended.response = response.data() != nullptr ? response : std::span<const std::byte>(slot.response_bytes);
        ended.rdma = slot.response_rdma;
    }
    return ended;
}

[[gnu::always_inline]]
void ClientWindow::write_off(Slot& slot) noexcept {
    if (slot.sent == slot.received)
        return;
    if (slot.sent == sendable(slot))
        ++unsent_slots_; // they go again
    in_flight_ -= slot.sent - slot.received;
    slot.sent = slot.received;
}

[[gnu::always_inline]]
void ClientWindow::release(Slot& slot) noexcept {
    write_off(slot);
    if (slot.sent < sendable(slot))
        --unsent_slots_;
    slot.busy = false;
    slot.request_view = {}; // a borrowed request is the caller's again
}

std::optional<Clock::time_point> ClientWindow::next_deadline() const noexcept {
    std::optional<Clock::time_point> earliest;
    for (const Slot& slot : slots_) {
        if (!slot.busy)
            continue;
        if (slot.sent > slot.received && (!earliest || slot.deadline < *earliest))
            earliest = slot.deadline;
        // a call told its request is in progress asks again then
        if (slot.sent == slot.received && slot.sent < sendable(slot) && slot.resend_at != Clock::time_point{} &&
            (!earliest || slot.resend_at < *earliest))
            earliest = slot.resend_at;
    }
    return earliest;
}

void ClientWindow::delivered(std::uint64_t request) noexcept {
    Slot& slot = slots_[request % slots_.size()];
    if (slot.busy && slot.request == request && slot.request_whole)
        slot.probing = true;
}

std::optional<CallEnd> ClientWindow::expire(Clock::time_point now) {
    for (Slot& slot : slots_) {
        if (!slot.busy || slot.sent == slot.received || slot.deadline > now)
            continue;
        if (congestion_ != nullptr)
            congestion_->timed_out();
        if (rto_.timed_out(++slot.timeouts) == OnTimeout::give_up)
            return end(slot, CallOutcome::timed_out, 0);
        // a probe the server never answered, where only a SEND's completion said it had
        // the request: the request goes whole again
        if (slot.last_was_probe && slot.told_in_progress == 0)
            slot.probing = false;
        write_off(slot);
        slot.transmissions = Transmissions::retransmitted;
    }
    return std::nullopt;
}

// ---------------------------------------------------------------------------------
// ServerWindow

ServerWindow::ServerWindow(std::uint32_t window, PacketLimits limits, Route route, std::uint64_t* copies,
                           std::source_location where)
    : limits_(limits), route_(route), slots_(window), copies_(copies) {
    require(window > 0, where, "ServerWindow: a window of 0 slots");
}

std::expected<ServerStep, DropReason> ServerWindow::receive(const PacketHeader& header,
                                                            std::span<const std::byte> payload) {
    if (!addressed_to(header, route_.local))
        return std::unexpected(DropReason::stale_session);
    if (header.kind != Kind::request && header.kind != Kind::request_for_response)
        return std::unexpected(DropReason::wrong_kind);
    Slot& slot = slots_[header.request % slots_.size()];
    if (slot.phase != Phase::unused && header.request < slot.request)
        return std::unexpected(DropReason::stale_request);
    if (header.kind == Kind::request)
        return take_request(slot, header, payload);
    return take_request_for_response(slot, header);
}

[[gnu::always_inline]]
std::expected<ServerStep, DropReason> ServerWindow::take_request(Slot& slot, const PacketHeader& header,
                                                                 std::span<const std::byte> payload) {
    // a probe asks about a call this slot has (it carries no request to begin one with)
    if (header.probe && (slot.phase == Phase::unused || header.request != slot.request))
        return std::unexpected(DropReason::unsolicited);
    if (slot.phase == Phase::unused || header.request > slot.request) {
        // a new call in this slot
        if (header.request >= seen_below_ && header.request - seen_below_ >= slots_.size())
            return std::unexpected(DropReason::too_far_ahead);
        // a number an honest client may have issued, seen: even dropped below, it counts
        // (the bound follows what reached the server, not only what began)
        seen_below_ = std::max(seen_below_, header.request + 1);
        if (slot.phase == Phase::handling) // its handler still reads the slot's request
            return std::unexpected(DropReason::handler_running);
        if (header.index != 0)
            return std::unexpected(DropReason::out_of_order);
        slot.phase = Phase::receiving;
        slot.request = header.request;
        slot.rpc_type = header.rpc_type;
        slot.request_rdma = header.rdma;
        slot.request_whole = header.whole;
        slot.response_rdma = false;
        slot.request_size = header.message_size;
        slot.request_packets = packets_of(header.message_size, header.whole, limits_.payload_per_packet());
        slot.received = 0;
        slot.response_bytes.clear(); // the previous call's response: released
        if (slot.request_packets == 1) {
            // the whole request is this packet: lent to the handler where it lies
            slot.received = 1;
            slot.phase = Phase::handling;
            slot.lent = true;
            return HandlerCall{.request = slot.request,
                               .rpc_type = slot.rpc_type,
                               .message = payload,
                               .rdma = slot.request_rdma,
                               .lent = true};
        }
        slot.request_bytes.resize(header.message_size);
    } else if (header.message_size != slot.request_size || header.rpc_type != slot.rpc_type ||
               header.rdma != slot.request_rdma || header.whole != slot.request_whole) {
        return std::unexpected(DropReason::inconsistent);
    } else if (header.index < slot.received) {
        // a retransmission: its answer was lost (or is late)
        if (header.index + 1u < slot.request_packets)
            return credit_return(slot, header.index);
        if (slot.phase == Phase::handling)
            return in_progress(slot);
        return response_packet(slot, 0);
    } else if (header.index > slot.received) {
        return std::unexpected(DropReason::out_of_order);
    }
    place(slot.request_bytes, header.index, limits_.payload_per_packet(), payload);
    if (copies_ != nullptr)
        ++*copies_;
    if (++slot.received < slot.request_packets)
        return credit_return(slot, header.index);
    slot.phase = Phase::handling;
    slot.lent = false;
    return HandlerCall{.request = slot.request,
                       .rpc_type = slot.rpc_type,
                       .message = slot.request_bytes,
                       .rdma = slot.request_rdma,
                       .lent = false};
}

bool ServerWindow::awaiting(std::uint64_t request) const noexcept {
    const Slot& slot = slots_[request % slots_.size()];
    return slot.phase == Phase::handling && slot.request == request;
}

std::span<const std::byte> ServerWindow::keep(std::uint64_t request, std::span<const std::byte> lent,
                                              std::source_location where) {
    Slot& slot = slots_[request % slots_.size()];
    require(slot.phase == Phase::handling && slot.request == request && slot.lent && lent.size() == slot.request_size,
            where, "ServerWindow::keep: request {} is not a lent request of {} bytes awaiting its handler", request,
            lent.size());
    slot.request_bytes.assign(lent.begin(), lent.end());
    slot.lent = false;
    if (copies_ != nullptr)
        ++*copies_;
    return slot.request_bytes;
}

std::expected<ServerStep, DropReason> ServerWindow::take_request_for_response(const Slot& slot,
                                                                              const PacketHeader& header) const {
    if (slot.phase != Phase::answered || header.request != slot.request)
        return std::unexpected(DropReason::unsolicited);
    if (header.message_size != slot.response_bytes.size() || header.rpc_type != slot.rpc_type)
        return std::unexpected(DropReason::inconsistent);
    return response_packet(slot, header.index);
}

Outgoing ServerWindow::respond(std::uint64_t request, Status status, std::span<const std::byte> response, bool rdma,
                               std::source_location where) {
    Slot& slot = slots_[request % slots_.size()];
    require(slot.phase == Phase::handling && slot.request == request, where,
            "ServerWindow::respond: request {} is not awaiting its handler", request);
    require(status <= Status::handler_dropped || status == Status::transfer_failed, where,
            "ServerWindow::respond: status {} is not a response's", static_cast<unsigned>(status));
    require(!rdma || (status == Status::ok && slot.request_rdma), where,
            "ServerWindow::respond: a descriptor response to a request that offered no memory (or with status {})",
            static_cast<unsigned>(status));
    require(status == Status::ok || response.empty(), where,
            "ServerWindow::respond: {} response bytes with status {}", response.size(), static_cast<unsigned>(status));
    if (response.size() > limits_.max_message()) { // a descriptor too: too large is no descriptor
        status = Status::too_large;
        response = {};
        rdma = false;
    }
    slot.phase = Phase::answered;
    slot.status = status;
    slot.response_rdma = rdma;
    slot.response_bytes.assign(response.begin(), response.end());
    return response_packet(slot, 0);
}

Outgoing ServerWindow::credit_return(const Slot& slot, std::uint16_t index) const noexcept {
    return {header_for(route_, Kind::credit_return, slot.request, slot.rpc_type,
                       slot.request_size, index),
            {}};
}

Outgoing ServerWindow::in_progress(const Slot& slot) const noexcept {
    Outgoing out{header_for(route_, Kind::in_progress, slot.request, slot.rpc_type, slot.request_size,
                            slot.request_packets - 1),
                 {}};
    out.header.whole = slot.request_whole;
    return out;
}

[[gnu::always_inline]]
Outgoing ServerWindow::response_packet(const Slot& slot, std::uint16_t index) const noexcept {
    return {header_for(route_, Kind::response, slot.request, slot.rpc_type,
                       static_cast<std::uint32_t>(slot.response_bytes.size()), index, slot.status,
                       slot.response_rdma),
            share(slot.response_bytes, index, limits_.payload_per_packet())};
}

} // namespace rdmaxx::rpc::detail
