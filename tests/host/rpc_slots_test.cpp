// The request slots of a session (lib/rpc/src/slots.hpp): a ClientWindow and a
// ServerWindow talk through an in-test wire that encodes and decodes every packet and
// loses, duplicates or reorders the ones a test picks. Time moves only to the client's
// next RTO deadline.
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "../support/check.hpp"
#include "slots.hpp"

using namespace rdmaxx::rpc::detail;

namespace {

using Bytes = std::vector<std::byte>;

const PacketLimits limits(1 << 16, 256 - header_bytes); // MTU 256: 224 bytes a packet
constexpr std::uint32_t per = 256 - header_bytes;
const Route client_route{.local = {.number = 1, .generation = 10}, .remote = {.number = 2, .generation = 20}};
const Route server_route{.local = client_route.remote, .remote = client_route.local};

// A request of `size` bytes (at least 4) asking for a response of `response_size`
// bytes: the first 4 say how many, the rest is filler from `seed`.
Bytes make_request(std::uint32_t size, std::uint32_t response_size, std::uint32_t seed = 1) {
    Bytes bytes(size);
    for (std::size_t i = 0; i < size; ++i)
        bytes[i] = static_cast<std::byte>(i < 4 ? response_size >> (24 - 8 * i) : i * seed);
    return bytes;
}

// The test's handler: the response the request asks for, made of its bytes.
Bytes answer(std::span<const std::byte> request) {
    if (request.size() < 4)
        return {};
    std::uint32_t size = 0;
    unsigned sum = 0;
    for (std::size_t i = 0; i < request.size(); ++i) {
        if (i < 4)
            size = size << 8 | static_cast<std::uint8_t>(request[i]);
        sum += static_cast<std::uint8_t>(request[i]);
    }
    Bytes response(size);
    for (std::size_t i = 0; i < size; ++i)
        response[i] = static_cast<std::byte>(i * 31 + sum);
    return response;
}

Bytes frame(const Outgoing& out) {
    Bytes bytes(header_bytes);
    encode(out.header, std::span(bytes).first<header_bytes>());
    bytes.insert(bytes.end(), out.payload.begin(), out.payload.end());
    return bytes;
}

enum class Fate { deliver, lose, duplicate };

struct Ended {
    CallOutcome outcome;
    std::uint32_t response_size;
    Bytes response;
    bool rdma = false;
};

// A client and a server session and the packets between them.
struct Wire {
    ClientWindow client;
    ServerWindow server;
    explicit Wire(ClientOptions options = {})
        : client(options, limits, client_route), server(options.window, limits, server_route) {}

    Clock::time_point now{};
    std::deque<Bytes> to_server, to_client;
    // What happens to each packet put on the wire (both directions).
    std::function<Fate(const PacketHeader&)> fate = [](const PacketHeader&) { return Fate::deliver; };
    std::mt19937* reorder = nullptr; // when set: a random queued packet goes next, not the oldest
    unsigned late_percent = 0;       // with reorder: how often the RTO fires before the wire is quiet
    bool defer_handlers = false;     // when set: handlers wait in `pending` for the test
    std::vector<HandlerCall> pending;

    std::map<std::uint64_t, int> handler_runs;
    std::map<std::uint64_t, Ended> ended;
    std::map<DropReason, int> client_drops, server_drops;
    std::uint32_t most_in_flight = 0;
    std::uint32_t sent_by_client = 0;

    std::uint64_t begin(const Bytes& request, std::uint32_t capacity = 1 << 16, std::uint8_t rpc_type = 3) {
        const auto started = client.begin(rpc_type, request, capacity);
        REQUIRE(started.has_value());
        return *started;
    }

    void put(std::deque<Bytes>& queue, const Outgoing& out) {
        const Fate f = fate(out.header);
        if (f == Fate::lose)
            return;
        queue.push_back(frame(out));
        if (f == Fate::duplicate)
            queue.push_back(queue.back());
    }
    void send_from_client() {
        while (const auto out = client.next_packet(now)) {
            most_in_flight = std::max(most_in_flight, client.in_flight());
            ++sent_by_client;
            put(to_server, *out);
        }
    }
    static Bytes take(std::deque<Bytes>& queue, std::mt19937* random) {
        const std::size_t at = random ? (*random)() % queue.size() : 0;
        Bytes bytes = std::move(queue[at]);
        queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(at));
        return bytes;
    }
    void respond(const HandlerCall& call, Status status = Status::ok) {
        put(to_client, server.respond(call.request, status, status == Status::ok ? answer(call.message) : Bytes{}));
    }
    void serve(const Bytes& bytes) {
        const auto header = decode(bytes, limits);
        REQUIRE(header.has_value());
        const auto step = server.receive(*header, std::span(bytes).subspan(header_bytes));
        if (!step) {
            ++server_drops[step.error()];
        } else if (const auto* out = std::get_if<Outgoing>(&*step)) {
            put(to_client, *out);
        } else {
            HandlerCall call = std::get<HandlerCall>(*step);
            ++handler_runs[call.request];
            if (!defer_handlers)
                return respond(call);
            if (call.lent) // the packet goes with this function: the window keeps a copy
                call.message = server.keep(call.request, call.message);
            pending.push_back(call);
        }
    }
    void record(const CallEnd& end) {
        CHECK_MESSAGE(ended.count(end.request) == 0, "call ", end.request, " ended twice");
        ended[end.request] = {end.outcome, end.response_size, Bytes(end.response.begin(), end.response.end()),
                              end.rdma};
    }
    void hear(const Bytes& bytes) {
        const auto header = decode(bytes, limits);
        REQUIRE(header.has_value());
        const auto got = client.receive(*header, std::span(bytes).subspan(header_bytes), now);
        if (!got)
            ++client_drops[got.error()];
        else if (*got)
            record(**got);
    }
    // Moves packets, and fires timers if `timers`, until nothing is left to do.
    void run(bool timers = true) {
        for (int budget = 10'000'000; budget > 0; --budget) {
            send_from_client();
            const auto deadline = timers ? client.next_deadline() : std::nullopt;
            const bool quiet = to_server.empty() && to_client.empty();
            // a packet slower than the RTO: the timer fires while answers are on the wire
            const bool late = !quiet && deadline && reorder && (*reorder)() % 100 < late_percent;
            if (late || (quiet && deadline)) {
                now = std::max(now, *deadline);
                while (const auto end = client.expire(now))
                    record(*end);
            } else if (quiet) {
                return;
            } else if (!to_server.empty() && (to_client.empty() || !reorder || (*reorder)() % 2 == 0)) {
                serve(take(to_server, reorder));
            } else {
                hear(take(to_client, reorder));
            }
        }
        FAIL("the wire never went quiet");
    }
    // Moves packets until none is left, firing no timer (handlers may wait in `pending`).
    void deliver() { run(false); }
    // The call ended ok with the response its request asked for.
    void check_ok(std::uint64_t request, const Bytes& sent) {
        INFO("call ", request);
        REQUIRE(ended.count(request) == 1);
        CHECK(ended[request].outcome == CallOutcome::ok);
        CHECK(ended[request].response == answer(sent));
        CHECK(ended[request].response_size == answer(sent).size());
        CHECK(handler_runs[request] == 1);
    }
};

