// The connection's pure parts on the host: the credit window (floors, lies, no
// ping-pong, no jam), the lease table (quota until really released, expiry on a
// made-up clock), a listener's slots shared out by host, and the options a Connection
// refuses.
#include <chrono>
#include <deque>
#include <map>
#include <random>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <rdmaxx/ctrl/connection.hpp>
#include <rdmaxx/ctrl/tcp.hpp>

#include "../support/check.hpp"
#include "credit_window.hpp"
#include "host_shares.hpp"
#include "lease_table.hpp"
#include "link.hpp"

using namespace rdmaxx;
using detail::CreditWindow;
using Use = CreditWindow::Use;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

TEST_CASE("credit window: user messages keep a reserve, control messages one, credit-only none") {
    CreditWindow w(4, 4);
    CHECK(w.can_send(Use::user));
    CHECK(w.spend() == 0);
    CHECK(w.spend() == 0);
    CHECK_FALSE(w.can_send(Use::user)); // 2 left: the reserve
    CHECK(w.can_send(Use::control));
    (void)w.spend();
    CHECK_FALSE(w.can_send(Use::control));
    CHECK(w.can_send(Use::credit_only));
    (void)w.spend();
    CHECK_FALSE(w.can_send(Use::credit_only));
    must(w.returned(4));
    CHECK(w.available() == 4);
}

TEST_CASE("credit window: a peer returning more than was out is a protocol error") {
    CreditWindow w(8, 8);
    rdmaxx::test::check_protocol_error(w.returned(1), "returned 1 credits, 0 were out");
    (void)w.spend();
    (void)w.spend();
    must(w.returned(2));
    rdmaxx::test::check_protocol_error(w.returned(0xffff), "returned 65535");
}

TEST_CASE("credit window: reports carry every reposted buffer; a failed post loses nothing") {
    CreditWindow w(8, 8);
    w.reposted();
    w.reposted();
    w.reposted();
    const auto report = w.spend();
    CHECK(report == 3);
    CHECK(w.unreported() == 0);
    w.unspend(report);
    CHECK(w.unreported() == 3);
    CHECK(w.available() == 8);
}

TEST_CASE("credit window: a peer that sends past its credits is a protocol error") {
    CreditWindow w(8, 4); // our depth: 4
    for (int i = 0; i < 4; ++i)
        must(w.received());
    rdmaxx::test::check_protocol_error(w.received(), "without a credit");
    w.reposted();
    w.reposted();
    CHECK(w.spend() == 2); // reported: the peer may send two more
    must(w.received());
    must(w.received());
    rdmaxx::test::check_protocol_error(w.received(), "without a credit");
    w.reposted();
    const auto report = w.spend();
    w.unspend(report); // never sent: the peer did not get it
    rdmaxx::test::check_protocol_error(w.received(), "without a credit");
}

TEST_CASE("credit window: a WRITE_WITH_IMM (no header) spends a credit and keeps the reports for the next message") {
    CreditWindow w(8, 8);
    w.reposted();
    w.reposted();
    w.spend_without_report();
    CHECK(w.available() == 7);
    CHECK(w.unreported() == 2); // lost here, they would never reach the peer: it runs dry
    CHECK(w.spend() == 2);
}

// Two ends exchanging messages through their windows, as Link does: every message
// carries the sender's unreported credits; a receiver reposts the buffer of a
// control or credit-only message at once and a user message's when the application
// takes it.
struct Wire {
    struct End {
        CreditWindow window;
        std::deque<bool> inbox_user; // user messages not yet taken by the application
    };
    struct Message {
        bool user;
        std::uint16_t credits;
    };
    End a, b;
    std::deque<Message> to_a, to_b;
    int credit_only_sent = 0;

    Wire(std::uint32_t depth_a, std::uint32_t depth_b)
        : a{CreditWindow(depth_b, depth_a), {}}, b{CreditWindow(depth_a, depth_b), {}} {}

