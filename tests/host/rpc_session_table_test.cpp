// The session table (lib/rpc/src/session_table.hpp): numbers and generations, stale
// lookups, the receive ring's budget, the server's admit() with its two refusals and
// agreed limits, misuse as programming errors (the endpoint options it could never
// serve too), and 20,000 random operations checked against a model.
#include <deque>
#include <map>
#include <memory>
#include <random>

#include <asio/io_context.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/rpc/endpoint.hpp>

#include "../support/check.hpp"
#include "session_table.hpp"

using namespace rdmaxx::rpc::detail;
using rdmaxx::Mtu;

namespace {

// Per-session state as an endpoint's: move-only, no default constructor.
struct State {
    explicit State(int v) : value(std::make_unique<int>(v)) {}
    std::unique_ptr<int> value;
};

using Table = SessionTable<State>;

SessionId must_reserve(Table& table, std::uint32_t credits) {
    const auto id = table.reserve(credits);
    REQUIRE(id.has_value());
    return *id;
}

const SessionLimits asked{.window = 8, .credits = 32, .max_request = 1 << 20, .max_response = 4 << 20,
                          .payload_per_packet = 4064};
const SessionRequest request{.client = {.endpoint = {.qpn = 5, .mtu = Mtu::b4096}, .qkey = 1},
                             .session = {.number = 3, .generation = 9},
                             .limits = asked};

} // namespace

TEST_CASE("rpc session table: numbers in order, generations from 1, the oldest released reused first") {
    Table table(3, 100);
    CHECK(table.max_sessions() == 3);
    CHECK(table.sessions() == 0);
    for (std::uint16_t n = 0; n < 3; ++n)
        CHECK(must_reserve(table, 1) == SessionId{.number = n, .generation = 1});
    CHECK(table.sessions() == 3);
    CHECK(table.reserve(1).error() == Refusal::too_many_sessions);

    table.release({.number = 2, .generation = 1});
    table.release({.number = 0, .generation = 1});
    CHECK(table.sessions() == 1);
    CHECK(must_reserve(table, 1) == SessionId{.number = 2, .generation = 2});
    CHECK(must_reserve(table, 1) == SessionId{.number = 0, .generation = 2});
    CHECK(table.reserve(1).error() == Refusal::too_many_sessions);
    table.release({.number = 0, .generation = 2});
    CHECK(must_reserve(table, 1) == SessionId{.number = 0, .generation = 3});
}

TEST_CASE("rpc session table: lookup finds only a live session of its generation") {
    Table table(4, 100);
    const SessionId id = must_reserve(table, 2);
    CHECK(table.lookup(id) == nullptr); // reserved, no state yet
    State& state = table.attach(id, State(42));
    CHECK(table.lookup(id) == &state);
    CHECK(*table.lookup(id)->value == 42);
    const Table& const_table = table;
    CHECK(const_table.lookup(id) == &state);

    CHECK(table.lookup({.number = id.number, .generation = id.generation + 1}) == nullptr);
    CHECK(table.lookup({.number = id.number, .generation = 0}) == nullptr);
    CHECK(table.lookup({.number = 1, .generation = 0}) == nullptr); // never reserved
    CHECK(table.lookup({.number = 1, .generation = 1}) == nullptr);
    CHECK(table.lookup({.number = 4, .generation = 1}) == nullptr); // beyond the table
    CHECK(table.lookup({.number = 0xffff, .generation = 1}) == nullptr);

    table.release(id);
    CHECK(table.lookup(id) == nullptr); // free
    // the number again, in a later session: the old SessionId is stale
    Table one(1, 10);
    const SessionId first = must_reserve(one, 1);
    one.attach(first, State(1));
    one.release(first);
    const SessionId second = must_reserve(one, 1);
    one.attach(second, State(2));
    CHECK(second.number == first.number);
    CHECK(one.lookup(first) == nullptr);
    CHECK(*one.lookup(second)->value == 2);
}