// The header of a packet the client would send, to poke at the server by hand.
PacketHeader client_packet(Kind kind, std::uint64_t request, std::uint32_t size, std::uint16_t index) {
    return {.kind = kind, .rpc_type = 3, .status = Status::ok, .session = server_route.local.number,
            .generation = server_route.local.generation, .message_size = size, .request = request, .index = index};
}

} // namespace

TEST_CASE("rpc slots: one-packet and multi-packet calls complete with their responses") {
    Wire wire;
    struct Shape {
        std::uint32_t request, response;
    };
    // 1 and 1, n and 1, 1 and n, n and n packets; exactly full packets; 0-byte responses
    const Shape shapes[] = {{4, 0}, {10, 10}, {1000, 8}, {16, 1000}, {5 * per, 3 * per}, {3000, 5000}, {per + 1, per + 1}};
    for (const Shape s : shapes) {
        const Bytes request = make_request(s.request, s.response);
        const auto id = wire.begin(request);
        wire.run();
        wire.check_ok(id, request);
        CHECK(wire.client.in_flight() == 0);
    }
    const auto empty = wire.begin({}); // a 0-byte request: one empty packet
    wire.run();
    wire.check_ok(empty, {});
    CHECK(wire.client_drops.empty());
    CHECK(wire.server_drops.empty());
    // 5 request and 3 response packets: 5 sends of the request, 2 requests for response
    Wire count;
    const auto id = count.begin(make_request(5 * per, 3 * per));
    count.run();
    count.check_ok(id, make_request(5 * per, 3 * per));
    CHECK(count.sent_by_client == 7);
}

TEST_CASE("rpc slots: a borrowed request is sent from the caller's bytes, through resends; a copied one is not") {
    Wire wire;
    const Bytes request = make_request(3 * per + 5, 10);
    const auto id = *wire.client.begin(3, request, 1 << 16, false, ClientWindow::Keep::borrow);
    Wire copied;
    const auto other = *copied.client.begin(3, request, 1 << 16, false, ClientWindow::Keep::copy);
    const auto inside = [&request](std::span<const std::byte> payload) {
        return payload.data() >= request.data() && payload.data() + payload.size() <= request.data() + request.size();
    };
    for (std::uint32_t k = 0; k < 4; ++k) {
        const auto out = wire.client.next_packet(wire.now);
        REQUIRE(out);
        CHECK(inside(out->payload));
        const auto theirs = copied.client.next_packet(copied.now);
        REQUIRE(theirs);
        CHECK_FALSE(inside(theirs->payload));
        CHECK(std::ranges::equal(out->payload, theirs->payload));
    }
    // an RTO rolls the call back: the resent packets come from the caller's bytes again
    const auto deadline = wire.client.next_deadline();
    REQUIRE(deadline);
    wire.now = *deadline;
    CHECK_FALSE(wire.client.expire(wire.now));
    const auto again = wire.client.next_packet(wire.now);
    REQUIRE(again);
    CHECK(again->header.index == 0);
    CHECK(inside(again->payload));
    wire.to_server.clear();
    wire.run();
    wire.check_ok(id, request);
    copied.run();
    copied.check_ok(other, request);
}

TEST_CASE("rpc slots: go-back-N recovers from the loss of any one packet, either way") {
    const Bytes request = make_request(3 * per, 3 * per); // 3 + 3 packets: 5 each way
    int lost_positions = 0;
    for (int lose = 0;; ++lose) {
        Wire wire;
        int seen = 0;
        wire.fate = [&](const PacketHeader&) { return seen++ == lose ? Fate::lose : Fate::deliver; };
        const auto id = wire.begin(request);
        wire.run();
        INFO("packet ", lose, " lost");
        wire.check_ok(id, request);
        CHECK(wire.client.in_flight() == 0);
        if (seen <= lose)
            break; // no packet had that number: every position was tried
        ++lost_positions;
        CHECK(wire.client.rto() > RtoConfig{}.floor); // a timeout backed it off
    }
    CHECK(lost_positions == 10);
}

TEST_CASE("rpc slots: a duplicated request is answered from the kept response; the handler runs once") {
    Wire wire;
    std::vector<Bytes> requests_seen;
    wire.fate = [&](const PacketHeader& h) { return h.kind == Kind::request ? Fate::duplicate : Fate::deliver; };
    const Bytes request = make_request(2 * per + 5, 2 * per);
    const auto id = wire.begin(request);
    wire.run();
    wire.check_ok(id, request);
    CHECK(wire.server_drops.empty()); // duplicates of received packets are answered again
    CHECK(wire.client_drops[DropReason::duplicate] + wire.client_drops[DropReason::stale_request] > 0);

    // the last request packet again, long after the call ended: response packet 0 again
    const auto header = client_packet(Kind::request, id, 2 * per + 5, 2);
    const auto step = wire.server.receive(header, std::span(request).subspan(2 * per));
    REQUIRE(step.has_value());
    const auto& again = std::get<Outgoing>(*step);
    CHECK(again.header.kind == Kind::response);
    CHECK(again.header.index == 0);
    const Bytes response = answer(request);
    CHECK(Bytes(again.payload.begin(), again.payload.end()) == Bytes(response.begin(), response.begin() + per));
    CHECK(wire.handler_runs[id] == 1);
    // and a request_for_response for packet 1
    const auto packet_1 = wire.server.receive(client_packet(Kind::request_for_response, id, 2 * per, 1), {});
    REQUIRE(packet_1.has_value());
    CHECK(std::get<Outgoing>(*packet_1).payload.size() == per);
    // the client has moved on: the answers are stale to it
    wire.to_client.push_back(frame(again));
    wire.run();
    CHECK(wire.client_drops[DropReason::stale_request] >= 1);
    CHECK(wire.ended.size() == 1);
}

TEST_CASE("rpc slots: a response to an abandoned call is dropped, never delivered") {
    Wire wire(ClientOptions{.window = 2});
    wire.defer_handlers = true;
    const Bytes old_request = make_request(8, 100, 1);
    const auto old_id = wire.begin(old_request);
    wire.send_from_client();
    wire.serve(wire.take(wire.to_server, nullptr));
    REQUIRE(wire.pending.size() == 1);
    wire.client.abandon(old_id);
    CHECK(wire.client.in_flight() == 0);
    wire.respond(wire.pending[0]);
    wire.pending.clear();
    wire.run();
    CHECK(wire.client_drops[DropReason::stale_request] == 1);
    CHECK(wire.ended.empty());

    // the slot's next call (2) gets its own response, not the abandoned one's
    wire.defer_handlers = false;
    const Bytes filler = make_request(8, 10, 2);
    const auto other = wire.begin(filler);
    const Bytes new_request = make_request(8, 200, 3);
    const auto new_id = wire.begin(new_request);
    CHECK(new_id % 2 == old_id % 2);
    wire.run();
    wire.check_ok(other, filler);
    wire.check_ok(new_id, new_request);
    CHECK(wire.ended.count(old_id) == 0);
}

