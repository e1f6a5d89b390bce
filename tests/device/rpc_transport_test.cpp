// lib/rpc's UD transport on a real device: packets of every length cross between two
// transports of one process on one io_context, byte for byte, many more than the ring
// holds (its buffers are posted again), with send buffers running out and coming back;
// and gathered from memory the transport holds until each send completed. Its RC
// transport: receives a hostile peer fails are posted again.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <rdmaxx/data/post.hpp>

#include <doctest/doctest.h>

#include "../support/device.hpp"
#include "../support/netdev.hpp"
#include "../support/run_until.hpp"
#include "rc_transport.hpp"
#include "ud_transport.hpp"

using namespace rdmaxx;
using namespace rdmaxx::rpc::detail;
using namespace std::chrono_literals;
using rdmaxx::test::must;

namespace {

// Packet n: 4 bytes of n, then n % (mtu - 3) bytes that follow from n.
std::vector<std::byte> packet(std::uint32_t n, std::uint32_t mtu) {
    std::vector<std::byte> bytes(4 + n % (mtu - 3));
    std::memcpy(bytes.data(), &n, 4);
    for (std::size_t k = 4; k < bytes.size(); ++k)
        bytes[k] = static_cast<std::byte>((n + k) % 251);
    return bytes;
}

struct Receiver {
    std::uint32_t mtu = 0;
    std::uint32_t expected_qpn = 0;
    std::vector<int> seen;
    int wrong = 0;
    static void deliver(void* self, UdSource from, std::span<const std::byte> bytes) {
        auto& r = *static_cast<Receiver*>(self);
        std::uint32_t n = 0;
        if (bytes.size() < 4 || from.qpn != r.expected_qpn) {
            ++r.wrong;
            return;
        }
        std::memcpy(&n, bytes.data(), 4);
        const auto want = packet(n, r.mtu);
        if (n >= r.seen.size() || bytes.size() != want.size() || std::memcmp(bytes.data(), want.data(), want.size()) != 0)
            ++r.wrong;
        else
            ++r.seen[n];
    }
    static void ignore(void*, UdSource, std::span<const std::byte>) {}
};

} // namespace

TEST_CASE("UD transport: 5,000 packets of every length, 20x the receive ring, in busy and event modes") {
    for (const auto mode : {async::CompletionMode::busy, async::CompletionMode::event}) {
        CAPTURE(static_cast<int>(mode));
        asio::io_context io;
        Receiver receiver;
        auto b = must(UdTransport::create(io, {.ring = 256, .send_depth = 16, .drive = {.mode = mode}},
                                          &Receiver::deliver, &receiver));
        auto a = must(UdTransport::create(io, {.ring = 16, .send_depth = 32, .drive = {.mode = mode}},
                                          &Receiver::ignore, nullptr));
        receiver.mtu = b->mtu();
        receiver.expected_qpn = a->address().endpoint.qpn;
        constexpr std::uint32_t total = 5000;
        receiver.seen.assign(total, 0);
        const AddressHandle to_b = must(a->handles().to(b->address()));
        // send as fast as send buffers allow; pace to the receiver's ring (UD drops
        // what finds no receive posted): at most 128 ahead of what arrived
        std::uint32_t next = 0, with_payload = 0;
        int stalls = 0;
        const auto deadline = std::chrono::steady_clock::now() + 60s;
        std::uint32_t arrived = 0;
        while (arrived < total && std::chrono::steady_clock::now() < deadline) {
            while (next < total && next < arrived + 128) {
                const auto bytes = packet(next, b->mtu());
                auto sent = must(a->send(to_b, b->address(), std::span(bytes).first(4), std::span(bytes).subspan(4)));
                if (!sent) {
                    ++stalls;
                    break;
                }
                ++next;
                with_payload += bytes.size() > 4;
            }
            io.restart();
            io.run_for(1ms);
            arrived = static_cast<std::uint32_t>(std::count(receiver.seen.begin(), receiver.seen.end(), 1));
        }
        CHECK(receiver.wrong == 0);
        CHECK(arrived == total);
        CHECK(a->copies() == with_payload); // a packet with no payload copies none
        CHECK(a->failed_sends() == 0);
        CHECK(a->free_send_buffers() <= 32);
        MESSAGE("send-buffer stalls: ", stalls);
    }
}

