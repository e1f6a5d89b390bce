// The high-level Connection on real verbs: many clients, bad clients, dead peers,
// leases, quotas, credits. Server and clients are threads of this process.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <fmt/ranges.h>

#include <rdmaxx/ctrl/cm.hpp>
#include <rdmaxx/ctrl/connection.hpp>
#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/data/window_bounds.hpp>
#include <rdmaxx/wrap/wire.hpp>

#include "../support/device.hpp"
#include "../support/offer.hpp"
#include "../support/raw_cm.hpp"
#include "../support/starved.hpp"
#include "../support/thread.hpp"
#include "../support/watchdog.hpp"
#include "control_codec.hpp"
#include "link.hpp"

using namespace rdmaxx;
using namespace std::chrono_literals;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

ConnectionOptions quick(Transport transport = Transport::tcp) {
    ConnectionOptions o;
    o.transport = transport;
    o.timeout = 3s;
    return o;
}

// Sets a flag when it goes out of scope: a peer thread's "done", also when a failed
// check ends it early.
struct SetOnExit {
    std::atomic<bool>& flag;
    ~SetOnExit() { flag = true; }
};

// Serves `conn` (grants, returns, lease expiries) until the peer thread is done: no
// guess at how long the peer needs (at most 30 s).
void serve_until(Connection& conn, const std::atomic<bool>& done) {
    const auto bound = Clock::now() + 30s;
    while (!done && Clock::now() < bound)
        (void)conn.progress();
}

} // namespace

TEST_CASE("ten clients at once, each moving 1 MiB through the same server") {
    // the blocking listener runs the ten handshakes from one thread: under ASan at -O0
    // in the emulated VM, 3 s did not always cover the last one
    ConnectionOptions options = quick();
    options.timeout = 10s;
    Listener listener = must(Listener::listen("127.0.0.1", 0, options));
    constexpr int clients = 10;
    constexpr std::size_t size = 1 << 20;
    std::vector<test::Thread> threads;
    for (int c = 0; c < clients; ++c)
        threads.emplace_back([port = listener.port(), c, &options] {
            Connection conn = must(Connection::connect("127.0.0.1", port, options));
            MemoryRegion local = must(conn.alloc_local_mr(size));
            test::fill(local.bytes(), static_cast<unsigned>(c));
            const RemoteMr remote = must(conn.request_remote_mr(size));
            must(conn.write(local.all(), remote.memory));
            // the client's number, so the server knows whose bytes it checks
            std::memcpy(local.data(), &c, sizeof c);
            must(conn.send(local.slice(0, sizeof c)));
            must(conn.send_remote_mr(remote));
        });
    std::vector<Connection> accepted;
    for (int c = 0; c < clients; ++c)
        accepted.push_back(must(listener.accept(10s)));
    int checked = 0;
    for (Connection& conn : accepted) {
        int who = -1;
        CHECK(must(conn.receive(std::as_writable_bytes(std::span(&who, 1)))).size == sizeof who);
        MemoryRegion mr = must(conn.receive_local_mr());
        REQUIRE(mr.size() == size);
        std::vector<std::byte> expected(size);
        test::fill(expected, static_cast<unsigned>(who));
        CHECK(std::memcmp(mr.data(), expected.data(), size) == 0);
        ++checked;
    }
    for (auto& t : threads)
        t.join();
    CHECK(checked == clients);
}

TEST_CASE("random bytes and truncated handshakes: the listener counts each and serves the next client") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    {
        std::mt19937 random(7);
        std::vector<std::byte> junk(300);
        for (auto& b : junk)
            b = static_cast<std::byte>(random());
        TcpStream garbage = must(TcpStream::connect("127.0.0.1", listener.port(), 1s));
        must(garbage.write_all(junk, Clock::now() + 1s));
        TcpStream truncated = must(TcpStream::connect("127.0.0.1", listener.port(), 1s));
        const auto message = endpoint_codec::encode(
            {.qps = {{.endpoint = {.qpn = 1, .psn = 1, .gid = {}, .lid = 0, .mtu = Mtu::b1024}}}, .metadata = {}});
        must(truncated.write_all(std::span(message).first(20), Clock::now() + 1s));
        // both close here
    }
    test::Thread good([port = listener.port()] {
        auto conn = Connection::connect("127.0.0.1", port, quick());
        REQUIRE(conn);
        auto mr = conn->alloc_local_mr(64);
        std::memcpy(mr->data(), "survived", 8);
        CHECK(conn->send(mr->slice(0, 8)));
    });
    Connection conn = must(listener.accept(5s));
    std::array<std::byte, 16> got{};
    CHECK(must(conn.receive(got)).size == 8);
    CHECK(std::memcmp(got.data(), "survived", 8) == 0);
    good.join();
    CHECK(listener.stats().failed == 2);
    CHECK(listener.stats().accepted == 1);
}

TEST_CASE("a client that lies about its limits is refused before a QP exists, and the next one is served") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    const auto offer = [](std::uint32_t max_message, std::uint32_t depth) {
        return test::connection_offer(max_message, depth);
    };
    for (const auto& lie : {offer(0xffffffff, 32), offer(4096, 0xffffffff), offer(4096, 3), offer(0, 32)}) {
        TcpStream liar = must(TcpStream::connect("127.0.0.1", listener.port(), 1s));
        must(liar.write_all(lie, Clock::now() + 1s));
        CHECK(must_fail(listener.accept(200ms)).is_timeout()); // handshakes run inside accept()
        std::byte answer{};
        // refused: the listener closed without answering
        CHECK(must_fail(liar.read_exact(std::span(&answer, 1), Clock::now() + 3s)).is_errno(ECONNRESET));
    }
    CHECK(listener.stats().failed == 4);
    test::Thread good([port = listener.port()] { CHECK(Connection::connect("127.0.0.1", port, quick())); });
    CHECK(listener.accept(5s));
    good.join();
}

TEST_CASE("a peer that dies, mid-handshake or connected, fails the survivor's waits at once") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    const auto port = listener.port();
    std::fflush(nullptr);
    // mid-handshake: a child that connects over TCP and dies before the exchange
    if (const pid_t child = ::fork(); child == 0) {
        auto s = TcpStream::connect("127.0.0.1", port, 1s);
        ::_exit(s ? 0 : 1);
    } else {
        int status = 0;
        ::waitpid(child, &status, 0);
        CHECK(must_fail(listener.accept(500ms)).is_timeout()); // no Error for the client: it is counted
        CHECK(listener.stats().failed == 1);
    }
    // connected: a child that connects, sends one message and dies
    if (const pid_t child = ::fork(); child == 0) {
        auto conn = Connection::connect("127.0.0.1", port, quick());
        if (!conn)
            ::_exit(1);
        auto mr = conn->alloc_local_mr(64);
        (void)conn->send(mr->slice(0, 8));
        ::_exit(0); // no goodbye
    } else {
        Connection conn = must(listener.accept(5s));
        std::array<std::byte, 64> buffer{};
        CHECK(must(conn.receive(buffer)).size == 8);
        int status = 0;
        ::waitpid(child, &status, 0);
        const auto start = Clock::now();
        const Error e = must_fail(conn.receive(buffer));
        CHECK(Clock::now() - start < 2s); // not the 3 s timeout: the death is seen
        CHECK(e.message().find("closed") != std::string::npos);
        MemoryRegion mr = must(conn.alloc_local_mr(64));
        CHECK_FALSE(conn.send(mr.slice(0, 8))); // later calls fail too
    }
}