TEST_CASE("rpc slots: a call abandoned before any packet of it went gives its number to the next call begun") {
    Wire wire(ClientOptions{.window = 2});
    // a window of calls begun and abandoned unsent, three times over: with new numbers
    // each time, the next call's (6) would be beyond the server's bound (0 + 2)
    for (int round = 0; round < 3; ++round) {
        const auto first = wire.begin(make_request(8, 10, 1));
        const auto second = wire.begin(make_request(8, 10, 2));
        CHECK(first == 0);
        CHECK(second == 1);
        wire.client.abandon(second); // in either order: the lowest number goes first
        wire.client.abandon(first);
    }
    const Bytes request = make_request(8, 20, 3);
    const auto id = wire.begin(request);
    CHECK(id == 0);
    wire.run();
    wire.check_ok(id, request);
    CHECK(wire.server_drops.empty());
    // a call whose packet went may have reached the server: its number is spent
    const auto sent = wire.begin(make_request(8, 10, 4));
    CHECK(sent == 1);
    wire.send_from_client();
    wire.client.abandon(sent);
    CHECK(wire.client.next_request() == 2);
}

TEST_CASE("rpc slots: a held call sends nothing until its slot is resumed; the others go on") {
    Wire wire(ClientOptions{.window = 2});
    const Bytes held = make_request(8, 10, 1);
    const Bytes free = make_request(8, 10, 2);
    const auto first = wire.begin(held);
    wire.client.hold(first);
    const auto second = wire.begin(free);
    wire.send_from_client();
    CHECK(wire.sent_by_client == 1); // the second call's packet alone
    wire.run();
    wire.check_ok(second, free);
    CHECK(wire.ended.count(first) == 0);
    wire.client.resume(first % 2);
    wire.run();
    wire.check_ok(first, held);
    CHECK(wire.sent_by_client == 2);
    // a call begun in a slot is not held by its slot's earlier call; resuming a slot
    // whose call is not held changes nothing
    const Bytes next = make_request(8, 10, 3);
    const auto third = wire.begin(next);
    REQUIRE(third % 2 == first % 2);
    wire.client.resume(third % 2);
    wire.run();
    wire.check_ok(third, next);
    RDMAXX_CHECK_DEATH(wire.client.hold(third), "call 2 is not in progress");
}

TEST_CASE("rpc slots: a response sent after in_progress ends its call when it arrives, not at the next question") {
    for (const std::uint32_t response_size : {10u, 3 * per + 5}) { // one packet; more, the rest asked for
        INFO("response of ", response_size, " bytes");
        Wire wire(ClientOptions{.window = 1});
        wire.defer_handlers = true;
        const Bytes request = make_request(8, response_size);
        const auto id = wire.begin(request);
        wire.deliver(); // the request arrived; its handler waits
        REQUIRE(wire.pending.size() == 1);
        wire.now = *wire.client.next_deadline(); // an RTO: resent, answered in_progress
        CHECK_FALSE(wire.client.expire(wire.now).has_value());
        wire.deliver();
        CHECK(wire.sent_by_client == 2);
        CHECK(wire.client.in_flight() == 0);
        const auto ask_again = wire.client.next_deadline();
        REQUIRE(ask_again.has_value());
        const auto rto = wire.client.rto();
        wire.now += (*ask_again - wire.now) / 2; // the handler answers before the client asks again
        wire.respond(wire.pending[0]);
        wire.pending.clear();
        wire.deliver(); // no timer fires
        wire.check_ok(id, request);
        CHECK(wire.client_drops.empty());
        CHECK(wire.sent_by_client == 2 + packet_count(response_size, per) - 1); // the requests for the rest
        CHECK(wire.client.in_flight() == 0);
        CHECK_FALSE(wire.client.next_deadline().has_value());
        CHECK(wire.client.rto() == rto); // the handler's time is no round trip
        // the window goes on as before
        const Bytes next = make_request(8, response_size, 2);
        const auto next_id = wire.begin(next);
        wire.defer_handlers = false;
        wire.run();
        wire.check_ok(next_id, next);
        CHECK(wire.client_drops.empty());
        CHECK(wire.server_drops.empty());
    }
}

TEST_CASE("rpc slots: a long handler keeps its call alive past the retry cap, and holds its slot after the client gave up") {
    Wire wire(ClientOptions{.window = 1});
    wire.defer_handlers = true;
    const auto old_id = wire.begin(make_request(8, 10));
    wire.deliver(); // the request arrived; its handler waits
    REQUIRE(wire.pending.size() == 1);
    // 20 RTOs, far past the cap of 8: each resend is answered in_progress, and the
    // client asks twice as late each time, up to the RTO's ceiling (2 s)
    std::vector<std::chrono::nanoseconds> waits;
    for (int round = 0; round < 20; ++round) {
        const auto deadline = wire.client.next_deadline();
        REQUIRE(deadline.has_value());
        if (round > 0)
            waits.push_back(*deadline - wire.now);
        wire.now = std::max(wire.now, *deadline);
        while (const auto end = wire.client.expire(wire.now))
            wire.record(*end);
        wire.deliver();
        CHECK(wire.client.in_flight() == 0); // the answer returned the credit
    }
    CHECK(wire.ended.count(old_id) == 0);
    CHECK(wire.sent_by_client == 21);
    for (std::size_t i = 1; i < waits.size(); ++i)
        CHECK(waits[i] == std::min<std::chrono::nanoseconds>(2 * waits[i - 1], std::chrono::seconds(2)));
    CHECK(waits.back() == std::chrono::seconds(2));
    CHECK(wire.server_drops.empty());
    wire.client.abandon(old_id); // the caller's deadline: the endpoint gives up
    const Bytes request = make_request(8, 20);
    const auto id = wire.begin(request);
    wire.run(); // the server drops the new call while the old handler runs ...
    CHECK(wire.server_drops[DropReason::handler_running] == 8);
    CHECK(wire.ended[id].outcome == CallOutcome::timed_out);
    REQUIRE(wire.pending.size() == 1);
    wire.respond(wire.pending[0]); // ... and takes the next once it has answered
    wire.pending.clear();
    const Bytes next = make_request(8, 30);
    const auto next_id = wire.begin(next);
    wire.defer_handlers = false;
    wire.run();
    wire.check_ok(next_id, next);
    CHECK(wire.client_drops[DropReason::stale_request] == 1); // the old response
}

TEST_CASE("rpc slots: no more than C packets of a session are in flight") {
    Wire wire(ClientOptions{.window = 8, .credits = 5});
    std::map<std::uint64_t, Bytes> sent;
    for (std::uint32_t i = 0; i < 8; ++i) {
        const Bytes request = make_request(4 * per, 3 * per, i);
        sent[wire.begin(request)] = request;
    }
    wire.send_from_client();
    CHECK(wire.client.in_flight() == 5);
    CHECK(wire.to_server.size() == 5);
    CHECK_FALSE(wire.client.next_packet(wire.now).has_value());
    wire.run();
    for (const auto& [id, request] : sent)
        wire.check_ok(id, request);
    CHECK(wire.most_in_flight == 5);
    CHECK(wire.client.in_flight() == 0);
}

