// lib/rpc when the port under an RDMA CM session goes down: the session's calls end
// with its control connection's own Error, not as if the peer had closed it. Runs where
// scripts/vm/pair.sh made rxeA and rxeB (elsewhere it is skipped), alone on them
// (tests/meson.build): on this kernel, rxe serves no new RDMA CM connection on a
// device whose port went down under live ones (not even rdmacm-utils' ucmatose's), so
// no test may follow it on the same device.
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <asio/io_context.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/rpc/endpoint.hpp>

#include "../support/device.hpp"
#include "../support/pair.hpp"
#include "../support/rpc_rig.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

using namespace rdmaxx;
using namespace std::chrono_literals;
using namespace rdmaxx::rpc_test;
using rdmaxx::test::env;
using rdmaxx::test::have_pair;
using rdmaxx::test::must;

namespace {

struct LinkLost {
    std::optional<Error> setup;
    int wrong = 0;
    std::optional<Result<std::size_t>> held; // how the call the server held ended
    std::chrono::milliseconds took{};         // from the cable's pull
};

// A session over RDMA CM from B to A, a call answered, a call A holds; then B's port
// goes down under it.
asio::awaitable<void> link_lost(Rig* rig, LinkLost* out) {
    auto session = co_await rig->client->connect(rig->address, rig->port);
    if (!session) {
        out->setup = session.error();
        co_return;
    }
    const auto request = message(3, 100);
    std::vector<std::byte> response(100);
    const Result<std::size_t> got = co_await session->call(echo, request, response, {.timeout = 20s});
    out->wrong += got && *got == request.size() && echoed(response, request) ? 0 : 1;
    session->call(hold_it, request, response, {.timeout = 60s},
                  [out](Result<std::size_t> ended) { out->held = std::move(ended); });
    co_await until([rig] { return rig->held.size() == 1; });
    auto context = must(Context::open(env("RDMAXX_PAIR_B_DEV")));
    test::LinkDown link(must(context.choose_gid(1)));
    const auto pulled = std::chrono::steady_clock::now();
    co_await until([out] { return out->held.has_value(); });
    out->took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - pulled);
}

rpc::EndpointOptions over_cm_on(const char* device) {
    rpc::EndpointOptions options;
    options.device = device;
    options.gid_index = test::pair_gid_index();
    options.session_transport = Transport::rdma_cm;
    return options;
}

} // namespace

TEST_CASE("rpc: a port going down under an RDMA CM session ends its calls with the control connection's own "
          "Error, not as a peer's close" *
          doctest::skip(!have_pair())) {
    Rig rig(over_cm_on(env("RDMAXX_PAIR_A_DEV")), over_cm_on(env("RDMAXX_PAIR_B_DEV")), env("RDMAXX_PAIR_A_ADDR"));
    LinkLost out;
    run(rig.io, link_lost(&rig, &out), 60s);
    REQUIRE_MESSAGE(!out.setup, (out.setup ? out.setup->message() : ""));
    CHECK(out.wrong == 0);
    REQUIRE(out.held);
    REQUIRE_FALSE(out.held->has_value());
    const Error& e = out.held->error();
    CHECK_MESSAGE(e.is_errno(ECONNRESET), e.message()); // the session was reset
    // why: lib/async's word for the port's loss, through the session's end
    CHECK_MESSAGE(e.message().find("its control connection failed") != std::string::npos, e.message());
    CHECK_MESSAGE(e.message().find("PORT_ERR") != std::string::npos, e.message());
    CHECK(out.took < 10s); // the call's own timeout is 60 s
    CHECK(rig.client->sessions() == 0);
}