TEST_CASE("an expired lease: the owner refuses the region and a late WRITE fails remotely") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    std::atomic<bool> client_done{false}, second_done{false};
    test::Thread client([port = listener.port(), &client_done] {
        const SetOnExit done{client_done};
        Connection conn = must(Connection::connect("127.0.0.1", port, quick()));
        MemoryRegion local = must(conn.alloc_local_mr(4096)); // first: it registers the pool's arena
        const RemoteMr remote = must(conn.request_remote_mr(4096, access_all, 200ms));
        test::fill(local.bytes(), 9);
        must(conn.write(local.slice(0, 16), remote.slice(0, 16))); // within the lease
        std::this_thread::sleep_for(600ms);                        // the lease ends meanwhile
        must(conn.progress());
        const Error late = must_fail(conn.write(local.slice(0, 16), remote.slice(0, 16)));
        CHECK(late.kind() == Error::Kind::completion);
        CHECK(late.code() == IBV_WC_REM_ACCESS_ERR);
    });
    Connection conn = must(listener.accept(5s));
    serve_until(conn, client_done); // grant, then expire
    client.join();
    // a fresh pair: returning an expired region is refused by its owner
    test::Thread second([port = listener.port(), &second_done] {
        const SetOnExit done{second_done};
        Connection c = must(Connection::connect("127.0.0.1", port, quick()));
        const RemoteMr remote = must(c.request_remote_mr(64, access_all, 100ms));
        std::this_thread::sleep_for(300ms);
        const Error refused = must_fail(c.send_remote_mr(remote));
        CHECK(refused.is_errno(ESTALE));
    });
    Connection other = must(listener.accept(5s));
    serve_until(other, second_done);
    second.join();
}

namespace {

// Waits (serving `conn`) until `ready`, at most 30 s.
void serve_until_true(Connection& conn, const std::function<bool()>& ready) {
    const auto bound = Clock::now() + 30s;
    while (!ready() && Clock::now() < bound)
        (void)conn.progress();
}

bool all_bytes(std::span<const std::byte> bytes, std::byte value) {
    return std::all_of(bytes.begin(), bytes.end(), [&](std::byte b) { return b == value; });
}

// Granted and lent pooled regions through `lending`: a late access after the lease
// ends, or after the region came back, fails at the NIC, and the block, reused or
// returned, keeps the owner's bytes.
void revocation(Lending lending) {
    ConnectionOptions options = quick();
    options.lending = lending;
    Listener listener = must(Listener::listen("127.0.0.1", 0, options));
    std::atomic<std::uintptr_t> granted_at{0};
    std::atomic<bool> reused{false}, client_done{false};
    test::Thread client([&, port = listener.port()] {
        const SetOnExit done{client_done};
        Connection conn = must(Connection::connect("127.0.0.1", port, options));
        CHECK(conn.lending() == lending);
        MemoryRegion local = must(conn.alloc_local_mr(4096)); // first: it registers the pool's arena
        std::memset(local.data(), 0x11, 4096);
        const RemoteMr remote = must(conn.request_remote_mr(4096, access_all, 300ms));
        must(conn.write(local.slice(0, 4096), remote.slice(0, 4096))); // within the lease
        granted_at = remote.memory.addr;
        const auto bound = Clock::now() + 30s;
        while (!reused && Clock::now() < bound)
            std::this_thread::sleep_for(1ms); // the owner expires the lease and reuses the block
        std::memset(local.data(), 0x22, 4096);
        const Error late = must_fail(conn.write(local.slice(0, 16), remote.slice(0, 16)));
        CHECK(late.code() == IBV_WC_REM_ACCESS_ERR);
    });
    Connection conn = must(listener.accept(5s));
    CHECK(conn.lending() == lending);
    serve_until_true(conn, [&] { return granted_at != 0 && conn.pinned_for_peer() == 0; }); // expired
    MemoryRegion block = must(conn.alloc_local_mr(4096, access_all, {.zeroed = false}));
    CHECK(reinterpret_cast<std::uintptr_t>(block.data()) == granted_at.load()); // the same block, reused
    CHECK(all_bytes(block.bytes(), std::byte{0x11}));                          // the WRITE in the lease
    std::memset(block.data(), 0xab, 4096);
    reused = true;
    serve_until(conn, client_done);
    client.join();
    CHECK(all_bytes(block.bytes(), std::byte{0xab}));

    // lent, then given back: the key dies with the return
    std::atomic<bool> returned{false}, second_done{false};
    test::Thread second([&, port = listener.port()] {
        const SetOnExit done{second_done};
        Connection c = must(Connection::connect("127.0.0.1", port, options));
        MemoryRegion local = must(c.alloc_local_mr(4096));
        const RemoteMr remote = must(c.receive_remote_mr());
        std::memset(local.data(), 0x33, 4096);
        must(c.write(local.slice(0, 4096), remote.slice(0, 4096)));
        must(c.send_remote_mr(remote));
        returned = true;
        std::memset(local.data(), 0x44, 4096);
        CHECK(must_fail(c.write(local.slice(0, 16), remote.slice(0, 16))).code() == IBV_WC_REM_ACCESS_ERR);
    });
    Connection other = must(listener.accept(5s));
    MemoryRegion lent = must(other.alloc_local_mr(4096));
    std::byte* const at = lent.data();
    must(other.send_local_mr(std::move(lent), 10s));
    MemoryRegion back = must(other.receive_local_mr(10s));
    CHECK(back.data() == at);
    serve_until(other, second_done);
    second.join();
    CHECK(all_bytes(back.bytes(), std::byte{0x33}));
}

} // namespace

TEST_CASE("pooled regions lent through memory windows: a late access after the lease or the return fails") {
    revocation(Lending::memory_window);
}

TEST_CASE("pooled regions lent through registrations (the fallback): a late access fails the same way") {
    revocation(Lending::registration);
}

TEST_CASE("a region of its own registration lent and given back: a late access fails, and the region is the "
          "owner's") {
    // It was lent with its own key, which lived on in the region handed back.
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    std::atomic<bool> client_done{false};
    test::Thread client([&client_done, port = listener.port()] {
        const SetOnExit done{client_done};
        Connection c = must(Connection::connect("127.0.0.1", port, quick()));
        MemoryRegion local = must(c.alloc_local_mr(4096));
        const RemoteMr remote = must(c.receive_remote_mr());
        std::memset(local.data(), 0x33, 4096);
        must(c.write(local.slice(0, 4096), remote.slice(0, 4096)));
        must(c.send_remote_mr(remote));
        std::memset(local.data(), 0x44, 4096);
        CHECK(must_fail(c.write(local.slice(0, 16), remote.slice(0, 16))).code() == IBV_WC_REM_ACCESS_ERR);
    });
    Connection owner = must(listener.accept(5s));
    MemoryRegion lent = must(owner.alloc_local_mr(4096, access_all, {.alignment = 8192})); // not pooled
    REQUIRE_FALSE(lent.pooled());
    const std::uint32_t own_key = lent.remote().rkey;
    std::byte* const at = lent.data();
    must(owner.send_local_mr(std::move(lent), 10s));
    MemoryRegion back = must(owner.receive_local_mr(10s));
    CHECK(back.data() == at);
    CHECK(back.remote().rkey == own_key); // the region's own registration, untouched
    serve_until(owner, client_done);
    client.join();
    CHECK(all_bytes(back.bytes(), std::byte{0x33}));
}

TEST_CASE("Lending::automatic takes windows only where they bound accesses") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    test::Thread client([port = listener.port()] { (void)must(Connection::connect("127.0.0.1", port, quick())); });
    Connection conn = must(listener.accept(5s));
    client.join();
    auto context = must(Context::open());
    auto pd = must(ProtectionDomain::create(context));
    const bool bounded = context.attributes().type2_windows && must(window_bounds_enforced(context, pd));
    CHECK(conn.lending() == (bounded ? Lending::memory_window : Lending::registration));
}

TEST_CASE("the owner's access ceiling and quota bound what a peer may request") {
    ConnectionOptions strict = quick();
    strict.access_ceiling = Access::local_write | Access::remote_read;
    strict.quota_bytes = 8192;
    strict.lending = Lending::memory_window; // a window cannot carry no remote right at all
    Listener listener = must(Listener::listen("127.0.0.1", 0, strict));
    test::Thread client([port = listener.port()] {
        Connection conn = must(Connection::connect("127.0.0.1", port, quick()));
        CHECK(must_fail(conn.request_remote_mr(64, Access::remote_write)).is_errno(EACCES));
        CHECK(must_fail(conn.request_remote_mr(64, Access::local_write)).is_errno(EINVAL));
        const RemoteMr first = must(conn.request_remote_mr(8192, Access::remote_read));
        CHECK(must_fail(conn.request_remote_mr(1, Access::remote_read)).is_errno(EDQUOT));
        must(conn.send_remote_mr(first)); // given back, but pinned until the owner takes it
        CHECK(must_fail(conn.request_remote_mr(1, Access::remote_read)).is_errno(EDQUOT));
        MemoryRegion done = must(conn.alloc_local_mr(8));
        must(conn.send(done.slice(0, 1)));
    });
    Connection conn = must(listener.accept(5s));
    std::array<std::byte, 8> buffer{};
    must(conn.receive(buffer));
    CHECK(must(conn.receive_local_mr()).size() == 8192);
    client.join();
}