namespace {

// A congestion window the test sets, and what it was told.
struct Recording final : rdmaxx::rpc::CongestionControl {
    std::uint32_t room = 2;
    int answers = 0, samples = 0, timeouts = 0;
    std::uint32_t window() const noexcept override { return room; }
    void answered(std::optional<std::chrono::nanoseconds> round_trip) noexcept override {
        ++answers;
        samples += round_trip.has_value();
    }
    void timed_out() noexcept override { ++timeouts; }
};

} // namespace

TEST_CASE("rpc slots: a congestion window below C bounds the packets in flight and hears every answer and timeout") {
    Recording congestion;
    std::uint64_t stalls = 0;
    Wire wire(ClientOptions{.window = 8, .credits = 5, .congestion = &congestion, .credit_stalls = &stalls});
    std::map<std::uint64_t, Bytes> sent;
    for (std::uint32_t i = 0; i < 8; ++i) {
        const Bytes request = make_request(4 * per, 3 * per, i);
        sent[wire.begin(request)] = request;
    }
    wire.send_from_client();
    CHECK(wire.client.in_flight() == 2);
    CHECK(stalls == 1);
    wire.send_from_client(); // the same wait: counted once
    CHECK(stalls == 1);
    wire.run();
    for (const auto& [id, request] : sent)
        wire.check_ok(id, request);
    CHECK(wire.most_in_flight == 2);
    CHECK(congestion.answers == static_cast<int>(wire.sent_by_client)); // each packet answered once, no loss
    CHECK(congestion.samples > 0); // an answer that leaves its call's packets all answered
    CHECK(congestion.samples <= congestion.answers);
    CHECK(congestion.timeouts == 0);
    CHECK(stalls > 1);

    // a window above C: C bounds it; 0: one packet still goes
    congestion.room = 100;
    Wire wide(ClientOptions{.window = 8, .credits = 5, .congestion = &congestion});
    for (std::uint32_t i = 0; i < 8; ++i)
        wide.begin(make_request(4 * per, 3 * per, i));
    wide.send_from_client();
    CHECK(wide.client.in_flight() == 5);
    congestion.room = 0;
    Wire shut(ClientOptions{.window = 8, .credits = 5, .congestion = &congestion});
    shut.begin(make_request(4 * per, 3 * per));
    shut.send_from_client();
    CHECK(shut.client.in_flight() == 1);

    // a lost packet: the RTO's expiry is the controller's to hear
    congestion = Recording{};
    Wire lossy(ClientOptions{.window = 8, .credits = 5, .congestion = &congestion});
    bool lost = false;
    lossy.fate = [&lost](const PacketHeader& header) {
        if (lost || header.kind != Kind::request)
            return Fate::deliver;
        lost = true;
        return Fate::lose;
    };
    const Bytes request = make_request(4 * per, 3 * per);
    const auto id = lossy.begin(request);
    lossy.run();
    lossy.check_ok(id, request);
    CHECK(congestion.timeouts == 1);
}

TEST_CASE("rpc slots: a full window is an answer to wait, naming the call to wait for") {
    Wire wire(ClientOptions{.window = 2});
    const Bytes request = make_request(8, 8);
    const auto first = wire.begin(request);
    const auto second = wire.begin(request);
    CHECK(first == 0);
    CHECK(second == 1);
    const auto full = wire.client.begin(3, request, 100);
    REQUIRE_FALSE(full.has_value());
    CHECK(full.error().waits_for == first);
    wire.run();
    const auto third = wire.client.begin(3, request, 100);
    REQUIRE(third.has_value());
    CHECK(*third == 2);
}

TEST_CASE("rpc slots: the client drops what is stale, repeated, early, rolled back or inconsistent") {
    Wire wire;
    wire.defer_handlers = true;
    const Bytes request = make_request(2 * per, 3 * per);
    const auto id = wire.begin(request);
    wire.send_from_client(); // packets 0 and 1
    wire.serve(wire.take(wire.to_server, nullptr));
    const Bytes credit = wire.take(wire.to_client, nullptr); // credit_return 0
    const auto cr = decode(credit, limits).value();
    const auto give = [&](PacketHeader h, std::span<const std::byte> payload = {}) {
        const auto got = wire.client.receive(h, payload, wire.now);
        REQUIRE_FALSE(got.has_value());
        return got.error();
    };
    PacketHeader h = cr;
    h.generation = 11;
    CHECK(give(h) == DropReason::stale_session);
    h = cr;
    h.session = 2;
    CHECK(give(h) == DropReason::stale_session);
    h = cr;
    h.kind = Kind::request;
    CHECK(give(h) == DropReason::wrong_kind);
    h.kind = Kind::reset;
    CHECK(give(h) == DropReason::wrong_kind);
    h = cr;
    h.request = id + 8; // the same slot, another call
    CHECK(give(h) == DropReason::stale_request);
    h.request = id + 1; // a free slot
    CHECK(give(h) == DropReason::stale_request);
    h = cr;
    h.rpc_type = 4;
    CHECK(give(h) == DropReason::inconsistent);
    h = cr;
    h.message_size = 3 * per;
    CHECK(give(h) == DropReason::inconsistent);
    // response packet 1 before packet 0
    Bytes response = answer(request);
    h = cr;
    h.kind = Kind::response;
    h.message_size = static_cast<std::uint32_t>(response.size());
    h.index = 1;
    CHECK(give(h, std::span(response).subspan(per, per)) == DropReason::out_of_order);

    REQUIRE(wire.client.receive(cr, {}, wire.now).has_value()); // taken
    CHECK(give(cr) == DropReason::duplicate);
    // request packet 1 is lost; its RTO expires: rolled back, so the answer of the lost
    // one is unsolicited
    wire.to_server.clear();
    wire.now = *wire.client.next_deadline();
    CHECK_FALSE(wire.client.expire(wire.now).has_value());
    CHECK(wire.client.in_flight() == 0);
    h.index = 0;
    CHECK(give(h, std::span(response).first(per)) == DropReason::unsolicited);

    // resent, answered; then a response packet 1 that changes the size
    wire.send_from_client();
    wire.serve(wire.take(wire.to_server, nullptr));
    wire.respond(wire.pending.at(0));
    wire.hear(wire.take(wire.to_client, nullptr)); // response packet 0
    wire.send_from_client();                        // requests for packets 1 and 2
    CHECK(wire.to_server.size() == 2);
    h.index = 1;
    h.message_size = static_cast<std::uint32_t>(response.size()) + 1;
    CHECK(give(h, std::span(response).subspan(per, per)) == DropReason::inconsistent);
    wire.run();
    CHECK(wire.ended.at(id).outcome == CallOutcome::ok);
    CHECK(wire.ended.at(id).response == response);
}