TEST_CASE("rpc session table: the receive ring's budget") {
    Table table(8, 100);
    CHECK(table.ring_buffers() == 100);
    CHECK(table.free_buffers() == 100);
    const SessionId a = must_reserve(table, 60);
    CHECK(table.free_buffers() == 40);
    CHECK(table.reserve(41).error() == Refusal::ring_full);
    CHECK(table.sessions() == 1); // a refusal takes nothing
    CHECK(table.free_buffers() == 40);
    const SessionId b = must_reserve(table, 40);
    CHECK(table.free_buffers() == 0);
    CHECK(table.reserve(1).error() == Refusal::ring_full);

    table.reduce_credits(a, 50); // a client whose server agreed to 50 of its 60
    CHECK(table.free_buffers() == 10);
    table.reduce_credits(a, 50); // unchanged
    CHECK(table.free_buffers() == 10);
    table.release(b);
    CHECK(table.free_buffers() == 50);
    table.release(a);
    CHECK(table.free_buffers() == 100);
    CHECK(must_reserve(table, 100).number == 2);

    // a full table refuses before a full ring
    Table small(1, 5);
    (void)must_reserve(small, 5);
    CHECK(small.reserve(1).error() == Refusal::too_many_sessions);
}

TEST_CASE("rpc session table: admit agrees to the smaller limits, reserves their credits, or refuses") {
    Table table(2, 48);
    const SessionLimits most{.window = 4, .credits = 16, .max_request = 8 << 20, .max_response = 1 << 20,
                             .payload_per_packet = 992};
    const auto first = table.admit(request, most);
    REQUIRE(first.has_value());
    CHECK(first->session == SessionId{.number = 0, .generation = 1});
    CHECK(first->limits == SessionLimits{.window = 4, .credits = 16, .max_request = 1 << 20,
                                         .max_response = 1 << 20, .payload_per_packet = 992});
    CHECK(table.free_buffers() == 32);
    CHECK(table.lookup(first->session) == nullptr); // until attach()
    // never above what was asked: the client's check passes
    CHECK(check_reply(request, SessionReply{.refusal = {}, .server = {}, .session = first->session, .limits = first->limits}).has_value());

    // a server that allows more than was asked agrees to what was asked
    const SessionLimits roomy{.window = max_window, .credits = max_credits, .max_request = 200 << 20,
                              .max_response = 200 << 20, .payload_per_packet = 4064};
    const auto second = table.admit(request, roomy); // 32 credits: exactly the free 32
    REQUIRE(second.has_value());
    CHECK(second->session == SessionId{.number = 1, .generation = 1});
    CHECK(second->limits == asked);
    CHECK(table.free_buffers() == 0);

    CHECK(table.admit(request, most).error() == Refusal::too_many_sessions);
    table.release(first->session);
    CHECK(table.admit(request, roomy).error() == Refusal::ring_full); // 32 credits, 16 free
    CHECK(table.admit(request, most, true).error() == Refusal::ring_full); // both ways: 2 x 16
    CHECK(table.admit(request, most).has_value());                    // 16 credits fit
}