TEST_CASE("a listener out of file descriptors rests between accepts rather than spin, and serves once it has "
          "them again") {
    const test::CapturedLog log; // the listener's warnings
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    std::vector<TcpStream> queued; // clients the kernel took, waiting for the accept
    for (int i = 0; i < 3; ++i)
        queued.push_back(must(TcpStream::connect("127.0.0.1", listener.port(), 3s)));
    {
        const test::NoMoreFiles starved; // each accept fails (EMFILE), the connection stays queued
        CHECK(must_fail(listener.accept(1500ms)).is_timeout());
    }
    // rests of 10, 20, 40 ... ms: 8 accepts in 1.5 s (hundreds of thousands, spinning)
    const std::size_t failed_accepts = log.count("Listener: accept");
    CHECK(failed_accepts >= 1);
    CHECK(failed_accepts <= 12);
    CHECK(log.count("Too many open files") >= 1);
    test::Thread client([port = listener.port()] {
        Connection conn = must(Connection::connect("127.0.0.1", port, quick()));
        MemoryRegion mr = must(conn.alloc_local_mr(8));
        must(conn.send(mr.slice(0, 1)));
    });
    Connection conn = must(listener.accept(10s)); // behind the queued ones, silent
    std::array<std::byte, 8> buffer{};
    must(conn.receive(buffer));
    client.join();
}

TEST_CASE("a region its owner cannot allocate is denied ENOMEM, and the connection goes on; asked again and again, "
          "the owner warns 10 times a second at most") {
    ConnectionOptions owner = quick();
    owner.quota_bytes = std::numeric_limits<std::uint64_t>::max(); // the owner's memory is the only bound
    Listener listener = must(Listener::listen("127.0.0.1", 0, owner));
    const test::CapturedLog log; // the owner's warnings
    constexpr int asked = 203;
    std::atomic<bool> client_done{false};
    test::Thread client([port = listener.port(), &client_done] {
        const SetOnExit done{client_done};
        Connection conn = must(Connection::connect("127.0.0.1", port, quick()));
        CHECK(must_fail(conn.request_remote_mr(std::size_t{1} << 46)).is_errno(ENOMEM)); // 64 TiB
        // sizes whose rounding up to a page wrapped (to an allocation of 0 bytes, which
        // the owner then zeroed for the size asked: it crashed)
        CHECK(must_fail(conn.request_remote_mr(std::numeric_limits<std::size_t>::max() - 100)).is_errno(ENOMEM));
        CHECK(must_fail(conn.request_remote_mr(std::size_t{1} << 63)).is_errno(ENOMEM));
        int denied = 0;
        for (int i = 3; i < asked; ++i) // a peer asking again and again
            denied += conn.request_remote_mr(std::size_t{1} << 46) ? 0 : 1;
        CHECK(denied == asked - 3);
        const RemoteMr fine = must(conn.request_remote_mr(4096));
        CHECK(fine.memory.length == 4096);
    });
    const auto start = Clock::now();
    Connection conn = must(listener.accept(5s));
    serve_until(conn, client_done);
    client.join();
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    const std::size_t warned = log.count("a requested region");
    MESSAGE(asked, " requests denied in ", took.count(), " ms: ", warned, " warnings, at most ",
            log.most_in_a_second("a requested region"), " in a second");
    CHECK(warned >= 1);
    CHECK(log.most_in_a_second("a requested region") <= 20); // a budget's second may straddle two of the clock's
    CHECK(warned <= static_cast<std::size_t>(10 * (took.count() / 1000 + 2)));
}

TEST_CASE("messages: size limits, and credits instead of endless RNR retries") {
    ConnectionOptions small = quick();
    small.receive_depth = 8;
    small.max_message = 256;
    small.timeout = 1s;
    Listener listener = must(Listener::listen("127.0.0.1", 0, small));
    std::atomic<bool> out_of_credits{false};
    test::Thread client([port = listener.port(), small, &out_of_credits] {
        SetOnExit failed_early{out_of_credits}; // the server must not wait for a client that died
        Connection conn = must(Connection::connect("127.0.0.1", port, small));
        MemoryRegion mr = must(conn.alloc_local_mr(4096));
        CHECK(must_fail(conn.send(mr.slice(0, 257))).is_errno(EMSGSIZE));
        // the server does not receive yet: the credits run out and send() times
        // out with an Error; nothing is lost
        int sent = 0;
        for (int i = 0; i < 20; ++i) {
            std::memcpy(mr.data(), &i, sizeof i);
            if (!conn.send(mr.slice(0, 200)))
                break;
            ++sent;
        }
        CHECK(sent == 8 - 2); // receive_depth less the control reserve
        out_of_credits = true;
        must(conn.send(mr.slice(0, 4))); // the server drains meanwhile: credits come back
    });
    Connection conn = must(listener.accept(5s));
    while (!out_of_credits) // the client runs out of credits (each send past them times out after 1 s)
        std::this_thread::sleep_for(1ms);
    std::array<std::byte, 256> buffer{};
    std::array<std::byte, 16> tiny{};
    CHECK(must_fail(conn.receive(tiny)).is_errno(EMSGSIZE)); // too big for 16: stays queued
    for (int i = 0; i < 6; ++i) {
        CHECK(must(conn.receive(buffer)).size == 200);
        int value = -1;
        std::memcpy(&value, buffer.data(), sizeof value);
        CHECK(value == i);
    }
    CHECK(must(conn.receive(buffer)).size == 4);
    client.join();
}

TEST_CASE("RDMA CM: connect, move data both ways, and a disconnect fails the survivor's waits") {
    const std::string address = test::cm_address();
    Listener listener = must(Listener::listen(address, 0, quick(Transport::rdma_cm)));
    REQUIRE(listener.port() != 0);
    test::Thread client([&address, port = listener.port()] {
        Connection conn = must(Connection::connect(address, port, quick(Transport::rdma_cm)));
        CHECK(conn.peer_address() == fmt::format("{}:{}", address, port)); // as given
        MemoryRegion mr = must(conn.alloc_local_mr(1 << 20));
        test::fill(mr.bytes(), 11);
        const RemoteMr remote = must(conn.request_remote_mr(1 << 20));
        must(conn.write(mr.all(), remote.memory));
        must(conn.send_remote_mr(remote));
        std::array<std::byte, 8> got{};
        CHECK(must(conn.receive(got)).imm == 5u);
        // leaving the scope disconnects
    });
    Connection conn = must(listener.accept(10s));
    CHECK(conn.peer_address().starts_with(address + ":")); // the client's numeric address and port
    MemoryRegion back = must(conn.receive_local_mr());
    std::vector<std::byte> expected(1 << 20);
    test::fill(expected, 11);
    CHECK(std::memcmp(back.data(), expected.data(), expected.size()) == 0);
    must(conn.send_with_imm(back.slice(0, 8), 5));
    client.join();
    std::array<std::byte, 8> buffer{};
    const auto start = Clock::now();
    const Error e = must_fail(conn.receive(buffer));
    CHECK(Clock::now() - start < 2s);
    CHECK(e.is_errno(ECONNRESET)); // its goodbye, or the CM's disconnect
}

TEST_CASE("RDMA CM: nobody listening is an Error in time") {
    const auto start = Clock::now();
    CHECK_FALSE(Connection::connect(test::cm_address(), 1, quick(Transport::rdma_cm)));
    CHECK(Clock::now() - start < 4s);
}