TEST_CASE("rpc slots: the server drops what is stale, too far ahead, early, inconsistent or unasked") {
    ServerWindow server(4, limits, server_route);
    const auto drop = [&](const PacketHeader& h, std::size_t payload = 0) {
        const Bytes bytes(payload);
        const auto step = server.receive(h, bytes);
        REQUIRE_FALSE(step.has_value());
        return step.error();
    };
    const auto take = [&](const PacketHeader& h, std::size_t payload = 0) {
        const Bytes bytes(payload);
        const auto step = server.receive(h, bytes);
        REQUIRE(step.has_value());
        return *step;
    };
    PacketHeader h = client_packet(Kind::request, 0, 2 * per, 0);
    h.generation = 21;
    CHECK(drop(h, per) == DropReason::stale_session);
    CHECK(drop(client_packet(Kind::response, 0, 0, 0)) == DropReason::wrong_kind);
    CHECK(drop(client_packet(Kind::credit_return, 0, 2 * per, 0)) == DropReason::wrong_kind);
    CHECK(drop(client_packet(Kind::request, 4, 8, 0), 8) == DropReason::too_far_ahead); // numbers 0..3 first
    CHECK(drop(client_packet(Kind::request, 1, 2 * per, 1), per) == DropReason::out_of_order);
    CHECK(drop(client_packet(Kind::request_for_response, 1, 2 * per, 1)) == DropReason::unsolicited);

    CHECK(std::get<Outgoing>(take(client_packet(Kind::request, 1, 2 * per, 0), per)).header.kind ==
          Kind::credit_return);
    CHECK(drop(client_packet(Kind::request, 1, 2 * per + 1, 1), per + 1) == DropReason::inconsistent);
    h = client_packet(Kind::request, 1, 2 * per, 1);
    h.rpc_type = 9;
    CHECK(drop(h, per) == DropReason::inconsistent);
    // a lost credit_return: the packet again is answered again
    const auto repaired = std::get<Outgoing>(take(client_packet(Kind::request, 1, 2 * per, 0), per));
    CHECK(repaired.header.kind == Kind::credit_return);
    CHECK(repaired.header.index == 0);
    CHECK(repaired.header.session == client_route.local.number);
    CHECK(repaired.header.generation == client_route.local.generation);
    const auto call = std::get<HandlerCall>(take(client_packet(Kind::request, 1, 2 * per, 1), per));
    CHECK(call.request == 1);
    CHECK(call.message.size() == 2 * per);
    // the last packet again while the handler runs: in progress, ask later
    const auto busy = std::get<Outgoing>(take(client_packet(Kind::request, 1, 2 * per, 1), per));
    CHECK(busy.header.kind == Kind::in_progress);
    CHECK(busy.header.index == 1);
    CHECK(busy.header.message_size == 2 * per);
    CHECK(busy.payload.empty());
    CHECK(drop(client_packet(Kind::request, 5, 8, 0), 8) == DropReason::handler_running); // the slot's next call
    CHECK(drop(client_packet(Kind::request_for_response, 1, 2 * per, 1)) == DropReason::unsolicited);
    // the handler's response exceeds max_message: too_large, no bytes
    const Bytes huge(limits.max_message() + 1);
    const Outgoing refused = server.respond(1, Status::ok, huge);
    CHECK(refused.header.status == Status::too_large);
    CHECK(refused.header.message_size == 0);
    CHECK(refused.payload.empty());
    CHECK(drop(client_packet(Kind::request_for_response, 1, 2 * per, 1)) == DropReason::inconsistent);

    // a newer call in slot 1 releases the old; the old one's packets are stale
    CHECK(std::holds_alternative<HandlerCall>(take(client_packet(Kind::request, 5, 8, 0), 8)));
    CHECK(drop(client_packet(Kind::request, 1, 2 * per, 1), per) == DropReason::stale_request);
    CHECK(drop(client_packet(Kind::request_for_response, 1, 0, 1)) == DropReason::stale_request);
    // the highest number seen is 5: numbers up to 5 + 4 may begin
    CHECK(std::holds_alternative<HandlerCall>(take(client_packet(Kind::request, 8, 8, 0), 8)));
    // now 8: 13 is beyond the bound; 12 is within it (dropped only because 8's handler
    // runs), and, seen, it moves the bound
    CHECK(drop(client_packet(Kind::request, 8 + 4 + 1, 8, 0), 8) == DropReason::too_far_ahead);
    CHECK(drop(client_packet(Kind::request, 8 + 4, 8, 0), 8) == DropReason::handler_running);
    CHECK(drop(client_packet(Kind::request, 8 + 4 + 1, 8, 0), 8) == DropReason::handler_running);
}

TEST_CASE("rpc slots: the server's refusals and a response too large for the caller end the call") {
    Wire wire;
    wire.defer_handlers = true;
    const auto refused = wire.begin(make_request(8, 8));
    const auto big = wire.begin(make_request(8, 3 * per));
    const auto fits = wire.begin(make_request(8, 100), 100);
    wire.deliver();
    REQUIRE(wire.pending.size() == 3);
    wire.respond(wire.pending[0], Status::no_handler);
    wire.respond(wire.pending[1]);
    wire.respond(wire.pending[2]);
    wire.pending.clear();
    wire.run();
    CHECK(wire.ended.at(refused).outcome == CallOutcome::no_handler);
    CHECK(wire.ended.at(refused).response.empty());
    CHECK(wire.ended.at(big).outcome == CallOutcome::ok);
    CHECK(wire.ended.at(fits).outcome == CallOutcome::ok);
    CHECK(wire.ended.at(fits).response_size == 100);

    const auto truncated = wire.begin(make_request(8, 3 * per), 3 * per - 1);
    wire.deliver();
    wire.respond(wire.pending.at(0));
    wire.run();
    CHECK(wire.ended.at(truncated).outcome == CallOutcome::response_truncated);
    CHECK(wire.ended.at(truncated).response_size == 3 * per);
    CHECK(wire.ended.at(truncated).response.empty());
    CHECK(wire.client.in_flight() == 0);
}

TEST_CASE("rpc slots: a server that never answers: the RTO backs off, the 8th timeout ends the call") {
    Wire wire;
    wire.fate = [](const PacketHeader& h) { return h.kind == Kind::request ? Fate::lose : Fate::deliver; };
    const auto id = wire.begin(make_request(8, 8));
    wire.send_from_client();
    std::vector<std::chrono::nanoseconds> waits;
    Clock::time_point last = wire.now;
    while (const auto deadline = wire.client.next_deadline()) {
        waits.push_back(*deadline - last);
        wire.now = last = *deadline;
        while (const auto end = wire.client.expire(wire.now))
            wire.record(*end);
        wire.send_from_client();
    }
    using namespace std::chrono_literals;
    const std::vector<std::chrono::nanoseconds> expected = {50ms, 100ms, 200ms, 400ms, 800ms, 1600ms, 2s, 2s};
    CHECK(waits == expected);
    CHECK(wire.ended.at(id).outcome == CallOutcome::timed_out);
    CHECK(wire.client.in_flight() == 0);
}