TEST_CASE("rpc session table: agreed sizes fit the agreed payload's packets") {
    // the client's 4096 MTU allows 200 MB; the server's 256 MTU makes packets of 224
    // bytes, of which a message takes at most 65,536: 14,680,064 bytes
    const SessionLimits big{.window = 8, .credits = 32, .max_request = 200 << 20, .max_response = 100,
                            .payload_per_packet = 4064};
    const SessionLimits server{.window = 8, .credits = 32, .max_request = 14'680'064, .max_response = 14'680'064,
                               .payload_per_packet = 224};
    const SessionLimits agreed = agree(big, server);
    CHECK(agreed == SessionLimits{.window = 8, .credits = 32, .max_request = 14'680'064, .max_response = 100,
                                  .payload_per_packet = 224});
    const SessionLimits server_4096{.window = 8, .credits = 32, .max_request = 266'338'304,
                                    .max_response = 266'338'304, .payload_per_packet = 4064};
    const SessionLimits client_256{.window = 8, .credits = 32, .max_request = 14'680'064, .max_response = 5,
                                   .payload_per_packet = 224};
    CHECK(agree(client_256, server_4096) == client_256);
    CHECK(agree(server_4096, client_256) ==
          SessionLimits{.window = 8, .credits = 32, .max_request = 14'680'064, .max_response = 5,
                        .payload_per_packet = 224});

    // any two valid limits: the agreement is valid, below both
    std::mt19937 random(5);
    const std::uint32_t payloads[] = {224, 480, 992, 2016, 4064};
    const auto any_limits = [&] {
        SessionLimits l{.window = 1 + static_cast<std::uint32_t>(random() % max_window),
                        .credits = 1 + static_cast<std::uint32_t>(random() % max_credits),
                        .payload_per_packet = payloads[random() % 5]};
        const std::uint32_t most = max_packets * l.payload_per_packet;
        l.max_request = static_cast<std::uint32_t>(random() % (most + 1));
        l.max_response = random() % 4 == 0 ? most : static_cast<std::uint32_t>(random() % (most + 1));
        return l;
    };
    for (int i = 0; i < 2'000; ++i) {
        const SessionLimits a = any_limits();
        const SessionLimits b = any_limits();
        const SessionLimits agreed_ab = agree(a, b);
        CHECK(check_limits(agreed_ab).has_value());
        const SessionReply reply{.refusal = {}, .server = {}, .session = {}, .limits = agreed_ab};
        CHECK(check_reply({.client = {}, .session = {}, .limits = a}, reply).has_value());
        CHECK(check_reply({.client = {}, .session = {}, .limits = b}, reply).has_value());
    }
}