TEST_CASE("connect_over_tcp brings several QPs of two processes to RTS, then readiness is confirmed") {
    TcpListener listener = must(TcpListener::listen("127.0.0.1", 0));
    // each side: an RC and a UD QP, a receive posted on each before confirm_ready
    struct Side {
        test::Rig rig;
        QueuePair rc = rig.make_qp(QpType::rc);
        QueuePair ud = rig.make_qp(QpType::ud);
        MemoryRegion mr = must(MemoryRegion::allocate(rig.pd, 4096, access_all));
        EndpointMessage connect(TcpStream& stream, std::byte tag) {
            QueuePair* qps[] = {&rc, &ud};
            const std::byte metadata[] = {tag};
            return must(connect_over_tcp(stream, qps, metadata, {}, 2s));
        }
    };
    test::Thread client([port = listener.port()] {
        Side side;
        TcpStream stream = must(TcpStream::connect("127.0.0.1", port, 2s));
        const EndpointMessage peer = side.connect(stream, std::byte{'c'});
        CHECK(peer.metadata == std::vector<std::byte>{std::byte{'s'}});
        CHECK(must(side.rc.query_state()) == QpState::rts);
        CHECK(must(side.ud.query_state()) == QpState::rts);
        must(stream.confirm_ready(2s));
        std::memcpy(side.mr.data(), "ready", 5);
        // the server's receive is posted: confirm_ready said so
        must(post_send(side.rc, side.mr.slice(0, 5), {.wr_id = 1}));
        must(wait_for(side.rig.cq, 1));
    });
    Side side;
    TcpStream stream = must(listener.accept(2s));
    const EndpointMessage peer = side.connect(stream, std::byte{'s'});
    CHECK(peer.qps.size() == 2);
    CHECK(peer.qps[1].type == QpType::ud);
    must(post_recv(side.rc, side.mr.slice(0, 64), 7));
    must(stream.confirm_ready(2s));
    CHECK(must(wait_for(side.rig.cq, 7)).byte_len() == 5);
    CHECK(std::memcmp(side.mr.data(), "ready", 5) == 0);
    client.join();
}

TEST_CASE("connect_over_tcp refuses a peer whose QPs do not match") {
    TcpListener listener = must(TcpListener::listen("127.0.0.1", 0));
    test::Thread client([port = listener.port()] {
        test::Rig rig;
        QueuePair ud = rig.make_qp(QpType::ud);
        TcpStream stream = must(TcpStream::connect("127.0.0.1", port, 2s));
        QueuePair* qps[] = {&ud};
        CHECK(must_fail(connect_over_tcp(stream, qps, {}, {}, 2s)).message().find("QP 0") != std::string::npos);
    });
    test::Rig rig;
    QueuePair rc = rig.make_qp(QpType::rc);
    TcpStream stream = must(listener.accept(2s));
    QueuePair* qps[] = {&rc};
    CHECK(must_fail(connect_over_tcp(stream, qps, {}, {}, 2s)).kind() == Error::Kind::protocol);
    CHECK(must(rc.query_state()) == QpState::reset); // nothing was connected
    client.join();
}

TEST_CASE("Connection atomics return the old value; a failed one is an Error") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    std::atomic<bool> client_done{false};
    test::Thread client([port = listener.port(), &client_done] {
        const SetOnExit done{client_done};
        Connection conn = must(Connection::connect("127.0.0.1", port, quick()));
        const RemoteMr counter = must(conn.request_remote_mr(64));
        MemoryRegion old = must(conn.alloc_local_mr(64));
        for (std::uint64_t i = 0; i < 10; ++i) {
            must(conn.fetch_add(old.slice(0, 8), counter.slice(0, 8), 3));
            std::uint64_t before = 0;
            std::memcpy(&before, old.data(), 8);
            CHECK(before == 3 * i);
        }
        must(conn.compare_swap(old.slice(8, 8), counter.slice(0, 8), 30, 7)); // 30 == 30: swapped
        must(conn.compare_swap(old.slice(16, 8), counter.slice(0, 8), 30, 9)); // 7 != 30: kept
        std::uint64_t first = 0, second = 0;
        std::memcpy(&first, old.data() + 8, 8);
        std::memcpy(&second, old.data() + 16, 8);
        CHECK(first == 30);
        CHECK(second == 7);
        RemoteMemory wrong = counter.memory;
        wrong.rkey ^= 0x100;
        CHECK(must_fail(conn.fetch_add(old.slice(0, 8), wrong.slice(0, 8), 1)).code() == IBV_WC_REM_ACCESS_ERR);
    });
    Connection conn = must(listener.accept(5s));
    serve_until(conn, client_done);
    client.join();
}

namespace {

std::size_t open_fds() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
        ++n;
    return n;
}

std::size_t resident_kib() {
    std::ifstream statm("/proc/self/statm");
    std::size_t size = 0, resident = 0;
    statm >> size >> resident;
    return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) / 1024;
}

std::string host_for(Transport transport) { return transport == Transport::tcp ? "127.0.0.1" : test::cm_address(); }

// The 8 limit bytes of a well-behaved offer (4096-byte messages, 32 receives).
std::vector<std::byte> honest_limits() {
    std::vector<std::byte> limits(8);
    wire::put(limits.data(), 4096, 4);
    wire::put(limits.data() + 4, 32, 4);
    return limits;
}

// One round: 10 real clients connect at once; in a crowded round, while 50 clients
// that connect and say nothing and 200 that send garbage are held open. The longest
// of the real clients' connects.
Clock::duration storm_round(Listener& listener, Transport transport, bool crowded) {
    const std::string host = host_for(transport);
    // the clients' own bounds are not what is measured (storm() compares how long the
    // real ones took with and without the crowd): on a loaded machine the 10 real
    // connects in the crowd over RDMA CM took more than 3 s (0.3-0.4 s unloaded), the
    // listener turning away the 200 garbage requests queued before theirs
    constexpr auto clients_bound = 20s;
    ConnectionOptions options = quick(transport);
    options.timeout = clients_bound;
    std::atomic<bool> clients_done{false};
    std::vector<Connection> accepted;
    test::Thread server([&] {
        // serve until the real clients are in and every silent one was given up on
        const auto until = Clock::now() + 60s;
        while (Clock::now() < until) {
            if (auto conn = listener.accept(100ms))
                accepted.push_back(std::move(*conn));
            const ListenerStats stats = listener.stats();
            if (clients_done && stats.pending == 0 && stats.ready == 0)
                break;
        }
    });
    std::vector<TcpStream> silent_tcp, garbage_tcp;
    std::vector<std::unique_ptr<test::RawCmClient>> garbage_cm;
    struct SilentCm {
        test::Rig rig;
        std::vector<QueuePair> qps;
        std::vector<CmConnection> cms;
    } silent_cm;
    std::mt19937 random(3);
    std::vector<std::byte> junk(300);
    for (auto& b : junk)
        b = static_cast<std::byte>(random());
    for (int i = 0; crowded && i < 50; ++i) {
        if (transport == Transport::tcp) {
            silent_tcp.push_back(must(TcpStream::connect(host, listener.port(), clients_bound)));
            continue;
        }
        // a connect request answered by the server, then never established
        CmConnection cm = must(CmConnection::resolve(host, listener.port(), clients_bound));
        QueuePair& qp = silent_cm.qps.emplace_back(silent_cm.rig.make_qp(QpType::rc));
        must(cm.connect(qp, honest_limits(), {}, clients_bound));
        silent_cm.cms.push_back(std::move(cm));
    }
    for (int i = 0; crowded && i < 200; ++i) {
        if (transport == Transport::tcp) {
            garbage_tcp.push_back(must(TcpStream::connect(host, listener.port(), clients_bound)));
            must(garbage_tcp.back().write_all(junk, Clock::now() + clients_bound));
            continue;
        }
        auto& client = garbage_cm.emplace_back(std::make_unique<test::RawCmClient>(host, listener.port()));
        client->connect(std::span(junk).first(48));
    }
    std::vector<test::Thread> real;
    std::atomic<int> connected{0};
    std::array<Clock::duration, 10> took{};
    for (int i = 0; i < 10; ++i)
        real.emplace_back([&, i] {
            const auto start = Clock::now();
            auto conn = Connection::connect(host, listener.port(), options);
            took[i] = Clock::now() - start;
            CHECK_MESSAGE(conn.has_value(), (conn ? "" : conn.error().message()));
            if (!conn)
                return;
            auto mr = conn->alloc_local_mr(64);
            std::memcpy(mr->data(), &i, sizeof i);
            CHECK(conn->send(mr->slice(0, sizeof i)));
            ++connected;
        });
    for (auto& t : real)
        t.join();
    // every garbage client was refused, while the silent ones still waited
    for (auto& client : garbage_cm)
        CHECK(client->next_event() == RDMA_CM_EVENT_REJECTED);
    for (auto& stream : garbage_tcp) {
        std::byte answer{};
        CHECK(must_fail(stream.read_exact(std::span(&answer, 1), Clock::now() + 5s)).is_errno(ECONNRESET));
    }
    clients_done = true;
    server.join();
    CHECK(connected == 10);
    CHECK(accepted.size() == 10);
    for (Connection& conn : accepted) {
        int who = -1;
        CHECK(conn.receive(std::as_writable_bytes(std::span(&who, 1))));
        CHECK((who >= 0 && who < 10));
    }
    return *std::max_element(took.begin(), took.end());
}

