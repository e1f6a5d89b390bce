// lib/rpc's RC path for large messages on a real device: requests above the
// threshold READ by the server, responses above it WRITTEN into the caller's offered
// memory, every byte checked; a large call abandoned mid-flight (its WRITE still to
// come) never reaches the caller's buffer nor a later call's; a client that keeps to
// UD moves the same messages as packets. Calls with MessageBuffers: what is copied
// (nothing but small responses), reuse, and their abandonment.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/rpc/endpoint.hpp>

#include "../support/capabilities.hpp"
#include "../support/device.hpp"
#include "../support/rpc_rig.hpp"
#include "../support/starved.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

using namespace rdmaxx;
using namespace rdmaxx::rpc_test;
using rdmaxx::test::must;

namespace {

constexpr std::uint32_t mib = 1 << 20;
// answers a response of the size the request's first 4 bytes say, message(n) with n
// the request's size
constexpr std::uint8_t sized = 4;

const rpc::EndpointOptions large{.max_request = mib, .max_response = mib};

void add_sized(Rig& rig) {
    rig.server->set_handler(sized, [](rpc::Request request, rpc::Responder responder) {
        std::uint32_t size = 0;
        if (request.bytes().size() >= 4)
            std::memcpy(&size, request.bytes().data(), 4);
        responder.respond(message(static_cast<std::uint32_t>(request.bytes().size()), size));
    });
}

// A request for a response of `response` bytes, `request` bytes long (at least 4).
std::vector<std::byte> ask(std::uint32_t n, std::size_t request, std::uint32_t response) {
    auto bytes = message(n, std::max<std::size_t>(request, 4));
    std::memcpy(bytes.data(), &response, 4);
    return bytes;
}

// Sizes from 32 B to 1 MiB, across the threshold both ways.
std::size_t size_of(std::uint32_t n) {
    constexpr std::size_t sizes[] = {32, 1000, 16 * 1024, 16 * 1024 + 1, 40'000, 65'536, 300'000, mib - 1, mib};
    return sizes[(n * 7) % std::size(sizes)];
}

asio::awaitable<void> mixed_calls(rpc::Session* session, std::uint32_t first, std::uint32_t calls, int* wrong,
                                  std::uint32_t* large_requests, std::uint32_t* large_responses) {
    std::vector<std::byte> response(mib);
    for (std::uint32_t n = first; n < first + calls; ++n) {
        const std::size_t request_size = size_of(n);
        const auto response_size = static_cast<std::uint32_t>(size_of(n * 3 + 1));
        const auto request = ask(n, request_size, response_size);
        *large_requests += request.size() > 16 * 1024; // READ; smaller ones go whole
        *large_responses += response_size > session->info().payload_per_packet; // WRITTEN
        const Result<std::size_t> got = co_await session->call(sized, request, response, {.timeout = 60s});
        if (!got) {
            MESSAGE("call ", n, ": ", got.error().message());
            ++*wrong;
            continue;
        }
        const auto expected = message(static_cast<std::uint32_t>(request.size()), response_size);
        if (*got != expected.size() || !echoed(response, expected)) {
            MESSAGE("call ", n, ": a wrong response of ", *got, " bytes");
            ++*wrong;
        }
    }
}

struct Mixed {
    int wrong = 0;
    std::uint32_t large_requests = 0, large_responses = 0;
};

asio::awaitable<void> mixed_many(Rig* rig, std::optional<rpc::Session>* session, std::uint32_t coroutines,
                                 std::uint32_t calls, Mixed* out) {
    co_await connect_into(rig, session);
    std::uint32_t finished = 0;
    for (std::uint32_t c = 0; c < coroutines; ++c)
        asio::co_spawn(rig->io,
                       mixed_calls(&**session, c * 1000, calls, &out->wrong, &out->large_requests,
                                   &out->large_responses),
                       [&finished](std::exception_ptr) { ++finished; });
    co_await until([&finished, coroutines] { return finished == coroutines; });
}

} // namespace

TEST_CASE("rpc large: 32 B to 1 MiB each way, large requests READ and large responses WRITTEN, bytes checked") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    Mixed out;
    run(rig.io, mixed_many(&rig, &session, 4, 45, &out), 300s);
    CHECK(out.wrong == 0);
    const auto& c = rig.client->counters();
    const auto& s = rig.server->counters();
    CHECK(c.completed == 180);
    CHECK(s.handled == 180);
    CHECK(s.rdma_reads == out.large_requests);
    CHECK(s.rdma_writes == out.large_responses);
    CHECK(out.large_requests > 50);
    CHECK(out.large_responses > 50);
    MESSAGE("server: ", s.rdma_reads, " READs, ", s.rdma_writes, " WRITEs; client retransmissions ",
            c.retransmissions, ", copies ", c.copies);
}

TEST_CASE("rpc large: a client that keeps to UD moves the same messages as packets") {
    rpc::EndpointOptions ud_only = large;
    ud_only.rdma_threshold = UINT32_MAX;
    Rig rig(large, ud_only);
    add_sized(rig);
    std::optional<rpc::Session> session;
    Mixed out;
    run(rig.io, mixed_many(&rig, &session, 2, 12, &out), 300s);
    CHECK(out.wrong == 0);
    CHECK(rig.server->counters().handled == 24);
    CHECK(rig.server->counters().rdma_reads == 0);
    CHECK(rig.server->counters().rdma_writes == 0);
}