    static void deliver(End& to, std::deque<Message>& queue) {
        while (!queue.empty()) {
            const Message m = queue.front();
            queue.pop_front();
            must(to.window.received()); // an honest sender never trips it
            must(to.window.returned(m.credits));
            if (m.user)
                to.inbox_user.push_back(true);
            else
                to.window.reposted();
        }
    }
    void send(End& from, std::deque<Message>& queue, bool user) { queue.push_back({user, from.window.spend()}); }
    // Link::flush's rule: a credit-only message when enough buffers wait to be reported.
    bool flush(End& from, std::deque<Message>& queue) {
        if (!from.window.wants_credit_message())
            return false;
        send(from, queue, false);
        ++credit_only_sent;
        return true;
    }
    void take_all(End& end) {
        while (!end.inbox_user.empty()) {
            end.inbox_user.pop_front();
            end.window.reposted();
        }
    }
};

TEST_CASE("credit window: credit-only messages never answer each other (receive depth 4 to 64)") {
    for (std::uint32_t depth : {4u, 5u, 8u, 32u, 64u}) {
        CAPTURE(depth);
        Wire wire(depth, depth);
        // a exhausts its user credits, b takes everything; then only credits flow
        while (wire.a.window.can_send(Use::user))
            wire.send(wire.a, wire.to_b, true);
        Wire::deliver(wire.b, wire.to_b);
        wire.take_all(wire.b);
        int rounds = 0;
        for (; rounds < 100; ++rounds) {
            const bool moved = wire.flush(wire.b, wire.to_a) | wire.flush(wire.a, wire.to_b);
            Wire::deliver(wire.a, wire.to_a);
            Wire::deliver(wire.b, wire.to_b);
            if (!moved)
                break;
        }
        CHECK(rounds < 3); // quiet at once: no ping-pong
        CHECK(wire.credit_only_sent <= 2);
        CHECK(wire.a.window.can_send(Use::user)); // and a got its credits back
    }
}

TEST_CASE("credit window: random traffic both ways never jams while the applications take their messages") {
    std::mt19937 random(42);
    for (std::uint32_t depth_a : {4u, 6u, 16u})
        for (std::uint32_t depth_b : {4u, 7u, 32u}) {
            CAPTURE(depth_a);
            CAPTURE(depth_b);
            Wire wire(depth_a, depth_b);
            int sent_a = 0, sent_b = 0;
            for (int step = 0; step < 5000; ++step) {
                switch (random() % 6) {
                case 0: if (wire.a.window.can_send(Use::user)) wire.send(wire.a, wire.to_b, true), ++sent_a; break;
                case 1: if (wire.b.window.can_send(Use::user)) wire.send(wire.b, wire.to_a, true), ++sent_b; break;
                case 2: if (wire.a.window.can_send(Use::control)) wire.send(wire.a, wire.to_b, false); break;
                case 3: if (wire.b.window.can_send(Use::control)) wire.send(wire.b, wire.to_a, false); break;
                case 4: Wire::deliver(wire.a, wire.to_a), wire.take_all(wire.a), wire.flush(wire.a, wire.to_b); break;
                case 5: Wire::deliver(wire.b, wire.to_b), wire.take_all(wire.b), wire.flush(wire.b, wire.to_a); break;
                }
            }
            // settle: deliver and flush until quiet; then both may send user messages again
            for (int i = 0; i < 10; ++i) {
                Wire::deliver(wire.a, wire.to_a);
                wire.take_all(wire.a);
                Wire::deliver(wire.b, wire.to_b);
                wire.take_all(wire.b);
                wire.flush(wire.a, wire.to_b);
                wire.flush(wire.b, wire.to_a);
            }
            CHECK(wire.a.window.can_send(Use::user));
            CHECK(wire.b.window.can_send(Use::user));
            CHECK(sent_a > 100);
            CHECK(sent_b > 100);
        }
}

namespace {

// A stand-in for Loan: the table needs size(), revoke() and moves.
struct Block {
    std::size_t bytes;
    bool revoked = false;
    std::size_t size() const { return bytes; }
    void revoke() { revoked = true; }
};
using FakeClock = std::chrono::steady_clock;
using Table = detail::LeaseTable<Block>;
const FakeClock::time_point t0{};

} // namespace