void storm(Transport transport) {
    using ms = std::chrono::milliseconds;
    // how long a client may take over its handshake: the silent ones are given up after
    // it, and the real ones must make it (on a machine whose cores were shared by two
    // busy loops and a build, a real client's took more than 3 s now and then)
    ConnectionOptions options = quick(transport);
    options.timeout = 5s;
    Listener listener = must(Listener::listen(host_for(transport), 0, options));
    storm_round(listener, transport, true); // warm-up: the allocator and the device settle
    const auto quiet = storm_round(listener, transport, false);
    const std::size_t fds = open_fds();
    const std::size_t rss = resident_kib();
    // the round's log: the warnings about the 450 clients refused or given up on go
    // within the listener's budget (10 a second)
    Clock::duration crowded{};
    std::size_t busiest = 0;
    {
        const test::CapturedLog log;
        crowded = storm_round(listener, transport, true);
        busiest = log.most_in_a_second(" Listener: ");
    }
    MESSAGE("the listener's warnings: at most ", busiest, " in a second");
    CHECK(busiest >= 1);
    CHECK(busiest <= 20); // a budget's second may straddle two of the clock's
    MESSAGE("10 connects at once took ", std::chrono::duration_cast<ms>(quiet).count(), " ms alone, ",
            std::chrono::duration_cast<ms>(crowded).count(), " ms in the crowd");
    // a listener that waited on silent clients one after another (the defect this
    // guards against) would keep the real ones a handshake timeout per silent client
    // ahead of them; the crowd's own cost, refusing 200 garbage clients, was at most
    // 0.6 s unloaded and 2.4 s with the machine's cores shared by two busy loops and a
    // build (when the 10 connects alone took 0.3 s and up to 3.7 s)
    CHECK(crowded < quiet + 2 * options.timeout);
    const ListenerStats stats = listener.stats();
    CHECK(stats.accepted == 30);
    CHECK(stats.timed_out == 100);
    INFO("failed ", stats.failed, ", turned away ", stats.turned_away);
    CHECK(stats.failed >= 400);
    CHECK(open_fds() == fds);
    INFO("RSS before ", rss, " KiB, after ", resident_kib(), " KiB");
#if !defined(__SANITIZE_ADDRESS__)
    CHECK(resident_kib() < rss + 4096); // under ASan freed memory sits in its quarantine: LeakSanitizer checks there
#endif
}

} // namespace

TEST_CASE("50 silent and 200 garbage clients held open stall no real client (TCP)") { storm(Transport::tcp); }

TEST_CASE("50 silent and 200 garbage clients held open stall no real client (RDMA CM)") { storm(Transport::rdma_cm); }

TEST_CASE("128 clients at once on each transport are all served") {
    for (Transport transport : {Transport::tcp, Transport::rdma_cm}) {
        CAPTURE(static_cast<int>(transport));
        const std::string host = host_for(transport);
        ConnectionOptions options = quick(transport);
        options.timeout = 20s; // 128 handshakes on two emulated cores
        options.receive_depth = 4;
        options.max_message = 64;
        Listener listener = must(Listener::listen(host, 0, options));
        std::atomic<int> connected{0};
        std::atomic<bool> accepting{true};
        std::vector<test::Thread> clients;
        for (int i = 0; i < 128; ++i)
            clients.emplace_back([&] {
                auto conn = Connection::connect(host, listener.port(), options);
                CHECK_MESSAGE(conn.has_value(), (conn ? "" : conn.error().message()));
                connected += conn.has_value();
                // a client that leaves at once may close before the CM tells the
                // listener it is established: stay until the listener has looked
                while (accepting)
                    std::this_thread::sleep_for(10ms);
            });
        std::vector<Connection> accepted;
        const auto until = Clock::now() + 60s;
        std::vector<std::string> refused;
        while (accepted.size() < 128 && Clock::now() < until) {
            auto conn = listener.accept(1s);
            if (conn)
                accepted.push_back(std::move(*conn));
            else if (!conn.error().is_timeout())
                refused.push_back(conn.error().message());
        }
        accepting = false;
        for (auto& t : clients)
            t.join();
        CHECK(connected == 128);
        CHECK_MESSAGE(accepted.size() == 128, "accept failed: ", fmt::format("{}", fmt::join(refused, "; ")));
    }
}

// Receives that complete while nobody polls pile up in the CQ a listener's connections
// share: 3 clients' messages together are more than its first size (8,192 entries
// asked for; rxe makes them 16,383). Without the CQ growing with its connections, rxe
// overflows it and the messages are lost.
TEST_CASE("a listener's shared CQ grows with its connections: receives nobody polls overflow nothing") {
    const Context context = must(Context::open());
    const std::uint32_t first_depth = must(CompletionQueue::create(context, {.depth = 8192})).depth();
    constexpr std::uint32_t clients_n = 3;
    ConnectionOptions options = quick();
    options.receive_depth = first_depth / clients_n + 8;
    if (options.receive_depth > static_cast<std::uint32_t>(context.attributes().raw.max_qp_wr)) {
        MESSAGE("max_qp_wr ", context.attributes().raw.max_qp_wr, ": three QPs' receives cannot fill the CQ here");
        return;
    }
    options.max_message = 64;
    options.max_send_wr = 2;
    options.timeout = 20s;
    const std::uint32_t per_client = options.receive_depth - 2; // the credits: all but the control reserve
    REQUIRE(per_client * clients_n > first_depth);
    Listener listener = must(Listener::listen("127.0.0.1", 0, options));
    std::atomic<std::uint32_t> finished{0};
    std::atomic<bool> go{false}, done{false};
    std::vector<test::Thread> clients;
    for (std::uint32_t c = 0; c < clients_n; ++c)
        clients.emplace_back([&, c] {
            struct CountOnce {
                std::atomic<std::uint32_t>& n;
                bool counted = false;
                void now() {
                    if (!std::exchange(counted, true))
                        ++n;
                }
                ~CountOnce() { now(); } // also when a failed check ends the client early
            } finish{finished};
            auto conn = Connection::connect("127.0.0.1", listener.port(), options);
            REQUIRE_MESSAGE(conn.has_value(), (conn ? "" : conn.error().message()));
            MemoryRegion mr = must(conn->alloc_local_mr(64));
            while (!go)
                std::this_thread::sleep_for(1ms);
            for (std::uint32_t i = 0; i < per_client; ++i) {
                const std::uint32_t tag = c << 16 | i;
                std::memcpy(mr.data(), &tag, sizeof tag);
                auto sent = conn->send(mr.slice(0, sizeof tag));
                REQUIRE_MESSAGE(sent.has_value(), (sent ? "" : sent.error().message()));
            }
            finish.now();
            while (!done) // connected until the server has read everything
                std::this_thread::sleep_for(1ms);
        });
    SetOnExit release_clients{done}; // also when a failed check ends the test early
    std::vector<Connection> accepted;
    while (accepted.size() < clients_n)
        accepted.push_back(must(listener.accept(20s)));
    go = true; // the server polls nothing until every client sent all it may
    const auto bound = Clock::now() + 60s;
    while (finished < clients_n && Clock::now() < bound)
        std::this_thread::sleep_for(1ms);
    for (Connection& conn : accepted) {
        std::array<std::byte, 64> got{};
        std::uint32_t client = 0;
        for (std::uint32_t i = 0; i < per_client; ++i) {
            auto received = conn.receive(got);
            REQUIRE_MESSAGE(received.has_value(), (received ? "" : received.error().message()));
            std::uint32_t tag = 0;
            std::memcpy(&tag, got.data(), sizeof tag);
            if (i == 0)
                client = tag >> 16;
            REQUIRE(tag == (client << 16 | i)); // every message, in order, from one client
        }
    }
    done = true;
    for (auto& t : clients)
        t.join();
}