TEST_CASE("UD transport: payloads gathered from held memory arrive whole; the memory is held until the sends complete") {
    asio::io_context io;
    Receiver receiver;
    auto b = must(UdTransport::create(io, {.ring = 256, .send_depth = 16}, &Receiver::deliver, &receiver));
    auto a = must(UdTransport::create(io, {.ring = 16, .send_depth = 32}, &Receiver::ignore, nullptr));
    receiver.mtu = b->mtu();
    receiver.expected_qpn = a->address().endpoint.qpn;
    constexpr std::uint32_t total = 24;
    receiver.seen.assign(total, 0);
    const AddressHandle to_b = must(a->handles().to(b->address()));
    // the payloads of all 24 packets side by side in one registered block
    std::vector<std::vector<std::byte>> packets;
    std::size_t bytes = 0;
    for (std::uint32_t n = 0; n < total; ++n) {
        packets.push_back(packet(n * 41 + 5, b->mtu())); // lengths from 9 up: payloads of 5 and more
        bytes += packets.back().size() - 4;
    }
    rpc::detail::BufferHold memory(
        new rpc::detail::BufferBlock(must(MemoryRegion::allocate(a->pd(), bytes, Access::none)), 0));
    std::size_t at = 0;
    for (std::uint32_t n = 0; n < total; ++n) {
        const auto payload = std::span(packets[n]).subspan(4);
        std::memcpy(memory.get()->region.data() + at, payload.data(), payload.size());
        receiver.seen.resize(std::max<std::size_t>(receiver.seen.size(), n * 41 + 6));
        REQUIRE(must(a->send_gather(to_b, b->address(), std::span(packets[n]).first(4),
                                    memory.get()->region.slice(at, payload.size()), memory)));
        at += payload.size();
    }
    CHECK(memory.get()->holders > 1); // the sends not all complete yet: the transport holds it
    CHECK(a->copies() == 0);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::count(receiver.seen.begin(), receiver.seen.end(), 1) < total && std::chrono::steady_clock::now() < deadline)
        io.run_for(1ms);
    for (int i = 0; i < 100 && memory.get()->holders > 1; ++i)
        io.run_for(1ms); // the last send completions
    CHECK(receiver.wrong == 0);
    CHECK(std::count(receiver.seen.begin(), receiver.seen.end(), 1) == total);
    CHECK(memory.get()->holders == 1);
    CHECK(a->failed_sends() == 0);
}

// ---------------------------------------------------------------------------------
// A peer that breaks the QP it talks to with a SEND larger than the receive it lands
// in (the receive fails: local length error). Each such receive is posted again, so
// a hostile peer that reconnects and does it again cannot drain either SRQ: after
// more failures than the SRQ holds, an honest SEND still finds a receive (without
// the repost, it would wait in RNR retries forever).

namespace {

struct RcReceipts {
    const RcTransport* transport = nullptr;
    int failed_whole = 0, failed_immediate = 0;
    std::vector<std::byte> whole; // the last successful whole receive's bytes
    int empty_sends = 0;          // successful zero-byte receives
    static void done(void* self, const WorkCompletion& wc) {
        auto& r = *static_cast<RcReceipts*>(self);
        const bool whole = (wc.wr_id() & RcTransport::whole_receive_bit) != 0;
        if (!wc.ok())
            ++(whole ? r.failed_whole : r.failed_immediate);
        else if (whole) {
            const auto bytes = r.transport->received(wc);
            r.whole.assign(bytes.begin(), bytes.end());
        }
        else if (wc.wr_id() == RcTransport::receive_id)
            ++r.empty_sends;
    }
};

// A fresh QP of `role` on the transport and a fresh peer QP (its own CQ) connected to it.
struct PeerLink {
    QueuePair ours;
    CompletionQueue cq;
    QueuePair peer; // destroyed before its CQ
    PeerLink(RcTransport& t, Context& context, ProtectionDomain& pd, RcRole role)
        : ours(must(t.create_qp(role, 4, 1, std::nullopt))), cq(must(CompletionQueue::create(context, {.depth = 8}))),
          peer(must(QueuePair::create(pd, {.type = QpType::rc, .send_cq = &cq, .recv_cq = &cq,
                                           .caps = {.max_send_wr = 4, .max_recv_wr = 1}}))) {
        must(ours.connect(peer.endpoint()));
        must(peer.connect(ours.endpoint()));
    }
};

// The peer of a new link SENDs `bytes` of `memory`.
void send_from_peer(std::deque<PeerLink>& links, RcTransport& t, Context& context, ProtectionDomain& pd, RcRole role,
                    const MemoryRegion& memory, std::size_t bytes) {
    QueuePair& peer = links.emplace_back(t, context, pd, role).peer;
    if (bytes == 0)
        must(post_send(peer, Gather(std::span<const LocalSlice>{})));
    else
        must(post_send(peer, memory.slice(0, bytes)));
}

} // namespace