TEST_CASE("rpc large: the slot's next call, come before the last response's WRITE completion, is held, not dropped") {
    // The server on a thread of its own, its handler answering (the WRITE is posted)
    // and then keeping the thread 30 ms: meanwhile the client has the response's
    // immediate and sends the slot's next call, which the server, busy, polls (its UD
    // CQ first: the handler ran from the RC CQ's READ completion) before the WRITE's
    // completion.
    rpc::EndpointOptions server_options = large;
    server_options.listen_port = next_port();
    server_options.listen_address = "127.0.0.1";
    server_options.drive = {.mode = async::CompletionMode::busy};
    std::atomic<bool> listening = false, stop = false;
    rpc::Counters server_counters;
    std::thread server_thread([&] {
        asio::io_context io;
        auto server = must(rpc::Endpoint::create(io, server_options));
        server->set_handler(sized, [](rpc::Request request, rpc::Responder responder) {
            std::uint32_t size = 0;
            std::memcpy(&size, request.bytes().data(), 4);
            responder.respond(message(static_cast<std::uint32_t>(request.bytes().size()), size));
            std::this_thread::sleep_for(30ms);
        });
        listening = true;
        while (!stop)
            io.run_for(5ms);
        server_counters = server->counters();
    });
    while (!listening)
        std::this_thread::sleep_for(1ms);

    rpc::EndpointOptions one_slot = large;
    one_slot.window = 1;
    asio::io_context io;
    auto client = must(rpc::Endpoint::create(io, one_slot));
    int wrong = 0;
    constexpr std::uint32_t calls = 20;
    auto work = [&]() -> asio::awaitable<void> {
        auto session = co_await client->connect("127.0.0.1", server_options.listen_port);
        REQUIRE(session.has_value());
        std::vector<std::byte> response(64 * 1024);
        for (std::uint32_t n = 0; n < calls; ++n) {
            const auto request = ask(n, 20'000, 30'000 + n);
            const Result<std::size_t> got = co_await session->call(sized, request, response, {.timeout = 30s});
            const auto expected = message(20'000, 30'000 + n);
            wrong += !got || *got != expected.size() || !echoed(response, expected);
        }
    };
    run(io, work(), 120s);
    const rpc::Counters c = client->counters();
    client.reset();
    stop = true;
    server_thread.join();
    CHECK(wrong == 0);
    CHECK(c.completed == calls);
    CHECK(server_counters.rdma_reads == calls);
    CHECK(server_counters.rdma_writes == calls);
    CHECK(server_counters.held_for_write >= calls / 2);
    // dropped, each held call would have come again after an RTO (19 of 20 did): what
    // goes again now is a held call whose RTO, about the 30 ms it waits, fired first
    // (the copy is dropped while the first waits)
    CHECK(c.retransmissions < calls / 2);
    CHECK(server_counters.dropped() <= c.retransmissions);
    MESSAGE(server_counters.held_for_write, " of ", calls, " calls held, ", c.retransmissions, " retransmissions");
}