TEST_CASE("lease table: a region given back counts against the quota until the owner takes it") {
    Table table(8192);
    CHECK(table.fits(8192));
    table.add(11, Block{8192}, t0 + std::chrono::seconds(30), 8192);
    CHECK_FALSE(table.fits(1));
    CHECK(table.give_back(11));
    CHECK_FALSE(table.give_back(11)); // once
    CHECK_FALSE(table.fits(1));       // still registered, still pinned: the quota says so
    CHECK(table.pinned_for_peer() == 8192);
    const auto back = table.take_returned();
    REQUIRE(back);
    CHECK(back->size() == 8192);
    CHECK(back->revoked); // the peer's key died when it gave the region back
    CHECK(table.fits(8192));
    CHECK(table.pinned_for_peer() == 0);
    CHECK_FALSE(table.take_returned());
}

TEST_CASE("lease table: a peer looping request and return fills the quota while the owner does not take back") {
    Table table(64 << 10);
    int granted = 0;
    for (std::uint64_t token = 1; token < 1000; ++token) {
        if (!table.fits(4096))
            break;
        table.add(token, Block{4096}, t0 + std::chrono::seconds(30), 4096);
        CHECK(table.give_back(token));
        ++granted;
    }
    CHECK(granted == 16);
    CHECK(table.pinned_for_peer() == 64 << 10);
}

TEST_CASE("lease table: leases end exactly at their expiry, on a made-up clock, in microseconds") {
    using namespace std::chrono_literals;
    Table table(1 << 20);
    table.add(1, Block{100}, t0 + 10us, 100);
    table.add(2, Block{200}, t0 + 20us, 0); // lent: charged nothing
    table.add(3, Block{300}, t0 + 30us, 4096); // charged a page, say
    CHECK(table.pinned_for_peer() == 4196); // what the owner said each costs
    CHECK(table.next_expiry() == t0 + 10us);
    CHECK(table.expire(t0 + 9us) == 0);
    CHECK(table.expire(t0 + 10us) == 1);
    CHECK(table.pinned_for_peer() == 4096);
    CHECK(table.next_expiry() == t0 + 20us);
    CHECK_FALSE(table.give_back(1)); // expired: the owner refuses it (ESTALE)
    CHECK(table.expire(t0 + 29us) == 1);
    CHECK(table.give_back(3));
    CHECK(table.expire(t0 + 1s) == 0); // given back: no longer a lease
    CHECK(table.live() == 0);
    CHECK(table.pinned_for_peer() == 4096);
    CHECK_FALSE(table.next_expiry());
}

namespace {

// A time point that counts its comparisons: what the table's bookkeeping costs.
struct CountedTime {
    std::int64_t us = 0;
    static inline std::uint64_t comparisons = 0;
    friend bool operator<(CountedTime a, CountedTime b) {
        ++comparisons;
        return a.us < b.us;
    }
    friend bool operator==(CountedTime, CountedTime) = default;
};

} // namespace

TEST_CASE("lease table: the earliest end is kept, so that a pump with nothing ended costs one comparison") {
    detail::LeaseTable<Block, CountedTime> table(1 << 20);
    for (std::int64_t k = 0; k < 1000; ++k) // every lease ends at 1,000..1,999 us
        table.add(static_cast<std::uint64_t>(k), Block{64}, CountedTime{1000 + (k * 7919) % 1000}, 0);
    CountedTime::comparisons = 0;
    for (std::int64_t now = 0; now < 1000; ++now)
        CHECK(table.expire(CountedTime{now}) == 0);
    CHECK(table.next_expiry() == CountedTime{1000});
    CHECK(CountedTime::comparisons == 1000); // it was 1,000 a call: one per lease
    // the earliest given back or ended: the next one is found
    CHECK(table.give_back(0)); // token 0 ends at 1,000
    CHECK(table.next_expiry() == CountedTime{1001});
    CHECK(table.give_back(1)); // ends at 1,919: not the earliest
    CHECK(table.next_expiry() == CountedTime{1001});
    CHECK(table.expire(CountedTime{1001}) == 1);
    CHECK(table.next_expiry() == CountedTime{1002});
    table.add(5000, Block{64}, CountedTime{500}, 0); // an earlier end
    CHECK(table.next_expiry() == CountedTime{500});
    CHECK(table.expire(CountedTime{1999}) == 998);
    CHECK_FALSE(table.next_expiry());
    CHECK(table.live() == 0);
}