TEST_CASE("rpc slots: 10,000 calls over a wire that loses 5%, duplicates 2%, reorders and is late") {
    Wire wire(ClientOptions{.window = 8, .credits = 16});
    std::mt19937 random(2024);
    wire.reorder = &random;
    wire.late_percent = 1;
    wire.fate = [&](const PacketHeader&) {
        const auto roll = random() % 100;
        return roll < 5 ? Fate::lose : roll < 7 ? Fate::duplicate : Fate::deliver;
    };
    std::map<std::uint64_t, Bytes> sent;
    constexpr int calls = 10'000;
    for (int begun = 0; begun < calls;) {
        // keep the window busy: begin until it is full, then let the wire move
        for (;;) {
            const Bytes request = make_request(4 + random() % (4 * per), random() % (4 * per), random());
            const auto id = wire.client.begin(3, request, 1 << 16);
            if (!id)
                break;
            sent[*id] = request;
            if (++begun == calls)
                break;
        }
        wire.run();
    }
    wire.run();
    REQUIRE(wire.ended.size() == calls);
    int handler_total = 0;
    for (const auto& [id, runs] : wire.handler_runs)
        handler_total += runs;
    CHECK(handler_total == calls);
    for (const auto& [id, request] : sent)
        wire.check_ok(id, request);
    CHECK(wire.most_in_flight <= 16);
    CHECK(wire.client.in_flight() == 0);
    for (const DropReason expected : {DropReason::duplicate, DropReason::out_of_order, DropReason::stale_request,
                                      DropReason::unsolicited})
        CHECK(wire.client_drops[expected] > 0);
    for (const auto& [reason, count] : wire.server_drops) // go-back-N resends what follows a gap
        CHECK_MESSAGE(reason == DropReason::out_of_order, to_string(reason), " ", count);
    MESSAGE("client drops: duplicate ", wire.client_drops[DropReason::duplicate], ", out of order ",
            wire.client_drops[DropReason::out_of_order], ", stale ", wire.client_drops[DropReason::stale_request],
            ", unsolicited ", wire.client_drops[DropReason::unsolicited], "; server drops: out of order ",
            wire.server_drops[DropReason::out_of_order], ", stale ", wire.server_drops[DropReason::stale_request]);
}

TEST_CASE("rpc slots: misuse is a programming error naming the caller") {
    ClientWindow client(ClientOptions{}, limits, client_route);
    const Bytes too_big(limits.max_message() + 1);
    RDMAXX_CHECK_DEATH((void)client.begin(1, too_big, 0), "a 65537-byte request, the most is 65536");
    RDMAXX_CHECK_DEATH(client.abandon(0), "call 0 is not in progress");
    RDMAXX_CHECK_DEATH((void)ClientWindow(ClientOptions{.window = 0}, limits, client_route), "a window of 0 slots");
    RDMAXX_CHECK_DEATH((void)ClientWindow(ClientOptions{.credits = 0}, limits, client_route), "0 credits");
    ServerWindow server(8, limits, server_route);
    RDMAXX_CHECK_DEATH((void)server.respond(0, Status::ok, {}), "request 0 is not awaiting its handler");
    const Bytes request = make_request(8, 8);
    REQUIRE(server.receive(client_packet(Kind::request, 0, 8, 0), request).has_value());
    RDMAXX_CHECK_DEATH((void)server.respond(0, Status::server_busy, {}), "status 5 is not a response's");
    RDMAXX_CHECK_DEATH((void)server.respond(0, Status::ok, Bytes(4), true), "a request that offered no memory");
    RDMAXX_CHECK_DEATH((void)server.respond(0, Status::no_handler, request), "8 response bytes with status 1");
    (void)server.respond(0, Status::ok, request);
    RDMAXX_CHECK_DEATH((void)server.respond(0, Status::ok, {}), "request 0 is not awaiting its handler");
    RDMAXX_CHECK_DEATH((void)ServerWindow(0, limits, server_route), "a window of 0 slots");
}

TEST_CASE("rpc slots: a descriptor call keeps its rdma flag on every packet, either way, and through resends") {
    Wire wire;
    wire.defer_handlers = true;
    std::vector<PacketHeader> seen;
    wire.fate = [&](const PacketHeader& h) {
        seen.push_back(h);
        return Fate::deliver;
    };
    const Bytes descriptor = make_request(3 * per, 8); // a multi-packet descriptor (inline bytes)
    const auto started = wire.client.begin(3, descriptor, 1 << 16, true);
    REQUIRE(started.has_value());
    wire.deliver();
    REQUIRE(wire.pending.size() == 1);
    CHECK(wire.pending[0].rdma);
    const Bytes answer_descriptor(4, std::byte{7});
    wire.put(wire.to_client, wire.server.respond(wire.pending[0].request, Status::ok, answer_descriptor, true));
    wire.run();
    REQUIRE(wire.ended.count(*started) == 1);
    CHECK(wire.ended[*started].outcome == CallOutcome::ok);
    CHECK(wire.ended[*started].rdma);
    CHECK(wire.ended[*started].response == answer_descriptor);
    for (const PacketHeader& h : seen)
        CHECK(h.rdma == (h.kind == Kind::request || h.kind == Kind::response));

    // a plain call's response may not be a descriptor, nor a descriptor's later packets
    // differ from its first (a dishonest server): dropped as inconsistent
    wire.pending.clear();
    const auto plain = wire.begin(make_request(8, 8));
    wire.deliver();
    REQUIRE(wire.pending.size() == 1);
    Outgoing forged = wire.server.respond(wire.pending[0].request, Status::ok, answer(wire.pending[0].message));
    forged.header.rdma = true;
    wire.hear(frame(forged));
    CHECK(wire.client_drops[DropReason::inconsistent] == 1);
    CHECK(wire.ended.count(plain) == 0);

    // the server's too: a descriptor's second packet without the flag
    ServerWindow server(8, limits, server_route);
    const Bytes three = make_request(3 * per, 8);
    PacketHeader first = client_packet(Kind::request, 0, 3 * per, 0);
    first.rdma = true;
    REQUIRE(server.receive(first, std::span(three).first(per)).has_value());
    const auto second = server.receive(client_packet(Kind::request, 0, 3 * per, 1), std::span(three).subspan(per, per));
    REQUIRE_FALSE(second.has_value());
    CHECK(second.error() == DropReason::inconsistent);
}

TEST_CASE("rpc slots: a descriptor response above the session's max_response answers too_large, without the "
          "rdma flag, well-formed for resends too") {
    const PacketLimits tiny(2, per); // responses of at most 2 bytes: a 4-byte descriptor does not fit
    ServerWindow server(1, tiny, server_route);
    const Bytes descriptor(40, std::byte{1});
    PacketHeader request = client_packet(Kind::request, 0, 40, 0);
    request.rdma = true;
    const auto step = server.receive(request, descriptor);
    REQUIRE(step.has_value());
    REQUIRE(std::holds_alternative<HandlerCall>(*step));
    const Outgoing answer = server.respond(0, Status::ok, Bytes(4, std::byte{9}), true);
    CHECK(answer.header.status == Status::too_large);
    CHECK_FALSE(answer.header.rdma);
    CHECK(decode(frame(answer), tiny).has_value());
    const auto resent = server.receive(request, descriptor); // the same answer, again
    REQUIRE(resent.has_value());
    REQUIRE(std::holds_alternative<Outgoing>(*resent));
    CHECK(std::get<Outgoing>(*resent).header == answer.header);
    CHECK(decode(frame(std::get<Outgoing>(*resent)), tiny).has_value());
}