// A sender whose port's MTU grew after the receiver was made (or any host that sends
// more than the receiver's MTU): its packets fail their receives. Soft-RoCE puts the
// receiver's QP in error for each; the transport sets it up again at once, with every
// buffer posted, or one such packet would leave the endpoint deaf to everyone.
TEST_CASE("UD transport: a packet longer than the ring's buffers fails its receive; a QP it breaks is set up again") {
    const std::string netdev = test::netdev_of(must(Context::open()));
    const test::LinkMtu link(netdev, 1500);
    asio::io_context io;
    Receiver receiver;
    auto b = must(UdTransport::create(io, {.ring = 16, .send_depth = 16}, &Receiver::deliver, &receiver));
    REQUIRE(b->mtu() == 1024);
    const std::uint32_t qpn = b->address().endpoint.qpn;
    link.set(4200); // rxe's port MTU becomes 4096, for transports made from now on
    auto a = must(UdTransport::create(io, {.ring = 16, .send_depth = 32}, &Receiver::ignore, nullptr));
    REQUIRE(a->mtu() == 4096);
    receiver.mtu = b->mtu();
    receiver.expected_qpn = a->address().endpoint.qpn;
    const AddressHandle to_b = must(a->handles().to(b->address()));
    const auto send = [&](std::span<const std::byte> bytes) {
        while (!must(a->send(to_b, b->address(), bytes.first(4), bytes.subspan(4))))
            io.run_for(1ms); // a send buffer back
    };
    // one at a time: each fails, and breaks the QP (Soft-RoCE), which is set up again
    // before the next (a packet that finds the QP broken is lost without a trace)
    const std::vector<std::byte> oversized(a->mtu(), std::byte{7});
    for (std::uint64_t i = 1; i <= 3; ++i) {
        send(oversized);
        CHECK(test::run_until(io, [&] { return b->failed_receives() >= i && b->recoveries() >= i; }, 30s));
    }
    CHECK(b->failed_receives() == 3);
    CHECK(b->recoveries() == 3);
    CHECK(b->address().endpoint.qpn == qpn);
    // then packets b's buffers hold, many times its 31 buffers: every one arrives
    constexpr std::uint32_t total = 200;
    receiver.seen.assign(total, 0);
    for (std::uint32_t n = 0; n < total; ++n) {
        send(packet(n, b->mtu()));
        if (n % 8 == 7) // paced: b's ring is small
            test::run_until(io, [&] { return std::count(receiver.seen.begin(), receiver.seen.end(), 1) > n - 4; }, 5s);
    }
    test::run_until(io, [&] { return std::count(receiver.seen.begin(), receiver.seen.end(), 1) == total; }, 30s);
    CHECK(std::count(receiver.seen.begin(), receiver.seen.end(), 1) == total);
    CHECK(receiver.wrong == 0);
    CHECK(a->failed_sends() == 0);
}

TEST_CASE("RC transport: receives a hostile peer's oversized SENDs fail are posted again; neither SRQ drains") {
    asio::io_context io;
    auto context = must(Context::open());
    auto pd = must(ProtectionDomain::create(context));
    auto memory = must(MemoryRegion::allocate(pd, 256, Access::local_write));
    for (std::size_t i = 0; i < 256; ++i)
        memory.bytes()[i] = static_cast<std::byte>(i);
    RcReceipts receipts;
    constexpr int immediates = RcTransport::receive_batch; // the fewest the transport takes
    auto transport = must(RcTransport::create(io, context, pd, {.depth = 64, .receives = immediates,
                                                                 .whole_receives = 2, .whole_bytes = 64},
                                              {}, &RcReceipts::done, &receipts));
    receipts.transport = transport.get();
    std::deque<PeerLink> links; // destroyed before the transport
    for (int n = 1; n <= 4; ++n) { // twice the whole requests' SRQ's size
        send_from_peer(links, *transport, context, pd, RcRole::server, memory, 65);
        REQUIRE(test::run_until(io, [&] { return receipts.failed_whole == n; }, 20s));
    }
    // one more than the immediates' SRQ holds: its receives go back together, once
    // receive_batch were taken
    for (int n = 1; n <= immediates + 1; ++n) {
        send_from_peer(links, *transport, context, pd, RcRole::client, memory, 1);
        REQUIRE(test::run_until(io, [&] { return receipts.failed_immediate == n; }, 20s));
    }
    send_from_peer(links, *transport, context, pd, RcRole::server, memory, 64);
    REQUIRE(test::run_until(io, [&] { return !receipts.whole.empty(); }, 20s));
    CHECK(std::equal(receipts.whole.begin(), receipts.whole.end(), memory.bytes().begin(), memory.bytes().begin() + 64));
    CHECK(receipts.whole.size() == 64);
    send_from_peer(links, *transport, context, pd, RcRole::client, memory, 0);
    REQUIRE(test::run_until(io, [&] { return receipts.empty_sends == 1; }, 20s));
}