TEST_CASE("connection limits: the handshake's 8 bytes are bounded") {
    const auto good = detail::encode_limits({.max_message = 4096, .receive_depth = 32});
    const auto limits = must(detail::decode_limits(good));
    CHECK(limits.max_message == 4096);
    CHECK(limits.receive_depth == 32);
    const auto lie = [](std::uint32_t max_message, std::uint32_t depth) {
        return detail::decode_limits(detail::encode_limits({.max_message = max_message, .receive_depth = depth}));
    };
    rdmaxx::test::check_protocol_error(lie(0xffffffff, 32), "max_message 4294967295 is outside");
    rdmaxx::test::check_protocol_error(lie(0, 32), "max_message 0");
    rdmaxx::test::check_protocol_error(lie(4096, 0xffffffff), "receive depth 4294967295 is outside");
    rdmaxx::test::check_protocol_error(lie(4096, 3), "receive depth 3");
    rdmaxx::test::check_protocol_error(detail::decode_limits(std::span(good).first(7)), "7 bytes");
}

TEST_CASE("connection options out of range abort naming the caller, before any device is touched") {
    const auto with = [](auto change) {
        ConnectionOptions o;
        change(o);
        return o;
    };
    RDMAXX_CHECK_DEATH((void)Connection::connect("127.0.0.1", 1, with([](auto& o) { o.receive_depth = 3; })),
                       "receive_depth 3 outside 4..32768");
    RDMAXX_CHECK_DEATH((void)Connection::connect("127.0.0.1", 1, with([](auto& o) { o.receive_depth = 0; })),
                       "receive_depth 0");
    RDMAXX_CHECK_DEATH((void)Listener::listen("127.0.0.1", 0, with([](auto& o) { o.max_message = 0; })),
                       "max_message 0 outside");
    RDMAXX_CHECK_DEATH((void)Listener::listen("127.0.0.1", 0, with([](auto& o) { o.max_send_wr = 0; })),
                       "max_send_wr 0 below 2");
    RDMAXX_CHECK_DEATH((void)Listener::listen("127.0.0.1", 0,
                                              with([](auto& o) { o.timeout = std::chrono::milliseconds(0); })),
                       "the timeout must be positive");
}

TEST_CASE("peer host: an IPv4 address as is, an IPv6 address's /64, an IPv4-mapped one as IPv4, else nothing") {
    CHECK(peer_host("198.51.100.2:40000") == "198.51.100.2");
    CHECK(peer_host("2001:db8:1:2:aaaa:bbbb:cccc:dddd:5000") == "2001:db8:1:2::/64");
    CHECK(peer_host("2001:db8:1:2::9:5001") == peer_host("2001:db8:1:2:ffff::1:80")); // a host's own addresses
    CHECK(peer_host("2001:db8:1:3::9:5001") != peer_host("2001:db8:1:2::9:5001"));
    CHECK(peer_host("::ffff:198.51.100.2:40000") == "198.51.100.2");
    CHECK(peer_host("fe80::1:2%vA:4791") == "fe80::/64"); // a link-local address names its interface
    CHECK(peer_host("localhost:80") == "");
    CHECK(peer_host("") == "");
}

namespace {

// A listener's slots as ListenerCore keeps them: its pending clients' hosts, oldest
// first, every one free to go.
struct Slots {
    std::size_t size;
    std::deque<std::string> pending;
    detail::HostShares shares;
    std::uint64_t turned_away = 0, evicted = 0;

    bool knock(const std::string& host) {
        if (pending.size() >= size) {
            const auto yielding = shares.yielding_to(host);
            if (!yielding) {
                ++turned_away;
                return false;
            }
            pending.erase(std::find(pending.begin(), pending.end(), *yielding)); // its oldest
            shares.remove(*yielding);
            ++evicted;
        }
        pending.push_back(host);
        shares.add(host);
        return true;
    }
    void finish_oldest() {
        shares.remove(pending.front());
        pending.pop_front();
    }
};

} // namespace