TEST_CASE("a client whose receives would take the shared CQ past max_cqe is refused; the others go on") {
    const auto attributes = must(Context::open()).attributes().raw;
    const auto max_cqe = static_cast<std::uint32_t>(attributes.max_cqe);
    ConnectionOptions options = quick();
    options.max_message = 64;
    options.max_send_wr = 2;
    options.lending = Lending::registration; // no window binds: each QP holds 2 + 2 + receive_depth entries
    options.timeout = 20s;
    // three connections fill max_cqe, the fourth passes it (also a client's own CQ grows)
    options.receive_depth = max_cqe / 3 - 4;
    if (options.receive_depth > 0x8000 || options.receive_depth > static_cast<std::uint32_t>(attributes.max_qp_wr)) {
        MESSAGE("max_cqe ", max_cqe, ": three connections' receives cannot fill it here");
        return;
    }
    Listener listener = must(Listener::listen("127.0.0.1", 0, options));
    std::atomic<bool> done{false};
    std::atomic<int> connected{0}, refused{0};
    const auto client = [&] {
        auto conn = Connection::connect("127.0.0.1", listener.port(), options);
        if (!conn) {
            ++refused;
            return;
        }
        ++connected;
        MemoryRegion mr = must(conn->alloc_local_mr(8));
        CHECK(conn->send(mr.slice(0, 8)));
        while (!done)
            std::this_thread::sleep_for(1ms);
    };
    std::vector<test::Thread> clients;
    SetOnExit release_clients{done}; // also when a failed check ends the test early
    std::vector<Connection> accepted;
    for (int i = 0; i < 3; ++i) {
        clients.emplace_back(client);
        accepted.push_back(must(listener.accept(20s)));
    }
    clients.emplace_back(client); // no room for it
    const auto bound = Clock::now() + 20s;
    while (refused == 0 && Clock::now() < bound)
        CHECK(must_fail(listener.accept(100ms)).is_timeout()); // runs its handshake, which fails
    CHECK(refused == 1);
    CHECK(listener.stats().failed == 1);
    std::array<std::byte, 8> got{};
    for (Connection& conn : accepted)
        CHECK(must(conn.receive(got)).size == 8); // the three go on
    accepted.pop_back(); // one leaves: its entries come back
    clients.emplace_back(client);
    accepted.push_back(must(listener.accept(20s)));
    CHECK(must(accepted.back().receive(got)).size == 8);
    CHECK(listener.stats().accepted == 4);
    done = true;
    for (auto& t : clients)
        t.join();
    CHECK(connected == 4);
}

TEST_CASE("the quota counts a region given back until its owner takes it, windows or registrations") {
    for (Lending lending : {Lending::memory_window, Lending::registration}) {
        CAPTURE(static_cast<int>(lending));
        ConnectionOptions owner = quick();
        owner.quota_bytes = 8192;
        owner.lending = lending;
        Listener listener = must(Listener::listen("127.0.0.1", 0, owner));
        test::Thread client([port = listener.port()] {
            auto conn = Connection::connect("127.0.0.1", port, quick());
            REQUIRE(conn);
            int granted = 0;
            for (int i = 0; i < 10; ++i) {
                auto region = conn->request_remote_mr(4096);
                if (!region) {
                    CHECK(region.error().is_errno(EDQUOT));
                    break;
                }
                ++granted;
                CHECK(conn->send_remote_mr(*region));
            }
            CHECK(granted == 2); // the owner never took them back: still pinned
            auto mr = conn->alloc_local_mr(8);
            CHECK(conn->send(mr->slice(0, 1)));
        });
        Connection conn = must(listener.accept(5s));
        std::array<std::byte, 8> done{};
        must(conn.receive(done));
        CHECK(conn.pinned_for_peer() == 8192);
        must(conn.receive_local_mr());
        must(conn.receive_local_mr());
        CHECK(conn.pinned_for_peer() == 0);
        client.join();
    }
}

namespace {

// A client that makes a Connection's handshake by hand (TCP), then SENDs whatever
// control messages it likes, ignoring credits: a hostile peer once connected. Its
// receives take what the server sends, unread.
class ForgingClient {
public:
    static constexpr std::uint32_t depth = 16;

    explicit ForgingClient(std::uint16_t port) : stream_(must(TcpStream::connect("127.0.0.1", port, 3s))) {
        QueuePair* qps[] = {&qp_};
        const auto limits = detail::encode_limits({.max_message = 4096, .receive_depth = depth});
        must(connect_over_tcp(stream_, qps, limits, {}, 3s));
        for (std::uint32_t i = 0; i < depth; ++i)
            must(post_recv(qp_, buffers_.slice(i * 128, 128), receive_tag + i));
        must(stream_.confirm_ready(3s));
    }
    // SENDs `message` (reporting no credit) and waits for it; false once that fails
    // (the server broke the connection).
    bool send(const detail::control::Message& message) {
        const auto encoded = detail::control::encode(message, 0);
        std::memcpy(buffers_.data() + send_at, encoded.span().data(), encoded.size);
        const std::uint64_t id = ++sent_;
        if (!post_send(qp_, buffers_.slice(send_at, encoded.size), {.wr_id = id}))
            return false;
        return wait_for(rig_.cq, id, {.timeout = 5s}, [](const WorkCompletion&) {}).has_value();
    }

private:
    static constexpr std::uint64_t receive_tag = 1ull << 40;
    static constexpr std::size_t send_at = 8192;
    test::Rig rig_;
    QueuePair qp_ = rig_.make_qp(QpType::rc, {.max_send_wr = 16, .max_recv_wr = depth, .max_send_sge = 1,
                                             .max_recv_sge = 1});
    MemoryRegion buffers_ = must(MemoryRegion::allocate(rig_.pd, 16384, access_all));
    TcpStream stream_;
    std::uint64_t sent_ = 0;
};

// The server's Connection broken by what `forge` sends: its Error, once progress()
// sees it (within 20 s).
Error broken_by(const std::function<void(ForgingClient&)>& forge) {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    std::atomic<bool> seen{false};
    test::Thread client([&seen, &forge, port = listener.port()] {
        ForgingClient forger(port);
        forge(forger);
        const auto bound = Clock::now() + 20s;
        while (!seen && Clock::now() < bound) // its QP lives until the server has judged
            std::this_thread::sleep_for(1ms);
    });
    Connection conn = must(listener.accept(5s));
    std::optional<Error> error;
    const auto bound = Clock::now() + 20s;
    while (!error && Clock::now() < bound)
        if (auto ok = conn.progress(); !ok)
            error = ok.error();
    seen = true;
    client.join();
    REQUIRE(error);
    return *error;
}

} // namespace

TEST_CASE("a peer that answers what was not asked, or sends past its credits, breaks the connection (protocol)") {
    // Before, each was taken: the answers kept in maps by made-up id or token (memory the
    // peer chose), the messages beyond credits served as long as it kept sending.
    using namespace detail::control;
    const Error grant = broken_by([](ForgingClient& f) {
        (void)f.send(Grant{.region = {.request = 777, .memory = {.addr = 4096, .length = 64, .rkey = 1}, .token = 5,
                                      .access = Access::remote_read, .lease = 1s}});
    });
    CHECK(grant.kind() == Error::Kind::protocol);
    CHECK_MESSAGE(grant.message().find("region request 777, which is not waiting") != std::string::npos,
                  grant.message());
    const Error deny = broken_by([](ForgingClient& f) { (void)f.send(Deny{.request = 3, .code = EACCES}); });
    CHECK(deny.message().find("region request 3, which is not waiting") != std::string::npos);
    const Error ack = broken_by([](ForgingClient& f) { (void)f.send(ReturnAck{.token = 42, .code = 0}); });
    CHECK(ack.kind() == Error::Kind::protocol);
    CHECK_MESSAGE(ack.message().find("return of token 42, which is not waiting") != std::string::npos, ack.message());
    const Error flood = broken_by([](ForgingClient& f) {
        // the server's depth (32) plus what its 16 reports (one per 16 buffers) gave back:
        // 288 at most, then the next one breaks it
        for (int i = 0; i < 4096 && f.send(Credit{}); ++i) {
        }
    });
    CHECK(flood.kind() == Error::Kind::protocol);
    CHECK_MESSAGE(flood.message().find("without a credit") != std::string::npos, flood.message());
}