TEST_CASE("rpc slots: a one-packet request is lent to its handler, kept only when asked, copied otherwise") {
    std::uint64_t copies = 0;
    ServerWindow server(8, limits, server_route, &copies);
    const Bytes small = make_request(100, 8);
    const auto step = server.receive(client_packet(Kind::request, 0, 100, 0), small);
    REQUIRE(step.has_value());
    REQUIRE(std::holds_alternative<HandlerCall>(*step));
    const auto call = std::get<HandlerCall>(*step);
    CHECK(call.lent);
    CHECK(call.message.data() == small.data()); // where it arrived: no copy
    CHECK(copies == 0);
    CHECK(server.awaiting(0));
    // a resend while the handler runs: answered in progress, the loan untouched
    const auto again = server.receive(client_packet(Kind::request, 0, 100, 0), small);
    REQUIRE(again.has_value());
    REQUIRE(std::holds_alternative<Outgoing>(*again));
    CHECK(std::get<Outgoing>(*again).header.kind == Kind::in_progress);
    const auto kept = server.keep(0, call.message);
    CHECK(copies == 1);
    CHECK(kept.data() != small.data());
    CHECK(Bytes(kept.begin(), kept.end()) == small);
    (void)server.respond(0, Status::ok, answer(kept));
    CHECK_FALSE(server.awaiting(0));
    RDMAXX_CHECK_DEATH((void)server.keep(0, kept), "request 0 is not a lent request");

    // a multi-packet request is copied packet by packet, never lent
    const Bytes big = make_request(2 * per + 5, 8);
    REQUIRE(server.receive(client_packet(Kind::request, 1, 2 * per + 5, 0), std::span(big).first(per)).has_value());
    REQUIRE(server.receive(client_packet(Kind::request, 1, 2 * per + 5, 1), std::span(big).subspan(per, per))
                .has_value());
    const auto last = server.receive(client_packet(Kind::request, 1, 2 * per + 5, 2), std::span(big).subspan(2 * per));
    REQUIRE(last.has_value());
    REQUIRE(std::holds_alternative<HandlerCall>(*last));
    const auto& whole = std::get<HandlerCall>(*last);
    CHECK_FALSE(whole.lent);
    CHECK(Bytes(whole.message.begin(), whole.message.end()) == big);
    CHECK(copies == 4);
}

TEST_CASE("rpc slots: a response written over the RC path ends its descriptor call, in flight or rolled back") {
    using namespace std::chrono_literals;
    Wire wire;
    wire.defer_handlers = true;
    const Bytes descriptor = make_request(3 * per, 8); // three packets
    const auto started = wire.client.begin(3, descriptor, 1 << 16, true);
    REQUIRE(started.has_value());
    wire.deliver();
    REQUIRE(wire.pending.size() == 1);
    CHECK(wire.client.in_flight() == 1); // the last packet waits for the handler
    const Bytes written(4, std::byte{9});
    wire.now += 5ms;
    const auto end = wire.client.written(*started, written, wire.now);
    REQUIRE(end.has_value());
    CHECK(end->request == *started);
    CHECK(end->outcome == CallOutcome::ok);
    CHECK(end->rdma);
    CHECK(Bytes(end->response.begin(), end->response.end()) == written);
    CHECK(wire.client.in_flight() == 0);
    CHECK_FALSE(wire.client.next_deadline().has_value());
    // the same answer again, and the server's UD descriptor for it (a resend's): stale
    CHECK(wire.client.written(*started, written, wire.now).error() == DropReason::stale_request);
    wire.put(wire.to_client, wire.server.respond(wire.pending[0].request, Status::ok, written, true));
    wire.run();
    CHECK(wire.client_drops[DropReason::stale_request] == 1);
    CHECK(wire.ended.count(*started) == 0);

    // rolled back by an RTO (nothing reached the server): the server had the request
    // all the same, so the written answer ends the call and leaves nothing in flight
    wire.fate = [](const PacketHeader&) { return Fate::lose; };
    const auto lost = wire.client.begin(3, descriptor, 1 << 16, true);
    REQUIRE(lost.has_value());
    wire.send_from_client();
    CHECK(wire.client.in_flight() == 3);
    wire.now = *wire.client.next_deadline();
    CHECK_FALSE(wire.client.expire(wire.now).has_value());
    CHECK(wire.client.in_flight() == 0);
    const auto late = wire.client.written(*lost, written, wire.now);
    REQUIRE(late.has_value());
    CHECK(late->outcome == CallOutcome::ok);
    CHECK(wire.client.in_flight() == 0);
    CHECK_FALSE(wire.client.next_packet(wire.now).has_value());

    // no call, and a call that is no descriptor call, take none
    CHECK(wire.client.written(77, written, wire.now).error() == DropReason::stale_request);
    const auto plain = wire.begin(make_request(8, 8));
    CHECK(wire.client.written(plain, written, wire.now).error() == DropReason::inconsistent);
}

TEST_CASE("rpc slots: a descriptor call written off at an RTO and then answered over RC ends ok; its controller "
          "heard the timeout and no answer") {
    // the congestion-controller device test counts answers + retransmissions per call for this path
    Recording congestion;
    congestion.room = 8;
    Wire wire(ClientOptions{.congestion = &congestion});
    wire.fate = [](const PacketHeader&) { return Fate::lose; };
    const Bytes descriptor = make_request(16, 8); // one packet
    const auto started = wire.client.begin(3, descriptor, 1 << 16, true);
    REQUIRE(started.has_value());
    wire.send_from_client();
    CHECK(wire.client.in_flight() == 1);
    wire.now = *wire.client.next_deadline();
    CHECK_FALSE(wire.client.expire(wire.now).has_value());
    CHECK(congestion.timeouts == 1);
    const Bytes written(4, std::byte{9});
    const auto end = wire.client.written(*started, written, wire.now);
    REQUIRE(end.has_value());
    CHECK(end->outcome == CallOutcome::ok);
    CHECK(congestion.answers == 0); // the packet was counted lost, not answered
    CHECK(wire.client.in_flight() == 0);

    // answered while in flight: the controller hears the answer
    wire.fate = [](const PacketHeader&) { return Fate::deliver; };
    wire.defer_handlers = true;
    const auto heard = wire.client.begin(3, descriptor, 1 << 16, true);
    REQUIRE(heard.has_value());
    wire.send_from_client();
    REQUIRE(wire.client.written(*heard, written, wire.now).has_value());
    CHECK(congestion.answers == 1);
    CHECK(congestion.timeouts == 1);
}