TEST_CASE("host shares: under no pressure one host may take every slot; when they run short a host holding fewer "
          "takes the flooding host's oldest, until they are level") {
    Slots slots{.size = 8, .pending = {}, .shares = {}};
    for (int i = 0; i < 20; ++i)
        (void)slots.knock("flood");
    CHECK(slots.shares.held_by("flood") == 8); // nobody else asked
    CHECK(slots.turned_away == 12);            // its own newcomers never push out its own
    CHECK(slots.evicted == 0);
    for (int i = 0; i < 4; ++i)
        CHECK(slots.knock("honest"));
    CHECK(slots.pending.front() == "flood"); // its oldest went first: the next oldest are left
    CHECK(slots.shares.held_by("flood") == 4);
    CHECK(slots.shares.held_by("honest") == 4);
    CHECK(slots.evicted == 4);
    CHECK_FALSE(slots.knock("honest")); // level: neither pushes out the other
    CHECK_FALSE(slots.knock("flood"));
    CHECK(slots.knock("third")); // a third host still gets in, from one of the two holding the most
    CHECK(slots.shares.held_by("third") == 1);
    CHECK(slots.shares.held_by("flood") + slots.shares.held_by("honest") == 7);
    CHECK(slots.knock("")); // "" (no numeric address) is a host like any other
}

TEST_CASE("host shares: a host flooding ten times as fast as two others ask still leaves each of them about a "
          "third (9 of 30 or more: one may be on its way in)") {
    // each round: the oldest client finishes, the flood knocks ten times, the others once
    Slots slots{.size = 30, .pending = {}, .shares = {}};
    std::uint64_t honest_in = 0, honest_asked = 0;
    for (int round = 0; round < 1000; ++round) {
        if (slots.pending.size() == slots.size)
            slots.finish_oldest();
        for (int i = 0; i < 10; ++i)
            (void)slots.knock("flood");
        for (const char* host : {"a", "b"}) {
            ++honest_asked;
            honest_in += slots.knock(host) ? 1 : 0;
        }
        CHECK(slots.shares.held_by("flood") <= slots.size); // never past the slots
        CHECK(slots.pending.size() <= slots.size);
    }
    MESSAGE(honest_in, " of ", honest_asked, " honest clients taken in; ", slots.evicted, " evicted");
    CHECK(slots.shares.held_by("a") >= 9);
    CHECK(slots.shares.held_by("b") >= 9);
    CHECK(slots.shares.held_by("flood") <= 12);
}

TEST_CASE("host shares: whatever clients come and go, the host yielding is one holding the most, named in constant "
          "time however many hosts hold slots") {
    // against the rule worked out the long way: a scan of every host's count
    detail::HostShares shares;
    std::map<std::string, std::uint32_t> reference;
    std::mt19937 random(16);
    const auto host_of = [](unsigned n) { return fmt::format("10.0.{}.{}", n / 250, n % 250); };
    for (int step = 0; step < 20000; ++step) {
        // a few hosts come often (the flood), the many rarely
        const unsigned n = random() % 4 == 0 ? random() % 3 : random() % 1000;
        const std::string host = host_of(n);
        if (random() % 5 < 3) {
            shares.add(host);
            ++reference[host];
        } else if (reference.contains(host)) {
            shares.remove(host);
            if (--reference[host] == 0)
                reference.erase(host);
        }
        const std::string newcomer = host_of(random() % 1000);
        std::uint32_t most = 0;
        for (const auto& [h, held] : reference)
            most = std::max(most, held);
        const std::uint32_t newcomers = reference.contains(newcomer) ? reference.at(newcomer) : 0;
        REQUIRE(shares.held_by(host) == (reference.contains(host) ? reference.at(host) : 0));
        const auto yielding = shares.yielding_to(newcomer);
        if (most >= newcomers + 2) {
            REQUIRE(yielding);
            REQUIRE(reference.contains(*yielding));
            REQUIRE(reference.at(*yielding) == most);
        } else {
            REQUIRE_FALSE(yielding);
        }
    }
    for (const auto& [h, held] : reference) // every slot given back: nobody holds any
        for (std::uint32_t i = 0; i < held; ++i)
            shares.remove(h);
    CHECK_FALSE(shares.yielding_to(""));
    shares.add("a");
    shares.add("a");
    CHECK(shares.yielding_to("b") == "a"); // the buckets still work from empty
    shares.remove("nobody"); // a host holding none: nothing to give back
    CHECK(shares.held_by("a") == 2);
}
