// RDMA CM for your own QPs (rdmaxx/ctrl/cm.hpp): the handshake with metadata both
// ways and data across; a peer that offers the wrong QP type or garbage; the
// disconnect seen by the survivor; the documented programming errors.
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include <rdma/rdma_cma.h>

#include <doctest/doctest.h>

#include <rdmaxx/ctrl/cm.hpp>
#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/events.hpp>
#include <rdmaxx/data/post.hpp>

#include "../support/device.hpp"
#include "../support/raw_cm.hpp"
#include "../support/thread.hpp"

using namespace rdmaxx;
using namespace std::chrono_literals;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

// A QP and a region on the device RDMA CM chose.
struct Ends {
    Context context;
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 16}));
    QueuePair qp;
    MemoryRegion mr = must(MemoryRegion::allocate(pd, 4096, access_all));

    Ends(const std::string& device, QpType type)
        : context(must(Context::open(device))),
          qp(must(QueuePair::create(pd, {.type = type, .send_cq = &cq, .recv_cq = &cq}))) {}
};

std::vector<std::byte> bytes_of(std::string_view text) {
    const auto* b = reinterpret_cast<const std::byte*>(text.data());
    return {b, b + text.size()};
}

} // namespace

TEST_CASE("CM: a QP of our own connected with metadata both ways; a WRITE across; the disconnect seen") {
    const std::string address = test::cm_address();
    CmListener listener = must(CmListener::listen(address, 0));
    CHECK_FALSE(listener.device().empty()); // bound to one address: its device is known
    std::optional<Ends> server;
    std::optional<CmConnection> server_cm;
    test::Thread passive([&] {
        CmRequest request = must(listener.next(5s));
        CHECK(request.device() == listener.device());
        CHECK(request.offer().metadata == bytes_of("8 bytes!"));
        server.emplace(request.device(), QpType::rc);
        must(request.connect(server->qp, {}));
        const auto region = server->mr.remote().serialize(); // 20 bytes: room on the answer
        server_cm.emplace(must(std::move(request).accept(server->qp, region, 5s)));
    });
    CmConnection cm = must(CmConnection::resolve(address, listener.port(), 5s));
    CHECK(cm.device() == listener.device());
    Ends client(cm.device(), QpType::rc);
    const EndpointMessage answer = must(cm.connect(client.qp, bytes_of("8 bytes!"), {}, 5s));
    must(cm.establish());
    passive.join();
    REQUIRE(server_cm);
    CHECK(client.qp.state() == QpState::rts);
    CHECK(answer.qps.at(0).endpoint == server->qp.endpoint());

    const RemoteMemory theirs = must(RemoteMemory::parse(answer.metadata));
    std::memcpy(client.mr.data(), "across the CM-made connection", 29);
    must(post_write(client.qp, client.mr.slice(0, 29), theirs.slice(100, 29), {.wr_id = 7}));
    must(wait_for(client.cq, 7));
    CHECK(std::memcmp(server->mr.data() + 100, "across the CM-made connection", 29) == 0);
    must(server_cm->check_alive());
    must(cm.check_alive());

    { CmConnection gone = std::move(cm); } // the client goes away: it disconnects
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    Result<void> alive;
    while ((alive = server_cm->check_alive()) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(5ms);
    REQUIRE_FALSE(alive);
    CHECK(alive.error().is_errno(ECONNRESET));
}

TEST_CASE("CM: an offer of another QP type is refused on both sides") {
    const std::string address = test::cm_address();
    CmListener listener = must(CmListener::listen(address, 0));
    test::Thread passive([&] {
        CmRequest request = must(listener.next(5s));
        Ends server(request.device(), QpType::rc);
        const Error e = must_fail(request.connect(server.qp, {}));
        CHECK(e.kind() == Error::Kind::protocol);
        CHECK_MESSAGE(fmt::format("{}", e).find("offers 1 QP(s) (UD), we connect one RC QP") != std::string::npos,
                      fmt::format("{}", e));
    }); // the request, dropped unanswered, rejects the client
    CmConnection cm = must(CmConnection::resolve(address, listener.port(), 5s));
    Ends client(cm.device(), QpType::ud);
    const Error e = must_fail(cm.connect(client.qp, {}, {}, 5s));
    CHECK(fmt::format("{}", e).find("REJECTED") != std::string::npos);
    passive.join();
}

TEST_CASE("CM: private data that is not an offer is an Error, and the client is rejected") {
    const std::string address = test::cm_address();
    CmListener listener = must(CmListener::listen(address, 0));
    const std::uint16_t port = listener.port();
    bool rejected = false;
    test::Thread raw_client([&] {
        test::RawCmClient client(address, port);
        const char junk[] = "not an rdmaxx offer at all";
        client.connect(std::as_bytes(std::span(junk)));
        rejected = client.next_event() == RDMA_CM_EVENT_REJECTED;
    });
    const Error e = must_fail(listener.next(5s));
    raw_client.join();
    CHECK(e.kind() == Error::Kind::protocol);
    CHECK(rejected);
}

TEST_CASE("CM: metadata beyond the private data limits is a programming error") {
    const std::string address = test::cm_address();
    CmListener listener = must(CmListener::listen(address, 0));
    const std::uint16_t port = listener.port();
    RDMAXX_CHECK_DEATH(
        {
            CmConnection cm = must(CmConnection::resolve(address, port, 5s));
            Ends client(cm.device(), QpType::rc);
            (void)cm.connect(client.qp, std::vector<std::byte>(max_connect_metadata + 1), {}, 5s);
        },
        "9 bytes of metadata in a CM connect request (at most 8)");
}

TEST_CASE("moved-from CM objects and AsyncEvents abort naming the caller's line") {
    const std::string address = test::cm_address();
    CmListener listener = must(CmListener::listen(address, 0));
    const CmListener kept = std::move(listener);
    RDMAXX_CHECK_DEATH((void)listener.port(), "moved-from CmListener");
    RDMAXX_CHECK_DEATH((void)listener.fd(), "moved-from CmListener");
    RDMAXX_CHECK_DEATH((void)listener.next(1s), "moved-from CmListener");
    CmConnection cm = must(CmConnection::resolve(address, kept.port(), 5s));
    const CmConnection taken = std::move(cm);
    RDMAXX_CHECK_DEATH((void)cm.peer(), "moved-from CmConnection");
    RDMAXX_CHECK_DEATH((void)cm.fd(), "moved-from CmConnection");
    RDMAXX_CHECK_DEATH((void)cm.check_alive(), "moved-from CmConnection");
    RDMAXX_CHECK_DEATH((void)cm.established(), "moved-from CmConnection");
    RDMAXX_CHECK_DEATH((void)cm.establish(), "moved-from CmConnection");
    const Context context = must(Context::open(taken.device()));
    AsyncEvents events = must(AsyncEvents::open(context));
    const AsyncEvents kept_events = std::move(events);
    CHECK(events.fd() == -1);
    RDMAXX_CHECK_DEATH((void)events.next(), "moved-from AsyncEvents");
    RDMAXX_CHECK_DEATH((void)events.wait(1s), "moved-from AsyncEvents");
    RDMAXX_CHECK_DEATH((void)events.check(nullptr, nullptr), "moved-from AsyncEvents");
}
