// The TCP side of connection setup, on loopback: every failure a clear Error in time.
#include <cstring>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <doctest/doctest.h>

#include <rdmaxx/ctrl/tcp.hpp>

#include "../support/check.hpp"
#include "../support/thread.hpp"
#include "resolve.hpp"

using namespace rdmaxx;
using namespace std::chrono_literals;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

EndpointMessage message(std::uint32_t qpn) {
    return {.qps = {{.endpoint = {.qpn = qpn, .psn = 1, .gid = {}, .lid = 1, .mtu = Mtu::b1024}, .type = QpType::rc}},
            .metadata = {std::byte{1}, std::byte{2}}};
}

void raw_send(TcpStream& s, std::span<const std::byte> bytes) { must(s.write_all(bytes, Clock::now() + 1s)); }

} // namespace

TEST_CASE("two peers exchange endpoint messages and confirm readiness") {
    TcpListener listener = must(TcpListener::listen("127.0.0.1", 0));
    REQUIRE(listener.port() != 0);
    test::Thread client([port = listener.port()] {
        TcpStream s = must(TcpStream::connect("127.0.0.1", port, 2s));
        CHECK(must(s.exchange(message(2), 2s)) == message(1));
        must(s.confirm_ready(2s));
    });
    TcpStream server = must(listener.accept(2s));
    CHECK(must(server.exchange(message(1), 2s)) == message(2));
    must(server.confirm_ready(2s));
    client.join();
}

TEST_CASE("a refused connection is an Error at once") {
    std::uint16_t port = 0;
    {
        TcpListener closed = must(TcpListener::listen("127.0.0.1", 0));
        port = closed.port();
    }
    const auto start = Clock::now();
    const Error e = must_fail(TcpStream::connect("127.0.0.1", port, 2s));
    CHECK(e.is_errno(ECONNREFUSED));
    CHECK(Clock::now() - start < 1s);
    CHECK(must_fail(TcpStream::connect("no-such-host.invalid", 1, 1s)).message().find("getaddrinfo") !=
          std::string::npos);
}

TEST_CASE("nobody connecting and a silent peer are timeouts") {
    TcpListener listener = must(TcpListener::listen("127.0.0.1", 0));
    CHECK(must_fail(listener.accept(100ms)).is_timeout());
    TcpStream client = must(TcpStream::connect("127.0.0.1", listener.port(), 1s));
    TcpStream server = must(listener.accept(1s));
    const auto start = Clock::now();
    CHECK(must_fail(server.exchange(message(1), 200ms)).is_timeout());
    CHECK(Clock::now() - start < 1s);
}

TEST_CASE("a peer that closes mid-handshake, garbage and a newer version are clear Errors") {
    TcpListener listener = must(TcpListener::listen("127.0.0.1", 0));
    const auto bytes = endpoint_codec::encode(message(9));
    SUBCASE("closed after half the message") {
        test::Thread client([&] {
            TcpStream s = must(TcpStream::connect("127.0.0.1", listener.port(), 1s));
            raw_send(s, std::span(bytes).first(bytes.size() / 2));
        });
        TcpStream server = must(listener.accept(1s));
        client.join();
        const Error e = must_fail(server.exchange(message(1), 1s));
        // the peer's close shows up as end of stream, or as a reset if our own
        // message was still in flight: both are ECONNRESET, EPIPE on send
        CHECK((e.is_errno(ECONNRESET) || e.is_errno(EPIPE)));
    }
    SUBCASE("garbage") {
        test::Thread client([&] {
            TcpStream s = must(TcpStream::connect("127.0.0.1", listener.port(), 1s));
            const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
            raw_send(s, std::as_bytes(std::span(junk)));
            std::byte sink[256];
            (void)s.read_exact(sink, Clock::now() + 1s);
        });
        TcpStream server = must(listener.accept(1s));
        const Error e = must_fail(server.exchange(message(1), 1s));
        CHECK(e.kind() == Error::Kind::protocol);
        CHECK(e.message().find("wrong magic") != std::string::npos);
        server = TcpStream(std::move(server)); // still movable after a failure
        client.join();
    }
    SUBCASE("a newer protocol version") {
        auto future = bytes;
        future[5] = std::byte{7};
        test::Thread client([&] {
            TcpStream s = must(TcpStream::connect("127.0.0.1", listener.port(), 1s));
            raw_send(s, future);
            std::byte sink[256];
            (void)s.read_exact(sink, Clock::now() + 1s);
        });
        TcpStream server = must(listener.accept(1s));
        CHECK(must_fail(server.exchange(message(1), 1s)).message().find("version 7 is not supported") !=
              std::string::npos);
        client.join();
    }
    // the listener serves the next client after any of them
    test::Thread good([&] {
        TcpStream s = must(TcpStream::connect("127.0.0.1", listener.port(), 1s));
        CHECK(must(s.exchange(message(3), 1s)) == message(4));
    });
    TcpStream server = must(listener.accept(1s));
    CHECK(must(server.exchange(message(4), 1s)) == message(3));
    good.join();
}

TEST_CASE("host names: numeric ones need no lookup, names go through the bounded resolver") {
    const auto soon = Clock::now() + 5s;
    const auto v4 = must(detail::resolve_host("127.0.0.1", 80, AF_UNSPEC, false, soon));
    REQUIRE(v4.size() == 1);
    CHECK(v4[0].family == AF_INET);
    CHECK(ntohs(reinterpret_cast<const sockaddr_in*>(v4[0].get())->sin_port) == 80);
    const auto v6 = must(detail::resolve_host("::1", 81, AF_UNSPEC, false, soon));
    REQUIRE(v6.size() == 1);
    CHECK(v6[0].family == AF_INET6);
    CHECK_FALSE(must(detail::resolve_host("", 82, AF_INET, true, soon)).empty()); // every address
    // a name from /etc/hosts, through getaddrinfo_a
    const auto named = must(detail::resolve_host("localhost", 83, AF_INET, false, soon));
    REQUIRE_FALSE(named.empty());
    CHECK(reinterpret_cast<const sockaddr_in*>(named[0].get())->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
}

TEST_CASE("an endpoint message the codec refuses aborts naming exchange()'s caller") {
    TcpListener listener = must(TcpListener::listen("127.0.0.1", 0));
    TcpStream client = must(TcpStream::connect("127.0.0.1", listener.port(), 2s));
    TcpStream server = must(listener.accept(2s));
    RDMAXX_CHECK_DEATH((void)client.exchange(EndpointMessage{}, 1s), "an endpoint message with 0 QPs");
}

TEST_CASE("AcceptBackoff: 10 ms after a failure for want of resources, doubling to 1 s; none for other failures") {
    using std::chrono::milliseconds;
    AcceptBackoff backoff;
    CHECK(backoff.failed(ECONNRESET) == milliseconds(0)); // the next client may be fine
    CHECK(backoff.failed(EMFILE) == milliseconds(10));
    CHECK(backoff.failed(ENFILE) == milliseconds(20));
    CHECK(backoff.failed(ENOBUFS) == milliseconds(40));
    CHECK(backoff.failed(ENOMEM) == milliseconds(80));
    for (int i = 0; i < 10; ++i)
        (void)backoff.failed(EMFILE);
    CHECK(backoff.failed(EMFILE) == milliseconds(1000));
    backoff.succeeded();
    CHECK(backoff.failed(EMFILE) == milliseconds(10));
}