TEST_CASE("close(): the peer gets every message, then 'closed'; later calls fail; the destructor closes too") {
    for (Transport transport : {Transport::tcp, Transport::rdma_cm}) {
        CAPTURE(static_cast<int>(transport));
        const std::string host = host_for(transport);
        Listener listener = must(Listener::listen(host, 0, quick(transport)));
        test::Thread client([&] {
            auto conn = Connection::connect(host, listener.port(), quick(transport));
            REQUIRE(conn);
            auto mr = conn->alloc_local_mr(64);
            for (int i = 0; i < 3; ++i)
                CHECK(conn->send(mr->slice(0, 8)));
            auto lent = conn->alloc_local_mr(4096);
            CHECK(conn->send_local_mr(std::move(*lent))); // queued, not waited for: close() sends it
            CHECK(conn->close());
            CHECK(conn->close()); // twice is fine
            const auto after = conn->send(mr->slice(0, 8));
            CHECK((!after && after.error().is_errno(ENOTCONN)));
        });
        Connection conn = must(listener.accept(5s));
        client.join();
        std::array<std::byte, 8> buffer{};
        for (int i = 0; i < 3; ++i)
            CHECK(must(conn.receive(buffer)).size == 8);
        CHECK(must(conn.receive_remote_mr()).memory.length == 4096);
        const auto start = Clock::now();
        const Error e = must_fail(conn.receive(buffer));
        CHECK(Clock::now() - start < 2s);
        CHECK(e.is_errno(ECONNRESET));
    }
}

TEST_CASE("timeouts of milliseconds::max() set no limit: a message 50 ms late is waited for, on both transports") {
    for (Transport transport : {Transport::tcp, Transport::rdma_cm}) {
        CAPTURE(static_cast<int>(transport));
        // now + milliseconds::max() overflowed into a deadline already past: every wait
        // (and RDMA CM's connect attempt) timed out at once
        ConnectionOptions unbounded = quick(transport);
        unbounded.timeout = std::chrono::milliseconds::max();
        unbounded.timeout_per_mib = std::chrono::milliseconds::max();
        const std::string host = host_for(transport);
        const test::Watchdog bound(60s, "a conversation with no time limits");
        Listener listener = must(Listener::listen(host, 0, unbounded));
        test::Thread client([&] {
            auto conn = Connection::connect(host, listener.port(), unbounded);
            REQUIRE(conn);
            auto mr = conn->alloc_local_mr(64);
            REQUIRE(mr);
            std::this_thread::sleep_for(50ms);
            CHECK(conn->send(mr->slice(0, 8)));
            std::array<std::byte, 8> answer{};
            const auto got = conn->receive(answer);
            REQUIRE(got);
            CHECK(got->size == 8);
            CHECK(conn->close());
        });
        Connection conn = must(listener.accept(5s));
        std::array<std::byte, 8> buffer{};
        CHECK(must(conn.receive(buffer)).size == 8);
        std::this_thread::sleep_for(50ms);
        auto mr = must(conn.alloc_local_mr(64));
        CHECK(conn.send(mr.slice(0, 8)));
        client.join();
    }
}

TEST_CASE("the last call of a conversation succeeds when the other side leaves at once (under CPU load)") {
    std::atomic<bool> stop{false};
    test::Thread hog([&] {
        volatile std::uint64_t x = 0;
        while (!stop)
            x = x + 1;
    });
    for (Transport transport : {Transport::tcp, Transport::rdma_cm}) {
        const std::string host = host_for(transport);
        Listener listener = must(Listener::listen(host, 0, quick(transport)));
        int failures = 0;
        for (int round = 0; round < 25; ++round) {
            // the server's last call is receive_local_mr, and it leaves at once; the
            // client's last call, send_remote_mr, waits for the server's answer
            test::Thread server([&] {
                auto conn = listener.accept(5s);
                if (!conn || !conn->receive_local_mr())
                    ++failures;
            });
            auto conn = Connection::connect(host, listener.port(), quick(transport));
            if (!conn) {
                ++failures;
                server.join();
                continue;
            }
            auto region = conn->request_remote_mr(4096);
            if (!region || !conn->send_remote_mr(*region))
                ++failures;
            server.join();
        }
        CAPTURE(static_cast<int>(transport));
        CHECK(failures == 0);
    }
    stop = true;
    hog.join();
}

TEST_CASE("a moved-from Connection or Listener aborts naming the caller") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    Listener moved = std::move(listener);
    RDMAXX_CHECK_DEATH((void)listener.port(), "moved-from Listener");
    RDMAXX_CHECK_DEATH((void)listener.accept(1ms), "moved-from Listener");
    test::Thread client([port = moved.port()] {
        auto c = Connection::connect("127.0.0.1", port, quick());
        REQUIRE(c);
        std::array<std::byte, 8> done;
        CHECK(c->receive(done, 10s)); // the connection lives until the checks are over
    });
    Connection conn = must(moved.accept(5s));
    Connection other = std::move(conn);
    RDMAXX_CHECK_DEATH((void)conn.queue_pair(), "moved-from Connection");
    MemoryRegion mr = must(other.alloc_local_mr(64));
    const RemoteMemory small{.addr = 0x1000, .length = 32, .rkey = 1};
    // the data path's checks name the caller too, through the Connection's calls
    RDMAXX_CHECK_DEATH((void)conn.write(mr.slice(0, 8), small), "moved-from Connection");
    RDMAXX_CHECK_DEATH((void)other.write(mr.slice(0, 64), small), "64 local bytes into a 32-byte remote slice");
    RDMAXX_CHECK_DEATH((void)other.read(mr.slice(0, 64), small), "into a 32-byte remote slice");
    CHECK(other.send(mr.slice(0, 8)));
    client.join();
}

TEST_CASE("connect_another shares the context, PD and CQ: a region of one connection serves the other") {
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    test::Thread clients([port = listener.port()] {
        auto first = Connection::connect("127.0.0.1", port, quick());
        REQUIRE(first);
        auto second = first->connect_another("127.0.0.1", port);
        REQUIRE(second);
        CHECK(first->queue_pair().pd() == second->queue_pair().pd());
        auto mr = first->alloc_local_mr(64);
        std::memcpy(mr->data(), "shared!!", 8);
        CHECK(second->send(mr->slice(0, 8))); // a region of the first's PD, sent by the second
        CHECK(first->send(mr->slice(0, 8)));
    });
    // handshakes run inside accept(): take both before waiting on either
    std::vector<Connection> accepted;
    accepted.push_back(must(listener.accept(5s)));
    accepted.push_back(must(listener.accept(5s)));
    for (Connection& conn : accepted) {
        std::array<std::byte, 8> got{};
        CHECK(must(conn.receive(got)).size == 8);
        CHECK(std::memcmp(got.data(), "shared!!", 8) == 0);
    }
    clients.join();
}