TEST_CASE("rpc slots: a whole request whose SEND completed is asked about by a probe after an RTO; a probe "
          "unanswered, it goes whole again") {
    const PacketLimits whole_limits(1 << 16, per, 1 << 16);
    ClientWindow client(ClientOptions{}, limits, client_route);
    ServerWindow server(8, limits, server_route);
    const Bytes descriptor = make_request(3 * per, 8);
    const auto id = client.begin(3, descriptor, 1 << 16, true, ClientWindow::Keep::copy, true);
    REQUIRE(id.has_value());
    Clock::time_point now{};
    const auto sent = client.next_packet(now);
    REQUIRE(sent.has_value());
    CHECK_FALSE(sent->header.probe);
    client.delivered(*id + 8); // not this call: nothing
    client.delivered(*id);
    const auto take = [&](const Outgoing& out) { // the server takes a packet as it was framed
        const Bytes bytes = frame(out);
        const auto header = decode(bytes, whole_limits);
        REQUIRE(header.has_value());
        return server.receive(*header, std::span(bytes).subspan(header_bytes));
    };
    // the server has the request (its handler runs): an RTO, a probe, in_progress
    REQUIRE(take(*sent).has_value());
    now = *client.next_deadline();
    CHECK_FALSE(client.expire(now).has_value());
    const auto probe = client.next_packet(now);
    REQUIRE(probe.has_value());
    CHECK(probe->header.probe);
    CHECK(probe->payload.empty());
    const auto busy = take(*probe);
    REQUIRE(busy.has_value());
    REQUIRE(std::holds_alternative<Outgoing>(*busy));
    CHECK(std::get<Outgoing>(*busy).header.kind == Kind::in_progress);

    // another call, whose server lost the request: a probe goes unanswered, then the
    // request goes whole again, then (its SEND completed) a probe again
    ClientWindow lossy(ClientOptions{}, limits, client_route);
    const auto lost = lossy.begin(3, descriptor, 1 << 16, true, ClientWindow::Keep::copy, true);
    REQUIRE(lost.has_value());
    REQUIRE(lossy.next_packet(now).has_value());
    lossy.delivered(*lost);
    std::vector<bool> probes;
    for (int round = 0; round < 4; ++round) {
        now = *lossy.next_deadline();
        CHECK_FALSE(lossy.expire(now).has_value());
        const auto again = lossy.next_packet(now);
        REQUIRE(again.has_value());
        probes.push_back(again->header.probe);
        CHECK(again->payload.empty() == again->header.probe);
        if (!again->header.probe)
            lossy.delivered(*lost);
    }
    CHECK(probes == std::vector<bool>{true, false, true, false});
}

TEST_CASE("rpc slots: a whole request is one packet whatever its size, lent to its handler, its answers "
          "name it whole, and once the server has it the client asks by probes") {
    const PacketLimits whole_limits(1 << 16, per, 1 << 16);
    ClientWindow client(ClientOptions{}, limits, client_route);
    ServerWindow server(8, limits, server_route);
    const Bytes descriptor = make_request(5 * per, 8); // five UD packets' worth
    const auto started = client.begin(3, descriptor, 1 << 16, true, ClientWindow::Keep::copy, true);
    REQUIRE(started.has_value());
    Clock::time_point now{};
    const auto sent = client.next_packet(now);
    REQUIRE(sent.has_value());
    CHECK(sent->header.whole);
    CHECK(sent->header.rdma);
    CHECK(sent->header.index == 0);
    CHECK(std::ranges::equal(sent->payload, descriptor));
    CHECK_FALSE(client.next_packet(now).has_value()); // the whole request was the one packet
    CHECK(client.in_flight() == 1);

    const Bytes bytes = frame(*sent);
    const auto header = decode(bytes, whole_limits);
    REQUIRE(header.has_value());
    const auto step = server.receive(*header, std::span(bytes).subspan(header_bytes));
    REQUIRE(step.has_value());
    const auto* call = std::get_if<HandlerCall>(&*step);
    REQUIRE(call != nullptr);
    CHECK(call->lent); // one packet: lent where it arrived, not copied
    CHECK(std::ranges::equal(call->message, descriptor));

    // resent after an RTO while the handler runs: in_progress, whole too, taken by the client
    now = *client.next_deadline();
    CHECK_FALSE(client.expire(now).has_value());
    const auto again = client.next_packet(now);
    REQUIRE(again.has_value());
    CHECK(again->header == sent->header);
    const auto progress = server.receive(again->header, again->payload);
    REQUIRE(progress.has_value());
    const auto* busy = std::get_if<Outgoing>(&*progress);
    REQUIRE(busy != nullptr);
    CHECK(busy->header.kind == Kind::in_progress);
    CHECK(busy->header.whole);
    const Bytes busy_bytes = frame(*busy);
    const auto busy_header = decode(busy_bytes, whole_limits);
    REQUIRE(busy_header.has_value());
    const auto heard = client.receive(*busy_header, {}, now);
    REQUIRE(heard.has_value());
    CHECK_FALSE(heard->has_value());
    CHECK(client.in_flight() == 0);

    // a credit return names a request sent in packets: not this one's
    PacketHeader credit = busy->header;
    credit.kind = Kind::credit_return;
    credit.whole = false;
    const auto forged = client.receive(credit, {}, now);
    REQUIRE_FALSE(forged.has_value());
    CHECK(forged.error() == DropReason::inconsistent);
    // nor may the request come again in packets
    PacketHeader in_packets = sent->header;
    in_packets.whole = false;
    const auto split = server.receive(in_packets, std::span(descriptor).first(per));
    REQUIRE_FALSE(split.has_value());
    CHECK(split.error() == DropReason::inconsistent);

    // asked again one RTO later: by a probe, the request's header alone (a UD packet)
    now += std::chrono::milliseconds(100);
    const auto probe = client.next_packet(now);
    REQUIRE(probe.has_value());
    CHECK(probe->header.probe);
    CHECK(probe->header.whole);
    CHECK(probe->payload.empty());
    const Bytes probe_bytes = frame(*probe);
    const auto probe_header = decode(probe_bytes, whole_limits);
    REQUIRE(probe_header.has_value());
    const auto still = server.receive(*probe_header, {});
    REQUIRE(still.has_value());
    REQUIRE(std::holds_alternative<Outgoing>(*still));
    CHECK(std::get<Outgoing>(*still).header.kind == Kind::in_progress);
    REQUIRE(client.receive(std::get<Outgoing>(*still).header, {}, now).has_value());
    // a probe names a call the server has: it cannot begin one
    PacketHeader unknown = *probe_header;
    unknown.request += 8; // the slot's next call
    const auto not_begun = server.receive(unknown, {});
    REQUIRE_FALSE(not_begun.has_value());
    CHECK(not_begun.error() == DropReason::unsolicited);

    const Bytes answer_descriptor(4, std::byte{9});
    const Outgoing response = server.respond(call->request, Status::ok, answer_descriptor, true);
    CHECK_FALSE(response.header.whole); // a response travels as it always does
    now = *client.next_deadline(); // the resend the second in_progress asked for: twice as late
    const auto asked = client.next_packet(now);
    REQUIRE(asked.has_value());
    CHECK(asked->header.probe);
    const auto answered = server.receive(asked->header, {});
    REQUIRE(answered.has_value());
    REQUIRE(std::holds_alternative<Outgoing>(*answered));
    CHECK(std::get<Outgoing>(*answered).header == response.header); // the response, made again
    const auto ended = client.receive(response.header, response.payload, now);
    REQUIRE(ended.has_value());
    REQUIRE(ended->has_value());
    CHECK((*ended)->outcome == CallOutcome::ok);
    CHECK((*ended)->rdma);

    RDMAXX_CHECK_DEATH((void)client.begin(3, descriptor, 8, false, ClientWindow::Keep::copy, true),
                       "a whole request that is not a descriptor");
}