TEST_CASE("rpc session table: misuse is a programming error naming the caller") {
    RDMAXX_CHECK_DEATH(Table(0, 1), "0 sessions (1..65535)");
    RDMAXX_CHECK_DEATH(Table(65'536, 1), "65536 sessions (1..65535)");
    RDMAXX_CHECK_DEATH(Table(1, 0), "a receive ring of 0 buffers");
    (void)Table(65'535, 1);

    Table table(2, 10);
    const SessionId id = must_reserve(table, 4);
    RDMAXX_CHECK_DEATH((void)table.reserve(0), "reserve: 0 credits");
    RDMAXX_CHECK_DEATH(table.reduce_credits(id, 5), "5 credits (1..4, what it holds)");
    RDMAXX_CHECK_DEATH(table.reduce_credits(id, 0), "0 credits (1..4");
    RDMAXX_CHECK_DEATH(table.attach({.number = 1, .generation = 1}, State(1)), "attach: session 1/1 is not reserved");
    table.attach(id, State(1));
    RDMAXX_CHECK_DEATH(table.attach(id, State(2)), "has its state already");
    table.release(id);
    RDMAXX_CHECK_DEATH(table.release(id), "release: session 0/1 is not reserved or live");
    RDMAXX_CHECK_DEATH(table.reduce_credits(id, 1), "reduce_credits: session 0/1");

    SessionLimits bad = asked;
    bad.window = 0;
    RDMAXX_CHECK_DEATH((void)agree(bad, asked), "the limits asked: window 0");
    RDMAXX_CHECK_DEATH((void)agree(asked, bad), "the server's maxima: window 0");
    RDMAXX_CHECK_DEATH((void)table.admit(request, bad), "the server's maxima: window 0");
}

// What the table could never serve is refused where the endpoint is made, before any
// device is opened: a ring smaller than a connect's reservation, no setup time, a
// peer_silence that would have its still-heres sent back to back.
TEST_CASE("rpc endpoint options no session could use abort naming the caller") {
    rdmaxx::test::check_death(
        [] {
            asio::io_context io;
            (void)rdmaxx::rpc::Endpoint::create(io, {.ring = 31, .credits = 16});
        },
        "twice as many", "rpc_session_table_test.cpp");
    rdmaxx::test::check_death(
        [] {
            asio::io_context io;
            (void)rdmaxx::rpc::Endpoint::create(io, {.setup_timeout = std::chrono::milliseconds(0)});
        },
        "setup_timeout of 0 ms", "rpc_session_table_test.cpp");
    rdmaxx::test::check_death(
        [] {
            asio::io_context io;
            (void)rdmaxx::rpc::Endpoint::create(io, {.peer_silence = std::chrono::milliseconds(999)});
        },
        "peer_silence of 999 ms (at least 1 s)", "rpc_session_table_test.cpp");
}

TEST_CASE("rpc session table: 20,000 random operations agree with a model") {
    constexpr std::uint32_t capacity = 16;
    constexpr std::uint32_t ring = 64;
    Table table(capacity, ring);
    // the model: what each number holds, its last generation, the free numbers in
    // the order they come back
    struct Held {
        std::uint32_t generation = 0;
        std::uint32_t credits = 0;
        std::optional<int> value;
    };
    std::map<std::uint16_t, Held> held;
    std::map<std::uint16_t, std::uint32_t> last_generation;
    std::deque<std::uint16_t> free_numbers;
    for (std::uint16_t n = 0; n < capacity; ++n)
        free_numbers.push_back(n);
    std::uint32_t reserved = 0;
    std::mt19937 random(3);
    const auto pick = [&]() -> std::pair<const std::uint16_t, Held>& {
        auto it = held.begin();
        std::advance(it, static_cast<long>(random() % held.size()));
        return *it;
    };
    int refusals = 0;
    for (int step = 0; step < 20'000; ++step) {
        const unsigned op = random() % 10;
        if (op < 4) { // reserve
            const std::uint32_t credits = 1 + random() % 12;
            const auto got = table.reserve(credits);
            if (free_numbers.empty()) {
                CHECK(got.error() == Refusal::too_many_sessions);
                ++refusals;
            } else if (reserved + credits > ring) {
                CHECK(got.error() == Refusal::ring_full);
                ++refusals;
            } else {
                const std::uint16_t n = free_numbers.front();
                free_numbers.pop_front();
                const std::uint32_t generation = ++last_generation[n];
                REQUIRE(got.has_value());
                CHECK(*got == SessionId{.number = n, .generation = generation});
                held[n] = {.generation = generation, .credits = credits, .value = std::nullopt};
                reserved += credits;
            }
        } else if (op < 6 && !held.empty()) { // attach, if not yet
            auto& [n, h] = pick();
            if (!h.value) {
                const int value = static_cast<int>(random());
                table.attach({.number = n, .generation = h.generation}, State(value));
                h.value = value;
            }
        } else if (op < 7 && !held.empty()) { // reduce credits
            auto& [n, h] = pick();
            const std::uint32_t credits = 1 + random() % h.credits;
            table.reduce_credits({.number = n, .generation = h.generation}, credits);
            reserved -= h.credits - credits;
            h.credits = credits;
        } else if (op < 9 && !held.empty()) { // release
            const auto& [n, h] = pick();
            const std::uint16_t number = n;
            table.release({.number = number, .generation = h.generation});
            reserved -= h.credits;
            free_numbers.push_back(number);
            held.erase(number);
        } else { // lookups: any number near the table, generations around the last
            const auto n = static_cast<std::uint16_t>(random() % (capacity + 2));
            const std::uint32_t last = last_generation.count(n) ? last_generation[n] : 0;
            for (const std::uint32_t generation : {last - 1, last, last + 1}) {
                const auto it = held.find(n);
                const bool live = it != held.end() && it->second.generation == generation && it->second.value;
                const State* found = table.lookup({.number = n, .generation = generation});
                CHECK((found != nullptr) == live);
                if (found && live)
                    CHECK(*found->value == *it->second.value);
            }
        }
        CHECK(table.sessions() == held.size());
        CHECK(table.free_buffers() == ring - reserved);
    }
    CHECK(refusals > 100);
}