namespace {

// In the VM only (it is root and thrown away): /etc/resolv.conf names a DNS server on
// 127.0.0.1:53 that reads nothing, with glibc told to wait 30 s per query, twice.
class UnansweredDns {
public:
    UnansweredDns() {
        socket_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        REQUIRE(socket_ >= 0);
        sockaddr_in address{.sin_family = AF_INET, .sin_port = htons(53), .sin_addr = {htonl(INADDR_LOOPBACK)}, .sin_zero = {}};
        REQUIRE(::bind(socket_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
        std::FILE* conf = std::fopen("/tmp/rdmaxx-resolv.conf", "w");
        REQUIRE(conf != nullptr);
        std::fputs("nameserver 127.0.0.1\noptions timeout:30 attempts:2\n", conf);
        std::fclose(conf);
        REQUIRE(std::system("mount --bind /tmp/rdmaxx-resolv.conf /etc/resolv.conf") == 0);
    }
    UnansweredDns(const UnansweredDns&) = delete;
    UnansweredDns& operator=(const UnansweredDns&) = delete;
    ~UnansweredDns() {
        if (std::system("umount /etc/resolv.conf") != 0)
            std::fprintf(stderr, "could not unmount the test's resolv.conf\n");
        ::close(socket_);
    }

private:
    int socket_ = -1;
};

} // namespace

TEST_CASE("a host name no DNS server answers for ends at the connect's timeout, on both transports" *
          doctest::skip(std::getenv("RDMAXX_VM") == nullptr)) {
    const UnansweredDns dns;
    for (const Transport transport : {Transport::tcp, Transport::rdma_cm}) {
        CAPTURE(static_cast<int>(transport));
        ConnectionOptions options = quick(transport);
        options.timeout = 1s;
        const auto start = Clock::now();
        const Error e = must_fail(Connection::connect("rdmaxx-nowhere.invalid", 7000, options));
        INFO(e.message());
        CHECK(e.is_timeout());
        CHECK(Clock::now() - start < 3s); // glibc alone would wait 30 s per query
    }
}

// ---------------------------------------------------------------------------------
// Leases end with their connection: closed by the owner, or by the peer.

namespace {

// A 16-byte WRITE posted on `conn`'s QP behind the Connection's back (what a peer's
// raw verbs can do whatever its Connection says), and its completion's status.
ibv_wc_status raw_write(const Connection& conn, const MemoryRegion& local, const RemoteMemory& remote) {
    ibv_qp* qp = conn.queue_pair().get();
    ibv_sge sge = local.slice(0, 16).sge();
    ibv_send_wr wr = test::raw_write_wr(sge, remote, true);
    wr.wr_id = 0x5eed;
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(qp, &wr, &bad) == 0);
    const auto bound = Clock::now() + 30s; // a dropped WRITE ends in retries, within seconds
    while (Clock::now() < bound) {
        ibv_wc wc{};
        if (ibv_poll_cq(qp->send_cq, 1, &wc) == 1 && wc.wr_id == 0x5eed)
            return wc.status;
    }
    FAIL("the raw WRITE did not complete");
    return IBV_WC_GENERAL_ERR;
}

} // namespace

TEST_CASE("a connection's end ends its leases: after close(), or the peer's, a late access fails at the NIC") {
    for (const bool owner_closes : {true, false}) {
        CAPTURE(owner_closes);
        Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
        std::vector<std::byte> memory(4096, std::byte{0xab}); // the owner's, registered by the caller
        std::atomic<bool> taken{false}, ended{false}, client_done{false};
        test::Thread client([&, port = listener.port()] {
            const SetOnExit done{client_done};
            Connection conn = must(Connection::connect("127.0.0.1", port, quick()));
            MemoryRegion local = must(conn.alloc_local_mr(4096));
            std::memset(local.data(), 0x5a, 4096);
            const RemoteMr remote = must(conn.receive_remote_mr());
            taken = true;
            if (!owner_closes)
                CHECK(conn.close());
            const auto bound = Clock::now() + 30s;
            while (!ended && Clock::now() < bound)
                std::this_thread::sleep_for(1ms);
            // the lease (60 s) has not ended: the connection's end must have ended it
            CHECK(raw_write(conn, local, remote.memory) == IBV_WC_REM_ACCESS_ERR);
        });
        Connection conn = must(listener.accept(5s));
        MemoryRegion mr = must(conn.register_local_mr(memory, access_all));
        must(conn.send_local_mr(std::move(mr), 60s));
        serve_until_true(conn, [&] { return taken.load(); });
        if (owner_closes) {
            CHECK(conn.close());
        } else { // the peer's goodbye breaks the connection here
            const auto bound = Clock::now() + 30s;
            while (conn.progress() && Clock::now() < bound)
                std::this_thread::sleep_for(1ms);
            CHECK(must_fail(conn.progress()).is_errno(ECONNRESET));
        }
        ended = true;
        client.join();
        CHECK(all_bytes(memory, std::byte{0xab}));
    }
}

TEST_CASE("a max_message below a control message's size still lends, grants and returns regions") {
    ConnectionOptions options = quick();
    options.max_message = 16;
    Listener listener = must(Listener::listen("127.0.0.1", 0, options));
    std::atomic<bool> client_done{false};
    test::Thread client([&, port = listener.port()] {
        const SetOnExit done{client_done};
        Connection conn = must(Connection::connect("127.0.0.1", port, options));
        const RemoteMr granted = must(conn.request_remote_mr(4096));
        CHECK(granted.memory.length == 4096);
        const RemoteMr lent = must(conn.receive_remote_mr());
        CHECK(lent.memory.length == 64);
        must(conn.send_remote_mr(granted));
        MemoryRegion message = must(conn.alloc_local_mr(17));
        must(conn.send(message.slice(0, 16)));
        CHECK(must_fail(conn.send(message.slice(0, 17))).is_errno(EMSGSIZE));
    });
    Connection conn = must(listener.accept(5s));
    must(conn.send_local_mr(must(conn.alloc_local_mr(64))));
    CHECK(must(conn.receive_local_mr(10s)).size() == 4096);
    std::array<std::byte, 16> buffer{};
    CHECK(must(conn.receive(buffer, 10s)).size == 16);
    serve_until(conn, client_done);
    client.join();
}

TEST_CASE("lending and requesting out of range abort naming the caller") {
    ConnectionOptions small_arena = quick();
    small_arena.pool.arena_bytes = 1 << 20;
    RDMAXX_CHECK_DEATH((void)Listener::listen("127.0.0.1", 0, small_arena), "arena_bytes");
    ConnectionOptions endless = quick();
    endless.max_lease = std::chrono::hours(24 * 50);
    RDMAXX_CHECK_DEATH((void)Connection::connect("127.0.0.1", 1, endless), "max_lease");
    Listener listener = must(Listener::listen("127.0.0.1", 0, quick()));
    test::Thread client([port = listener.port()] {
        Connection c = must(Connection::connect("127.0.0.1", port, quick()));
        std::array<std::byte, 8> done;
        CHECK(c.receive(done, 10s)); // the connection lives until the checks are over
    });
    Connection conn = must(listener.accept(5s));
    RDMAXX_CHECK_DEATH((void)conn.request_remote_mr(4096, access_all | Access::relaxed_ordering),
                       "rights 0x");
    RDMAXX_CHECK_DEATH((void)conn.request_remote_mr(4096, access_all, -1ms), "a lease of -1 ms");
    RDMAXX_CHECK_DEATH((void)conn.request_remote_mr(4096, access_all, std::chrono::hours(24 * 50)), "a lease of");
    // allocated here: a pool that grew in the child would leave its registration in the
    // device context the child shares, and this PD busy
    MemoryRegion lent = must(conn.alloc_local_mr(64));
    RDMAXX_CHECK_DEATH((void)conn.send_local_mr(std::move(lent), -1ms), "negative lease");
    MemoryRegion mr = must(conn.alloc_local_mr(8));
    CHECK(conn.send(mr.slice(0, 8)));
    client.join();
}

TEST_CASE("the quota counts what a grant costs the owner: its block's power of two, and at least a page") {
    ConnectionOptions owner = quick();
    owner.quota_bytes = 64 << 10;
    Listener listener = must(Listener::listen("127.0.0.1", 0, owner));
    std::atomic<bool> client_done{false};
    int bytes_granted = 0;
    std::optional<Error> refused;
    test::Thread client([&, port = listener.port()] {
        const SetOnExit done{client_done};
        Connection conn = must(Connection::connect("127.0.0.1", port, quick()));
        // a byte at a time: each costs a page (and a key), so 16 fill 64 KiB
        for (int i = 0; i < 1000 && !refused; ++i) {
            if (auto region = conn.request_remote_mr(1, access_all, 60s); region)
                ++bytes_granted;
            else
                refused = region.error();
        }
    });
    Connection conn = must(listener.accept(5s));
    serve_until(conn, client_done);
    client.join();
    CHECK(bytes_granted == 16);
    REQUIRE(refused);
    CHECK(refused->is_errno(EDQUOT));
    CHECK(conn.pinned_for_peer() == 0); // the client gone: its leases ended with the connection

    // 4097 bytes take an 8 KiB block: eight fit in 64 KiB, not fifteen
    std::atomic<bool> second_done{false};
    int blocks = 0;
    test::Thread second([&, port = listener.port()] {
        const SetOnExit done{second_done};
        Connection c = must(Connection::connect("127.0.0.1", port, quick()));
        while (blocks < 100 && c.request_remote_mr(4097, access_all, 60s))
            ++blocks;
    });
    Connection other = must(listener.accept(5s));
    serve_until(other, second_done);
    second.join();
    CHECK(blocks == 8);
}