namespace {

struct Abandoned {
    std::optional<Error> timed_out, cancelled;
    int wrong = 0;
    bool untouched = false;
};

// The first call timed out, the second was cancelled, every later call was right.
void check_abandoned(const Abandoned& out) {
    REQUIRE(out.timed_out);
    CHECK(out.timed_out->is_timeout());
    REQUIRE(out.cancelled);
    CHECK(out.cancelled->is_cancelled());
    CHECK(out.wrong == 0);
}

// A large call times out while its handler holds it; the handler then answers with a
// large response, whose WRITE lands in staging memory the client has retired: the
// caller's buffer never sees it, and later calls in every slot are right. Then the
// same with a cancellation.
asio::awaitable<void> abandon_large(Rig* rig, std::optional<rpc::Session>* session, Abandoned* out) {
    co_await connect_into(rig, session);
    rpc::Session& s = **session;
    std::vector<std::byte> response(mib);
    std::ranges::fill(response, std::byte{0x5a});
    const auto big = message(7, 300'000);
    auto got = co_await s.call(hold_it, big, response, {.timeout = 300ms});
    if (!got)
        out->timed_out = got.error();
    // the next 8 calls take every window slot, the timed-out call's among them, while
    // its handler has not answered: that slot's server side waits for it
    std::vector<std::vector<std::byte>> requests, responses(8, std::vector<std::byte>(mib));
    std::uint32_t answered = 0;
    for (std::uint32_t n = 0; n < 8; ++n) {
        requests.push_back(ask(n, 20'000 + n, 50'000 + n));
        s.call(sized, requests[n], responses[n], {.timeout = 30s},
               [&answered, out, n, &responses](Result<std::size_t> r) {
                   ++answered;
                   const auto expected = message(20'000 + n, 50'000 + n);
                   if (!r || *r != expected.size() || !echoed(responses[n], expected))
                       ++out->wrong;
               });
    }
    co_await pause(100ms);
    rig->held.back().respond(message(9, 400'000)); // a late, large answer
    rig->held.pop_back();
    co_await until([&answered] { return answered == 8; });
    out->untouched = std::ranges::all_of(response, [](std::byte b) { return b == std::byte{0x5a}; });

    const auto cancelled = co_await cancelled_call(&s, hold_it, big, response, 100ms);
    if (!cancelled)
        out->cancelled = cancelled.error();
    rig->held.back().respond(message(10, 500'000));
    rig->held.pop_back();
    std::vector<std::byte> other(mib);
    for (std::uint32_t n = 0; n < 16; ++n) {
        const auto request = ask(n, 30'000, 60'000 + n);
        got = co_await s.call(sized, request, other, {.timeout = 30s});
        const auto expected = message(static_cast<std::uint32_t>(request.size()), 60'000 + n);
        if (!got || *got != expected.size() || !echoed(other, expected))
            ++out->wrong;
    }
    out->untouched = out->untouched && std::ranges::all_of(response, [](std::byte b) { return b == std::byte{0x5a}; });
}

} // namespace

namespace {

// A server that never answers (hold_it): each large call (a 64 KiB request, READ) is
// abandoned at its deadline, a round being one call per window slot. What a slot's
// abandoned calls offered waits for the server to answer in the slot; two of them
// abandoned, its next calls go by UD (the request as packets: Counters::copies counts
// each packet posted: an RC call's descriptor and its retransmissions at most 8, a UD
// call's request as many packets as its 16 credits let go, whatever the MTU) until
// one is answered, so such a server pins two calls' memory per slot, not one per call.
struct Unanswered {
    std::uint32_t window = 0;
    std::array<std::uint64_t, 3> held_rounds{}; // packets posted by each round of held calls
    std::uint64_t reads_before = 0, reads_after = 0; // the server's READs: held rounds, last round
    std::uint64_t last_copies = 0; // packets posted by the last round, after one answered per slot
    int wrong = 0;
};

asio::awaitable<void> never_answered(Rig* rig, Unanswered* out) {
    std::optional<rpc::Session> session;
    co_await connect_into(rig, &session);
    const std::uint32_t w = out->window = session->info().window;
    const auto request = message(3, 64 * 1024);
    std::vector<std::byte> response(request.size());
    const auto echo_round = [&]() -> asio::awaitable<void> {
        for (std::uint32_t i = 0; i < w; ++i) {
            const Result<std::size_t> got = co_await session->call(echo, request, response, {.timeout = 30s});
            out->wrong += got && *got == request.size() && echoed(response, request) ? 0 : 1;
        }
    };
    co_await echo_round(); // the RC path set up, every slot heard from
    const std::uint64_t reads = rig->server->counters().rdma_reads;
    for (std::uint64_t& posted : out->held_rounds) {
        const std::uint64_t before = rig->client->counters().copies;
        for (std::uint32_t i = 0; i < w; ++i) {
            const Result<std::size_t> got = co_await session->call(hold_it, request, response, {.timeout = 100ms});
            out->wrong += !got && (got.error().is_timeout() || got.error().is_errno(EHOSTUNREACH)) ? 0 : 1;
        }
        posted = rig->client->counters().copies - before;
    }
    out->reads_before = rig->server->counters().rdma_reads - reads;
    for (rpc::Responder& held : rig->held) // late: their calls were abandoned
        held.respond({});
    rig->held.clear();
    co_await echo_round(); // by UD, answered: each slot heard from again
    const std::uint64_t before = rig->client->counters().copies;
    const std::uint64_t reads_now = rig->server->counters().rdma_reads;
    co_await echo_round();
    out->last_copies = rig->client->counters().copies - before;
    out->reads_after = rig->server->counters().rdma_reads - reads_now;
}

} // namespace

TEST_CASE("rpc large: a server that never answers a slot pins two abandoned calls' memory there, then the slot's "
          "calls go by UD until one is answered") {
    Rig rig(large, large);
    Unanswered out;
    run(rig.io, never_answered(&rig, &out), 60s);
    const std::uint64_t w = out.window;
    CHECK(out.wrong == 0);
    CHECK(out.held_rounds[0] <= 8 * w); // descriptors
    CHECK(out.held_rounds[1] <= 8 * w);
    CHECK(out.held_rounds[2] > 8 * w); // 64 KiB in packets
    CHECK(out.reads_before == w);        // the first round's; the server's slots were busy since
    CHECK(out.last_copies <= 2 * w);     // descriptors again
    CHECK(out.reads_after == w);
}

TEST_CASE("rpc large: an abandoned large call's late WRITE reaches neither its caller nor a later call") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    Abandoned out;
    run(rig.io, abandon_large(&rig, &session, &out), 120s);
    check_abandoned(out);
    CHECK(out.untouched);
    CHECK(rig.server->counters().rdma_writes >= 2 + 8 + 16);
    CHECK(rig.client->counters().rc_misuses == 0); // the abandoned calls' late immediates are honest
}

namespace {

asio::awaitable<void> end_mid_transfer(Rig* rig, std::optional<rpc::Session>* session, int* ended, int* answered) {
    co_await connect_into(rig, session);
    std::vector<std::vector<std::byte>> requests, responses(8, std::vector<std::byte>(mib));
    for (std::uint32_t n = 0; n < 8; ++n)
        requests.push_back(ask(n, mib, mib));
    for (std::uint32_t n = 0; n < 8; ++n)
        (*session)->call(sized, requests[n], responses[n], {.timeout = 30s},
                         [ended, answered](Result<std::size_t> r) {
                             *ended += !r && r.error().is_errno(ECONNRESET);
                             *answered += r && *r == mib;
                         });
    co_await pause(20ms);
    session->reset(); // transfers in flight: the QPs go before the memory they reach
    co_await pause(500ms);
}

} // namespace

namespace {

// A large request's handler removed while the request is READ, by the handler of a
// small request sent after it (the API allows it at any time): the READ's completion
// answers "no handler", where it called the handler that was no more.
constexpr std::uint8_t unset_sized = 6;

struct Unset {
    std::optional<Result<std::size_t>> large, small;
    bool sized_ran = false;
    bool served_after = false; // an echo on the same session, after both
    std::uint64_t reads_when_unset = 0, handled_when_unset = 0;
};

asio::awaitable<void> unset_mid_read(Rig* rig, std::optional<rpc::Session>* session, Unset* out) {
    co_await connect_into(rig, session);
    const auto big = ask(1, mib, 4);
    const auto small = message(2, 16);
    std::vector<std::byte> response(mib), small_response(16);
    (*session)->call(sized, big, response, {.timeout = 30s},
                     [out](Result<std::size_t> r) { out->large = std::move(r); });
    (*session)->call(unset_sized, small, small_response, {.timeout = 30s},
                     [out](Result<std::size_t> r) { out->small = std::move(r); });
    co_await until([out] { return out->large && out->small; });
    const auto request = message(3, 32);
    std::vector<std::byte> echoed_back(32);
    out->served_after = (co_await (*session)->call(echo, request, echoed_back)).has_value();
}

} // namespace

TEST_CASE("rpc large: a large request whose handler is removed while it is READ is answered \"no handler\"") {
    Rig rig(large, large);
    Unset out;
    rig.server->set_handler(sized, [&out](rpc::Request, rpc::Responder responder) {
        out.sized_ran = true;
        responder.respond({});
    });
    rig.server->set_handler(unset_sized, [&rig, &out](rpc::Request, rpc::Responder responder) {
        out.reads_when_unset = rig.server->counters().rdma_reads; // posted
        out.handled_when_unset = rig.server->counters().handled;  // this one's only
        rig.server->set_handler(sized, {});
        responder.respond({});
    });
    std::optional<rpc::Session> session;
    run(rig.io, unset_mid_read(&rig, &session, &out), 60s);
    CHECK(out.reads_when_unset == 1); // the large request's READ was posted, its handler not run
    CHECK(out.handled_when_unset == 1);
    CHECK_FALSE(out.sized_ran);
    REQUIRE(out.large);
    REQUIRE_FALSE(out.large->has_value());
    CHECK_MESSAGE(out.large->error().is_errno(ENOENT), out.large->error().message());
    REQUIRE(out.small);
    CHECK(out.small->has_value());
    CHECK(out.served_after); // the session goes on
}

TEST_CASE("rpc large: a session ended with 1 MiB transfers in flight ends its calls and frees nothing early") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    int ended = 0, answered = 0;
    run(rig.io, end_mid_transfer(&rig, &session, &ended, &answered), 60s);
    CHECK(ended + answered == 8);
    CHECK(ended >= 1); // 8 MiB each way does not move in 20 ms under emulation
    MESSAGE(answered, " answered before the end, ", ended, " reset");
    CHECK(rig.server->sessions() == 0);
    CHECK(rig.client->sessions() == 0);
}

// ---------------------------------------------------------------------------------
// Calls with MessageBuffers

namespace {

// A request buffer holding ask(n, size, response), a response buffer of `capacity`.
struct Buffers {
    rpc::MessageBuffer request, response;
};

Buffers buffers_for(rpc::Endpoint& client, std::uint32_t n, std::size_t size, std::uint32_t response,
                    std::uint32_t capacity) {
    const auto bytes = ask(n, size, response);
    auto request = must(client.alloc_buffer(bytes.size(), rpc::BufferUse::request));
    std::ranges::copy(bytes, request.bytes().begin());
    return {std::move(request), must(client.alloc_buffer(capacity, rpc::BufferUse::response))};
}

// Whether `response` holds exactly sized's answer to `request`.
bool answered(const rpc::MessageBuffer& request, const rpc::MessageBuffer& response, std::uint32_t size) {
    const auto expected = message(static_cast<std::uint32_t>(request.size()), size);
    return response.size() == expected.size() && echoed(response.bytes(), expected);
}

struct Lent {
    int wrong = 0;
    int unexpected_copies = 0;
};

// Each shape with fresh buffers: what is copied is exactly what must be.
asio::awaitable<void> lent_calls(Rig* rig, std::optional<rpc::Session>* session, Lent* out) {
    co_await connect_into(rig, session);
    struct Shape {
        std::size_t request;
        std::uint32_t capacity, response;
        std::uint64_t message_copies; // at the client
        bool ud;                      // no descriptor: no packet copied either
    };
    const Shape shapes[] = {
        {100, 4096, 100, 1, true},               // UD each way: the response out of the window
        {3000, 8192, 5000, 1, true},             // several packets each way
        {16 * 1024, 16 * 1024, 16 * 1024, 1, true}, // at the threshold: UD
        {4, 4096, 0, 0, true},                   // an empty response: nothing to copy
        {100, mib, 300'000, 1, false},           // the request inline in its descriptor, WRITTEN response
        {40'000, mib, 300'000, 0, false},        // READ from and WRITTEN into the buffers
        {mib, mib, mib, 0, false},
        {300'000, 4096, 10, 1, false},           // READ request, UD response
    };
    std::uint32_t n = 0;
    for (const Shape& shape : shapes) {
        for (int round = 0; round < 3; ++round, ++n) {
            Buffers b = buffers_for(*rig->client, n, shape.request, shape.response, shape.capacity);
            const auto before = rig->client->counters();
            const auto got = co_await (*session)->call(sized, b.request, b.response, {.timeout = 60s});
            const auto& after = rig->client->counters();
            if (!got || *got != b.response.size() || !answered(b.request, b.response, shape.response)) {
                MESSAGE("shape ", shape.request, "/", shape.response, ": ", got ? "a wrong response" : got.error().message());
                ++out->wrong;
            }
            if (after.message_copies - before.message_copies != shape.message_copies ||
                (shape.ud && after.copies != before.copies)) {
                MESSAGE("shape ", shape.request, "/", shape.response, ": ", after.message_copies - before.message_copies,
                        " message copies, ", after.copies - before.copies, " packet copies");
                ++out->unexpected_copies;
            }
        }
    }
}

// One request and two response buffers reused for mixed calls, and four such callers at once.
asio::awaitable<void> reused_buffers(rpc::Endpoint* client, rpc::Session* session, std::uint32_t first, int* wrong) {
    auto request = must(client->alloc_buffer(mib, rpc::BufferUse::request));
    auto small = must(client->alloc_buffer(16 * 1024, rpc::BufferUse::response));
    auto large = must(client->alloc_buffer(mib, rpc::BufferUse::response));
    for (std::uint32_t n = first; n < first + 30; ++n) {
        const auto bytes = ask(n, size_of(n), static_cast<std::uint32_t>(size_of(n * 3 + 1)));
        const auto response_size = static_cast<std::uint32_t>(size_of(n * 3 + 1));
        request.resize(bytes.size());
        std::ranges::copy(bytes, request.bytes().begin());
        rpc::MessageBuffer& response = response_size <= 16 * 1024 ? small : large;
        response.resize(response.capacity());
        const auto got = co_await session->call(sized, request, response, {.timeout = 60s});
        if (!got || !answered(request, response, response_size)) {
            MESSAGE("call ", n, ": ", got ? "a wrong response" : got.error().message());
            ++*wrong;
        }
    }
}

asio::awaitable<void> reused_many(Rig* rig, std::optional<rpc::Session>* session, int* wrong) {
    co_await connect_into(rig, session);
    std::uint32_t finished = 0;
    for (std::uint32_t c = 0; c < 4; ++c)
        asio::co_spawn(rig->io, reused_buffers(rig->client.get(), &**session, c * 1000, wrong),
                       [&finished](std::exception_ptr e) {
                           ++finished;
                           if (e)
                               std::rethrow_exception(e);
                       });
    co_await until([&finished] { return finished == 4; });
}

struct AbandonedLent : Abandoned {
    bool retried = false, kept = false;
};

// A large call with MessageBuffers times out while its handler holds it: the buffers
// get new memory (the request's bytes along), so the same call again with the same
// buffers is answered right, and the first call's late WRITE lands in the old memory,
// not in the response buffer. Then a cancelled one whose buffers are destroyed at
// once: its late WRITE lands in memory kept for it, and the session lives on.
asio::awaitable<void> abandon_lent(Rig* rig, std::optional<rpc::Session>* session, AbandonedLent* out) {
    co_await connect_into(rig, session);
    rpc::Session& s = **session;
    Buffers b = buffers_for(*rig->client, 7, 300'000, 0, mib);
    const auto timed_out = co_await s.call(hold_it, b.request, b.response, {.timeout = 300ms});
    if (!timed_out)
        out->timed_out = timed_out.error();
    const auto again = co_await s.call(echo, b.request, b.response, {.timeout = 30s});
    out->retried = again && *again == 300'000 && echoed(b.response.bytes(), ask(7, 300'000, 0));
    rig->held.back().respond(message(9, 400'000)); // the late, large answer to the first call
    rig->held.pop_back();
    co_await pause(300ms);
    out->kept = b.response.size() == 300'000 && echoed(b.response.bytes(), ask(7, 300'000, 0));

    {
        Buffers doomed = buffers_for(*rig->client, 8, 200'000, 0, mib);
        const auto cancelled = co_await cancelled_call(&s, hold_it, doomed.request, doomed.response, 100ms);
        if (!cancelled)
            out->cancelled = cancelled.error();
    } // destroyed: the server READ the request, its WRITE is still to come
    rig->held.back().respond(message(10, 500'000));
    rig->held.pop_back();
    co_await pause(300ms);
    for (std::uint32_t n = 0; n < 16; ++n) {
        Buffers more = buffers_for(*rig->client, n, 30'000, 60'000 + n, mib);
        const auto got = co_await s.call(sized, more.request, more.response, {.timeout = 30s});
        if (!got || !answered(more.request, more.response, 60'000 + n))
            ++out->wrong;
    }
}

} // namespace

TEST_CASE("rpc large: calls with MessageBuffers copy no request and no large response") {
    rpc::EndpointOptions at_16_kib = large; // the shapes' threshold
    at_16_kib.rdma_threshold = 16 * 1024;
    Rig rig(at_16_kib, at_16_kib);
    add_sized(rig);
    std::optional<rpc::Session> session;
    Lent out;
    run(rig.io, lent_calls(&rig, &session, &out), 300s);
    CHECK(out.wrong == 0);
    CHECK(out.unexpected_copies == 0);
    CHECK(rig.client->counters().buffers_renewed == 0);
}

TEST_CASE("rpc large: MessageBuffers reused for mixed calls by four callers at once, bytes checked") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    int wrong = 0;
    run(rig.io, reused_many(&rig, &session, &wrong), 300s);
    CHECK(wrong == 0);
    CHECK(rig.client->counters().completed == 120);
    MESSAGE("message copies ", rig.client->counters().message_copies, " in 120 calls");
}

TEST_CASE("rpc large: an abandoned call's MessageBuffers get new memory; its late WRITE meets only the old") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    AbandonedLent out;
    run(rig.io, abandon_lent(&rig, &session, &out), 120s);
    check_abandoned(out);
    CHECK(out.retried);
    CHECK(out.kept);
    CHECK(rig.client->counters().buffers_renewed == 4);
    CHECK(rig.client->sessions() == 1);
}

namespace {

// Registering more than `room` bytes beyond what the process has pinned now fails
// while this lives, as the device's memory runs out: RLIMIT_MEMLOCK at the pinned bytes
// plus `room`, which binds while a test::WithoutIpcLock lives. (An address-space limit
// would not do: malloc reuses memory freed by earlier tests.)
class PinLimit {
public:
    explicit PinLimit(std::size_t room) {
        REQUIRE(::getrlimit(RLIMIT_MEMLOCK, &was_) == 0);
        std::ifstream status("/proc/self/status");
        std::size_t pinned_kib = 0;
        for (std::string line; std::getline(status, line);)
            if (line.starts_with("VmPin:"))
                pinned_kib = std::stoul(line.substr(6));
        rlimit limited = was_;
        limited.rlim_cur = pinned_kib * 1024 + room;
        REQUIRE(::setrlimit(RLIMIT_MEMLOCK, &limited) == 0);
    }
    PinLimit(const PinLimit&) = delete;
    PinLimit& operator=(const PinLimit&) = delete;
    ~PinLimit() { ::setrlimit(RLIMIT_MEMLOCK, &was_); }

private:
    rlimit was_{};
};

struct Unrenewed {
    std::optional<Error> timed_out;
    std::uint64_t renewals_failed = 0;
    bool session_ended = false;
    bool untouched = false; // the response buffer, after the server's late answer
};

// A call lends a 32 MiB response buffer and times out while the server holds it; the
// buffer's new memory cannot be registered. The server then answers, late.
asio::awaitable<void> unrenewable(Rig* rig, std::optional<rpc::Session>* session, Unrenewed* out) {
    co_await connect_into(rig, session);
    constexpr std::uint32_t capacity = 32 * mib;
    Buffers b = buffers_for(*rig->client, 3, 100, 0, capacity);
    // a large answer first: the session's RC path is then set up, and the held call lends
    std::vector<std::byte> warm(mib);
    REQUIRE(co_await (**session).call(sized, ask(1, 100, mib), warm, {.timeout = 30s}));
    std::optional<Result<std::size_t>> got;
    (**session).call(hold_it, b.request, b.response, {.timeout = 2s},
                     [&got](Result<std::size_t> r) { got = std::move(r); });
    co_await until([rig] { return !rig->held.empty(); }); // the server has it, and the buffer's key
    {
        const test::CapturedLog log;
        const PinLimit limit(8 * mib);
        co_await until([&got] { return got.has_value(); });
        MESSAGE("logged while pinning was limited: ", log.text());
    }
    if (!*got)
        out->timed_out = got->error();
    out->renewals_failed = rig->client->counters().renewals_failed;
    b.response.resize(capacity);
    std::ranges::fill(b.response.bytes(), std::byte{0x5a});
    REQUIRE(!rig->held.empty());
    rig->held.back().respond(message(9, mib)); // the late answer: a 1 MiB WRITE
    rig->held.pop_back();
    co_await pause(2s);
    out->untouched = std::ranges::all_of(b.response.bytes(), [](std::byte x) { return x == std::byte{0x5a}; });
    for (int i = 0; i < 100 && rig->client->sessions() != 0; ++i)
        co_await pause(50ms);
    out->session_ended = rig->client->sessions() == 0;
    const rpc::Counters& c = rig->client->counters();
    MESSAGE("renewed ", c.buffers_renewed, ", renewals failed ", c.renewals_failed, ", client sessions ",
            rig->client->sessions(), ", server WRITEs ", rig->server->counters().rdma_writes);
}

} // namespace

// Where the memory to renew a buffer cannot be had, the session's RC QP stops taking
// transfers at once and the session ends: the late WRITE never lands in the buffer
// (the caller's again).
TEST_CASE("rpc large: an abandoned call's buffer that gets no new memory ends its session; its late WRITE does "
          "not land") {
    rpc::EndpointOptions big = large;
    big.max_response = 32 * mib;
    const test::WithoutIpcLock without; // before the devices open: their posts go on working
    Rig rig(big, big);
    add_sized(rig);
    std::optional<rpc::Session> session;
    Unrenewed out;
    run(rig.io, unrenewable(&rig, &session, &out), 60s);
    REQUIRE(out.timed_out);
    CHECK(out.timed_out->is_timeout());
    CHECK(out.renewals_failed == 1);
    CHECK(out.untouched);
    CHECK(out.session_ended);
    CHECK(rig.client->counters().buffers_renewed == 0);
}

namespace {

struct Unstageable {
    std::uint32_t answered = 0;
    std::size_t lines = 0, held_back = 0;
    std::size_t most_in_a_second = 0; // of the endpoints' lines
};

// 40 calls at once while the process may pin no more memory, then one more a second
// later: each call's staging for its large response fails (a warning), and the call goes
// by UD, answered.
asio::awaitable<void> unstageable_calls(Rig* rig, std::optional<rpc::Session>* session, Unstageable* out) {
    co_await connect_into(rig, session);
    std::vector<std::byte> warm(1024);
    // the RC path set up; its slot stages 4 KiB, too little for the calls below
    REQUIRE(co_await (**session).call(sized, ask(0, 32, 1024), warm, {.timeout = 30s}));
    constexpr std::uint32_t calls = 40;
    std::vector<std::vector<std::byte>> requests, responses(calls + 1, std::vector<std::byte>(64 * 1024));
    for (std::uint32_t n = 0; n <= calls; ++n)
        requests.push_back(ask(n, 32, 2048));
    std::uint32_t done = 0;
    const test::CapturedLog log;
    {
        const PinLimit limit(0);
        for (std::uint32_t n = 0; n < calls; ++n)
            (**session).call(sized, requests[n], responses[n], {.timeout = 30s}, [&done, out](Result<std::size_t> got) {
                ++done;
                out->answered += got ? 1 : 0;
            });
        co_await until([&done] { return done == calls; });
        co_await pause(1100ms); // the budget's next second: the next line says what was held back
        const auto last = co_await (**session).call(sized, requests[calls], responses[calls], {.timeout = 30s});
        out->answered += last ? 1 : 0;
    }
    out->lines = log.count("rdmaxx");
    out->most_in_a_second = log.most_in_a_second("rdmaxx");
    out->held_back = log.count("messages like the next held back");
}

struct Refused {
    std::optional<Error> error;
    std::chrono::milliseconds took{0};
    std::size_t sessions_after = 0;
    std::size_t errors_logged = 0;
};

// A call, then the process's credentials change: every post of the devices the rig
// opened before is refused (EACCES), the next call's request first.
asio::awaitable<void> refused_call(Rig* rig, std::optional<rpc::Session>* session, Refused* out) {
    co_await connect_into(rig, session);
    std::vector<std::byte> request = ask(0, 32, 64), response(1024);
    REQUIRE(co_await (**session).call(sized, request, response, {.timeout = 30s}));
    const test::CapturedLog log; // the refused send's error
    const test::WithoutIpcLock without;
    const auto start = std::chrono::steady_clock::now();
    const auto got = co_await (**session).call(sized, request, response, {.timeout = 30s});
    out->took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (!got)
        out->error = got.error();
    for (int i = 0; i < 100 && rig->client->sessions() != 0; ++i)
        co_await pause(10ms);
    out->sessions_after = rig->client->sessions();
    out->errors_logged = log.count("rdmaxx rpc: sending to session");
}

} // namespace

// An endpoint's warnings and errors go within its budget (10 a second, then how many
// were held back): 41 calls that each log a warning give 10 lines in a second, then the
// count of those held back.
TEST_CASE("rpc large: 41 calls whose staging fails log 10 lines a second at most, then say what they held back") {
    const test::WithoutIpcLock without; // before the devices open: their posts go on working
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    Unstageable out;
    run(rig.io, unstageable_calls(&rig, &session, &out), 60s);
    MESSAGE(out.lines, " lines logged, at most ", out.most_in_a_second, " in a second; ", out.held_back,
            " of them saying how many were held back");
    CHECK(out.answered == 41);
    CHECK(out.held_back >= 1);
    CHECK(out.most_in_a_second <= 20); // a budget's second may straddle two of the clock's
}

// Soft-RoCE refuses every post of a device opened under other credentials (EACCES) and
// will go on refusing: the session ends at once, not each call by its timeout.
TEST_CASE("rpc large: sends the device refuses for good (EACCES) end the session at once; the call fails saying why") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    Refused out;
    run(rig.io, refused_call(&rig, &session, &out), 60s);
    REQUIRE(out.error);
    MESSAGE("failed in ", out.took.count(), " ms: ", out.error->message());
    CHECK(out.error->is_errno(ECONNRESET));
    CHECK(out.error->message().find("refuses this endpoint's sends for good") != std::string::npos);
    CHECK(out.error->message().find("credentials changed") != std::string::npos);
    CHECK(out.took < 3s); // the call's timeout is 30 s; left to its retransmissions it ends in seconds
    CHECK(out.sessions_after == 0);
    CHECK(out.errors_logged >= 1);
}

namespace {

struct CancelledAtOnce {
    std::uint64_t renewed[2] = {};
    int not_cancelled = 0;
};

// Two calls with MessageBuffers cancelled as soon as they are sent, before any poll: a
// 64-byte request goes inline, copied into the WR at its post, so nothing may still read
// its buffer and it keeps its memory; a 500-byte one is gathered by a UD send still
// queued, so its buffer gets new memory.
asio::awaitable<void> cancel_at_once(Rig* rig, std::optional<rpc::Session>* session, CancelledAtOnce* out) {
    co_await connect_into(rig, session);
    rpc::Session& s = **session;
    constexpr std::size_t sizes[] = {64, 500};
    for (std::uint32_t k = 0; k < 2; ++k) {
        Buffers b = buffers_for(*rig->client, k, sizes[k], 16, 64); // by UD: no RC offer first
        const std::uint64_t before = rig->client->counters().buffers_renewed;
        asio::cancellation_signal signal;
        std::optional<Result<std::size_t>> got;
        s.call(sized, b.request, b.response, {.timeout = 30s},
               asio::bind_cancellation_slot(signal.slot(), [&got](Result<std::size_t> r) { got = std::move(r); }));
        signal.emit(asio::cancellation_type::terminal);
        co_await until([&got] { return got.has_value(); });
        if (*got || !got->error().is_cancelled())
            ++out->not_cancelled;
        out->renewed[k] = rig->client->counters().buffers_renewed - before;
    }
}

} // namespace

TEST_CASE("rpc large: a call cancelled as it is sent renews its request buffer only if a UD send still reads it") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    CancelledAtOnce out;
    run(rig.io, cancel_at_once(&rig, &session, &out), 60s);
    CHECK(out.not_cancelled == 0);
    CHECK(out.renewed[0] == 0); // inline: held by nothing after its post
    CHECK(out.renewed[1] == 1);
}

namespace {

struct SharedRequest {
    std::optional<Error> timed_out;
    bool queued_right = false;
};

// Eight held calls fill the window, the first of them lending a request buffer that a
// ninth call, queued behind them, also names. The first times out (the buffer gets new
// memory) and the held ones are answered; the ninth then begins, in the first's slot,
// from the buffer as it is now, and is answered right.
asio::awaitable<void> share_while_queued(Rig* rig, std::optional<rpc::Session>* session, SharedRequest* out) {
    co_await connect_into(rig, session);
    rpc::Session& s = **session;
    Buffers shared = buffers_for(*rig->client, 5, 300'000, 0, mib);
    auto other_response = must(rig->client->alloc_buffer(mib, rpc::BufferUse::response));
    std::optional<Result<std::size_t>> first, ninth;
    s.call(hold_it, shared.request, shared.response, {.timeout = 300ms},
           [&first](Result<std::size_t> r) { first = std::move(r); });
    std::vector<std::vector<std::byte>> held_responses(7, std::vector<std::byte>(64));
    const auto small = message(1, 10);
    int held_done = 0;
    for (auto& response : held_responses)
        s.call(hold_it, small, response, {.timeout = 30s}, [&held_done](Result<std::size_t>) { ++held_done; });
    s.call(echo, shared.request, other_response, {.timeout = 30s},
           [&ninth](Result<std::size_t> r) { ninth = std::move(r); });
    co_await until([&first] { return first.has_value(); });
    if (!*first)
        out->timed_out = first->error();
    // the server's slot of the first call is its handler's until it answers (late)
    for (auto& responder : rig->held)
        responder.respond(message(2, 10));
    rig->held.clear();
    co_await until([&ninth] { return ninth.has_value(); });
    out->queued_right = *ninth && **ninth == 300'000 && echoed(other_response.bytes(), ask(5, 300'000, 0));
    co_await until([&held_done] { return held_done == 7; }); // their buffers are this frame's
}

} // namespace

TEST_CASE("rpc large: a queued call reads its MessageBuffer as it is when it begins, after another renewed it") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    SharedRequest out;
    run(rig.io, share_while_queued(&rig, &session, &out), 120s);
    REQUIRE(out.timed_out);
    CHECK(out.timed_out->is_timeout());
    CHECK(out.queued_right);
    CHECK(rig.client->counters().buffers_renewed >= 1);
}

TEST_CASE("rpc large: past 2,048 calls that may still get a WRITTEN response, a call offers no memory") {
    // Each such call may consume one of the client's 4,096 receives for immediates: half
    // of them bound the calls, the rest is room for immediates not yet polled. A call
    // past the bound gets its large response in UD packets; once the calls are heard
    // from, the next one offers memory again.
    rpc::EndpointOptions wide = large;
    wide.window = 1024;
    wide.credits = 1024; // every held call's request reaches the server at once
    wide.ring = 4096;
    Rig rig(wide, wide);
    add_sized(rig);
    constexpr std::uint32_t bound = 2048, past = 17 * 1024 + 1;
    std::vector<rpc::Session> sessions;
    std::vector<Buffers> buffers;
    buffers.reserve(bound + 2); // the calls hold references to them
    std::uint32_t ended = 0;
    int wrong = 0;
    auto work = [&]() -> asio::awaitable<void> {
        for (int k = 0; k < 3; ++k) {
            auto session = co_await rig.client->connect("127.0.0.1", rig.port);
            REQUIRE(session.has_value());
            sessions.push_back(std::move(*session));
        }
        const auto begin = [&](rpc::Session& session, std::uint8_t type, std::uint32_t response_size) {
            const auto n = static_cast<std::uint32_t>(buffers.size());
            buffers.push_back(buffers_for(*rig.client, n, 32, response_size, past));
            session.call(type, buffers.back().request, buffers.back().response, {.timeout = 120s},
                         [&, n, response_size](Result<std::size_t> r) {
                             ++ended;
                             wrong += !r || *r != response_size;
                         });
        };
        for (std::uint32_t n = 0; n < bound; ++n)
            begin(sessions[n / 1024], hold_it, 8);
        co_await until([&] { return rig.held.size() == bound; });
        begin(sessions[2], hold_it, past);
        co_await until([&] { return rig.held.size() == bound + 1; });
        for (std::uint32_t n = 0; n < bound; ++n)
            rig.held[n].respond(message(n, 8));
        rig.held[bound].respond(message(7, past));
        co_await until([&] { return ended == bound + 1; });
        CHECK(wrong == 0);
        CHECK(rig.server->counters().rdma_writes == 0); // the last call's response came by UD
        CHECK(echoed(buffers[bound].response.bytes(), message(7, past)));
        begin(sessions[0], sized, past);
        co_await until([&] { return ended == bound + 2; });
        CHECK(wrong == 0);
        CHECK(answered(buffers[bound + 1].request, buffers[bound + 1].response, past));
        CHECK(rig.server->counters().rdma_writes == 1); // it offered memory again
    };
    run(rig.io, work(), 300s);
    rig.held.clear();
}

TEST_CASE("rpc large: a request of up to 16 KiB is SENT whole over RC, neither READ nor sent in UD packets, "
          "bytes checked") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    int wrong = 0;
    std::uint32_t whole = 0;
    auto work = [&]() -> asio::awaitable<void> {
        co_await connect_into(&rig, &session);
        std::vector<std::byte> response(64 * 1024); // above the threshold: a descriptor call
        std::uint32_t n = 0;
        for (const std::size_t request_size : {32, 1000, 2000, 4096, 9000, 16 * 1024})
            for (const std::uint32_t response_size : {8u, 20'000u}) {
                const auto request = ask(n++, request_size, response_size);
                // a descriptor of one UD packet goes as one; a larger one whole
                whole += 40 + request.size() > session->info().payload_per_packet; // 40: the descriptor's head
                const auto got = co_await session->call(sized, request, response, {.timeout = 20s});
                const auto expected = message(static_cast<std::uint32_t>(request.size()), response_size);
                wrong += !got || *got != expected.size() || !echoed(response, expected);
            }
        // with MessageBuffers: the request SENT from its buffer (the header and
        // descriptor in the room in front), uncopied, the response WRITTEN into its
        // buffer; the buffer called with again at once, its bytes rewritten each time
        Buffers b{must(rig.client->alloc_buffer(16 * 1024, rpc::BufferUse::request)),
                  must(rig.client->alloc_buffer(64 * 1024, rpc::BufferUse::response))};
        const auto before = rig.client->counters();
        for (std::uint32_t again = 0; again < 4; ++again, ++whole) {
            const auto bytes = ask(n + again, 2000 + 4000 * again, 20'000);
            b.request.resize(bytes.size());
            std::ranges::copy(bytes, b.request.bytes().begin());
            b.response.resize(b.response.capacity());
            const auto got = co_await session->call(sized, b.request, b.response, {.timeout = 20s});
            wrong += !got || !answered(b.request, b.response, 20'000);
            if (again == 0)
                CHECK(rig.client->counters().message_copies == before.message_copies);
        }
        const auto& after = rig.client->counters();
        CHECK(after.rdma_sends >= before.rdma_sends + 4);
        // (a call that begins while its buffer's previous SEND is still in flight is copied)
        MESSAGE("4 calls with one request buffer: ", after.message_copies - before.message_copies, " copied");
    };
    run(rig.io, work(), 60s);
    CHECK(wrong == 0);
    CHECK(whole >= 7); // 11 at rxe's default MTU of 1024
    const auto& c = rig.client->counters();
    const auto& s = rig.server->counters();
    CHECK(c.rdma_sends >= whole); // a resend after an RTO is SENT again
    CHECK(c.rdma_sends <= whole + c.retransmissions);
    CHECK(s.rdma_reads == 0);
    CHECK(s.rdma_writes == 10); // the 20,000-byte responses
    CHECK(s.request_copies == 0); // each whole request lent to its handler where it arrived
    CHECK(s.dropped() == 0);
    MESSAGE("client SENDs ", c.rdma_sends, ", retransmissions ", c.retransmissions);
}

TEST_CASE("rpc large: a slow handler's caller asks by probes, less and less often, not whole SENDs; its "
          "MessageBuffer, the call abandoned, keeps its bytes and is lent again, uncopied; the response buffer "
          "gets new memory") {
    Rig rig(large, large);
    add_sized(rig);
    std::optional<rpc::Session> session;
    auto work = [&]() -> asio::awaitable<void> {
        co_await connect_into(&rig, &session);
        Buffers b = buffers_for(*rig.client, 0, 3000, 20'000, 64 * 1024);
        const auto bytes = ask(0, 3000, 20'000);
        const auto before = rig.client->counters();
        // the server holds the call: it times out. Its request is SENT whole once (twice
        // if the SEND's completion came after the first RTO), then asked about by probes
        // (UD headers), so no SEND reads the buffer when the call ends: only the response
        // buffer, which the server may still WRITE into, gets new memory
        // (probes twice as far apart each time: with the RTO at 100 ms, about 3 in a
        // second where 9 would go at one per RTO)
        const auto held = co_await session->call(hold_it, b.request, b.response, {.timeout = 1s});
        CHECK((!held && held.error().is_timeout()));
        const auto& after = rig.client->counters();
        MESSAGE("SENDs ", after.rdma_sends - before.rdma_sends, ", probes ", after.probes - before.probes);
        CHECK(after.rdma_sends > before.rdma_sends);
        CHECK(after.rdma_sends - before.rdma_sends <= 2);
        CHECK(after.probes - before.probes >= 2);
        CHECK(after.probes - before.probes <= 5);
        CHECK(after.buffers_renewed == before.buffers_renewed + 1);
        CHECK(std::ranges::equal(b.request.bytes(), bytes));
        b.response.resize(b.response.capacity());
        const auto got = co_await session->call(sized, b.request, b.response, {.timeout = 20s});
        CHECK((got && answered(b.request, b.response, 20'000)));
        CHECK(rig.client->counters().message_copies == before.message_copies);
    };
    run(rig.io, work(), 60s);
}

TEST_CASE("rpc large: with every message on the RC path, an echo of 32 B or 2 KiB is one SEND and one WRITE, "
          "not a READ") {
    rpc::EndpointOptions every = large;
    every.rdma_threshold = 0;
    Rig rig(every, every);
    std::optional<rpc::Session> session;
    int wrong = 0;
    auto work = [&]() -> asio::awaitable<void> {
        co_await connect_into(&rig, &session);
        std::vector<std::byte> response(4096);
        for (const std::size_t size : {32, 2048})
            for (std::uint32_t n = 0; n < 20; ++n) {
                const auto request = message(n, size);
                const auto got = co_await session->call(echo, request, response, {.timeout = 20s});
                wrong += !got || *got != request.size() || !echoed(response, request);
            }
    };
    run(rig.io, work(), 60s);
    CHECK(wrong == 0);
    CHECK(rig.client->counters().rdma_sends >= 40);
    CHECK(rig.server->counters().rdma_reads == 0);
    CHECK(rig.server->counters().rdma_writes == 40);
}

TEST_CASE("rpc large: a session whose limits cannot hold the RC path's descriptors keeps to UD, with every "
          "message on the RC path asked") {
    // a server agrees to any small limits: a 40-byte request descriptor does not fit in
    // a 32-byte max_request, a 4-byte response descriptor not in a 2-byte max_response
    for (const auto& [max_request, max_response] : {std::pair{32u, mib}, std::pair{mib, 2u}}) {
        INFO("max_request ", max_request, ", max_response ", max_response);
        rpc::EndpointOptions small = large;
        small.max_request = max_request;
        small.max_response = max_response;
        rpc::EndpointOptions every = large;
        every.rdma_threshold = 0;
        Rig rig(small, every);
        std::optional<rpc::Session> session;
        int wrong = 0;
        auto work = [&]() -> asio::awaitable<void> {
            co_await connect_into(&rig, &session);
            std::vector<std::byte> response(4096);
            for (std::uint32_t n = 0; n < 10; ++n) {
                const auto request = message(n, 2);
                const auto got = co_await session->call(echo, request, response, {.timeout = 20s});
                wrong += !got || *got != request.size() || !echoed(response, request);
            }
        };
        run(rig.io, work(), 60s);
        CHECK(wrong == 0);
        CHECK(rig.client->counters().rdma_sends == 0);
        CHECK(rig.server->counters().rdma_reads == 0);
        CHECK(rig.server->counters().rdma_writes == 0);
        CHECK(rig.client->counters().dropped() == 0);
    }
}

TEST_CASE("rpc large: past the server's receive buffers for whole requests, a session sends its requests as "
          "before; a session's end gives its buffers back") {
    // 256 buffers, a window's worth per session: two sessions of 128 take them all
    rpc::EndpointOptions wide = large;
    wide.window = 128;
    Rig rig(wide, wide);
    add_sized(rig);
    std::vector<std::optional<rpc::Session>> sessions(4);
    int wrong = 0;
    auto call_on = [&](std::size_t k) -> asio::awaitable<void> {
        co_await connect_into(&rig, &sessions[k]);
        std::vector<std::byte> response(64 * 1024);
        const auto request = ask(static_cast<std::uint32_t>(k), 3000, 100);
        const auto got = co_await sessions[k]->call(sized, request, response, {.timeout = 20s});
        wrong += !got || *got != 100 || !echoed(response, message(3000, 100));
    };
    const auto sends = [&] { return rig.client->counters().rdma_sends; };
    const auto reads = [&] { return rig.server->counters().rdma_reads; };
    auto work = [&]() -> asio::awaitable<void> {
        co_await call_on(0);
        co_await call_on(1);
        const auto sent = sends();
        CHECK(sent >= 2);
        CHECK(reads() == 0);
        co_await call_on(2); // no buffer left for it: its request is READ
        CHECK(sends() == sent);
        CHECK(reads() == 1);
        co_await sessions[0]->close();
        sessions[0].reset();
        co_await call_on(3); // session 0's buffers
        CHECK(sends() > sent);
        CHECK(reads() == 1);
    };
    run(rig.io, work(), 60s);
    CHECK(wrong == 0);
}

TEST_CASE("rpc large: MessageBuffer misuse is a programming error naming the caller") {
    Rig rig(large, large);
    RDMAXX_CHECK_DEATH(must(rig.client->alloc_buffer(0, rpc::BufferUse::request)), "alloc_buffer");
    RDMAXX_CHECK_DEATH(must(rig.client->alloc_buffer(mib + 1, rpc::BufferUse::response)), "max_response");
    auto buffer = must(rig.client->alloc_buffer(64, rpc::BufferUse::request));
    RDMAXX_CHECK_DEATH(buffer.resize(65), "capacity is 64");
    std::optional<rpc::Session> session;
    run(rig.io, connect_into(&rig, &session), 30s);
    auto other = must(rig.client->alloc_buffer(64, rpc::BufferUse::request));
    RDMAXX_CHECK_DEATH(session->call(echo, buffer, other, {}, [](Result<std::size_t>) {}), "BufferUse::response");
    auto elsewhere = must(rig.server->alloc_buffer(64, rpc::BufferUse::response)); // another endpoint's
    RDMAXX_CHECK_DEATH(session->call(echo, buffer, elsewhere, {}, [](Result<std::size_t>) {}),
                       "a MessageBuffer of another endpoint");
    rpc::MessageBuffer moved = std::move(other);
    RDMAXX_CHECK_DEATH(other.bytes(), "moved-from MessageBuffer");
}
