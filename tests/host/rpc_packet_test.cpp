// The RPC packet header (lib/rpc/src/packet.hpp): every kind round-trips, every
// malformed packet is dropped with its reason, message sizes at the packet boundaries
// split as the table says, random corruption is never accepted unless it re-encodes the same.
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "../support/check.hpp"
#include "packet.hpp"

using namespace rdmaxx::rpc::detail;

namespace {

constexpr std::uint32_t mtu = 1024;
const PacketLimits limits(100'000, mtu - header_bytes);

// The header encoded, then `payload` bytes of a pattern.
std::vector<std::byte> packet(const PacketHeader& header, std::size_t payload) {
    std::vector<std::byte> bytes(header_bytes + payload);
    encode(header, std::span(bytes).first<header_bytes>());
    for (std::size_t i = 0; i < payload; ++i)
        bytes[header_bytes + i] = static_cast<std::byte>(i * 7);
    return bytes;
}

// A packet that decodes: `header` with the payload its kind, size and index require.
std::vector<std::byte> valid(const PacketHeader& header, const PacketLimits& with = limits) {
    const bool carries = header.kind == Kind::request || header.kind == Kind::response;
    return packet(header, carries ? payload_bytes(header.message_size, header.index, with.payload_per_packet()) : 0);
}

const PacketHeader request{.kind = Kind::request,
                           .rpc_type = 42,
                           .status = Status::ok,
                           .session = 0xbeef,
                           .generation = 0xdeadbeef,
                           .message_size = 3000, // 4 packets of 992
                           .request = 0x0123456789abcdef,
                           .index = 3};

// `request` with another kind, index, status or message size.
PacketHeader like_request(Kind kind, std::uint16_t index, Status status = Status::ok,
                          std::uint32_t size = request.message_size) {
    PacketHeader h = request;
    h.kind = kind;
    h.index = index;
    h.status = status;
    h.message_size = size;
    return h;
}

const PacketHeader reset{.kind = Kind::reset, .rpc_type = 0, .status = Status::server_busy, .session = 1,
                         .generation = 2, .message_size = 0, .request = 9, .index = 0};

std::vector<PacketHeader> one_of_each_kind() {
    return {request,
            like_request(Kind::response, 1),
            like_request(Kind::response, 0, Status::handler_dropped, 0),
            like_request(Kind::response, 0, Status::transfer_failed, 0),
            like_request(Kind::credit_return, 2),
            like_request(Kind::request_for_response, 1),
            like_request(Kind::in_progress, 3), // the last of 4 request packets
            reset};
}

// `h` as a descriptor (the rdma flag).
PacketHeader by_rdma(PacketHeader h) {
    h.rdma = true;
    return h;
}

DropReason dropped(std::span<const std::byte> bytes, const PacketLimits& with = limits) {
    const auto header = decode(bytes, with);
    REQUIRE_FALSE(header.has_value());
    return header.error();
}

} // namespace

TEST_CASE("rpc packet: every kind round-trips through its 32 big-endian bytes") {
    for (const PacketHeader& h : one_of_each_kind()) {
        INFO("kind ", static_cast<int>(h.kind));
        const auto bytes = valid(h);
        const auto got = decode(bytes, limits);
        REQUIRE(got.has_value());
        CHECK(*got == h);
    }
    PacketHeader out_of_step = reset; // a server's word that the client's numbers ran a window ahead
    out_of_step.status = Status::out_of_step;
    out_of_step.request = 0x123456789;
    const auto step = decode(valid(out_of_step), limits);
    REQUIRE(step.has_value());
    CHECK(*step == out_of_step);
    for (const PacketHeader& h : {by_rdma(request), by_rdma(like_request(Kind::response, 0))}) {
        const auto got = decode(valid(h), limits);
        REQUIRE(got.has_value());
        CHECK(*got == h);
        CHECK(static_cast<std::uint8_t>(valid(h)[26]) == 1);
    }
    const auto bytes = packet(request, 0);
    const std::vector<std::uint8_t> expected = {0x52, 0x58, 1,    1,    42,   0,    0xbe, 0xef, 0xde, 0xad, 0xbe,
                                                0xef, 0,    0,    0x0b, 0xb8, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
                                                0xcd, 0xef, 0,    3,    0,    0,    0,    0,    0,    0};
    for (std::size_t i = 0; i < header_bytes; ++i)
        CHECK(static_cast<std::uint8_t>(bytes[i]) == expected[i]);
}

TEST_CASE("rpc packet: each malformed packet is dropped with its reason") {
    const auto good = valid(request);
    CHECK(dropped(std::span(good).first(header_bytes - 1)) == DropReason::too_short);
    CHECK(dropped({}) == DropReason::too_short);
    const auto with_byte = [&](std::size_t offset, std::uint8_t value) {
        auto copy = good;
        copy[offset] = std::byte{value};
        return copy;
    };
    CHECK(dropped(with_byte(0, 0x53)) == DropReason::bad_magic);
    CHECK(dropped(with_byte(2, 2)) == DropReason::bad_version);
    CHECK(dropped(with_byte(3, 0)) == DropReason::bad_kind);
    CHECK(dropped(with_byte(3, 7)) == DropReason::bad_kind);
    CHECK(dropped(with_byte(5, 1)) == DropReason::bad_status); // a request carries none
    for (std::size_t offset = 26; offset < header_bytes; ++offset)
        CHECK(dropped(with_byte(offset, 0x80)) == DropReason::reserved_set);
    CHECK(dropped(with_byte(26, 2)) == DropReason::reserved_set); // whole, without rdma
    CHECK(dropped(with_byte(26, 4)) == DropReason::reserved_set); // probe, without whole
    CHECK(dropped(with_byte(26, 8)) == DropReason::reserved_set); // flags other than rdma, whole and probe
    // the rdma flag: a request's or an ok response's only
    CHECK(dropped(valid(by_rdma(like_request(Kind::credit_return, 2)))) == DropReason::reserved_set);
    CHECK(dropped(valid(by_rdma(like_request(Kind::request_for_response, 1)))) == DropReason::reserved_set);
    CHECK(dropped(valid(by_rdma(like_request(Kind::response, 0, Status::no_handler, 0)))) == DropReason::reserved_set);
    CHECK(dropped(valid(by_rdma(reset))) == DropReason::reserved_set);

    PacketHeader h = like_request(Kind::response, 0, Status::session_unknown); // a reset's status
    CHECK(dropped(valid(h)) == DropReason::bad_status);
    h.status = static_cast<Status>(7);
    CHECK(dropped(valid(h)) == DropReason::bad_status);
    h = reset;
    h.status = Status::ok;
    CHECK(dropped(valid(h)) == DropReason::bad_status);
    h.status = static_cast<Status>(8); // past the last
    CHECK(dropped(valid(h)) == DropReason::bad_status);
    h.status = Status::no_handler; // a response's status
    CHECK(dropped(valid(h)) == DropReason::bad_status);

    h = request;
    h.message_size = limits.max_message() + 1;
    CHECK(dropped(packet(h, 0)) == DropReason::too_large);

    CHECK(dropped(packet(like_request(Kind::request, 4), 0)) == DropReason::bad_index); // 3000 bytes: packets 0..3
    // the last request packet is answered by the response, not a credit_return
    CHECK(dropped(valid(like_request(Kind::credit_return, 3))) == DropReason::bad_index);
    // response packet 0 comes unasked
    CHECK(dropped(valid(like_request(Kind::request_for_response, 0))) == DropReason::bad_index);
    CHECK(dropped(valid(like_request(Kind::request_for_response, 4))) == DropReason::bad_index);
    // in_progress answers the last request packet only
    CHECK(dropped(valid(like_request(Kind::in_progress, 2))) == DropReason::bad_index);
    CHECK(dropped(packet(like_request(Kind::in_progress, 3), 1)) == DropReason::bad_length);
    h = reset;
    h.index = 1;
    CHECK(dropped(valid(h)) == DropReason::bad_index);

    CHECK(dropped(packet(request, 3000 - 3 * 992 + 1)) == DropReason::bad_length);
    CHECK(dropped(packet(request, 3000 - 3 * 992 - 1)) == DropReason::bad_length);
    CHECK(dropped(packet(like_request(Kind::request, 0), 991)) == DropReason::bad_length);
    // a refusal carries an empty message
    CHECK(dropped(valid(like_request(Kind::response, 0, Status::no_handler))) == DropReason::bad_length);
    CHECK(dropped(packet(like_request(Kind::credit_return, 0), 1)) == DropReason::bad_length);
    CHECK(dropped(packet(like_request(Kind::request_for_response, 1), 1)) == DropReason::bad_length);
    CHECK(dropped(packet(reset, 1)) == DropReason::bad_length);
    h = reset;
    h.message_size = 10;
    CHECK(dropped(packet(h, 0)) == DropReason::bad_length);
}

TEST_CASE("rpc packet: message sizes at the packet boundaries") {
    const std::uint32_t per = limits.payload_per_packet();
    struct Case {
        std::uint32_t size, packets, last;
    };
    for (const Case c : {Case{0, 1, 0}, Case{1, 1, 1}, Case{per, 1, per}, Case{per + 1, 2, 1},
                         Case{2 * per, 2, per}, Case{limits.max_message(), 101, 100'000 - 100 * per}}) {
        INFO("size ", c.size);
        CHECK(packet_count(c.size, per) == c.packets);
        CHECK(payload_bytes(c.size, c.packets - 1, per) == c.last);
        CHECK(payload_bytes(c.size, c.packets, per) == 0);
        for (std::uint32_t i = 0; i < c.packets; ++i) {
            PacketHeader h = request;
            h.message_size = c.size;
            h.index = static_cast<std::uint16_t>(i);
            CHECK(payload_bytes(c.size, i, per) == (i + 1 < c.packets ? per : c.last));
            CHECK(decode(valid(h), limits).has_value());
        }
    }
    // a 0-byte message is one empty packet
    CHECK(decode(packet(like_request(Kind::request, 0, Status::ok, 0), 0), limits).has_value());
    CHECK(dropped(packet(like_request(Kind::request, 1, Status::ok, 0), 0)) == DropReason::bad_index);
    CHECK(dropped(packet(like_request(Kind::request, 0, Status::ok, limits.max_message() + 1), per)) ==
          DropReason::too_large);
}

TEST_CASE("rpc packet: payload per packet for MTU 256, 1024 and 4096") {
    struct Case {
        std::uint32_t mtu, per, packets_of_10000;
    };
    for (const Case c : {Case{256, 224, 45}, Case{1024, 992, 11}, Case{4096, 4064, 3}}) {
        INFO("MTU ", c.mtu);
        const PacketLimits at(1 << 20, c.mtu - header_bytes);
        CHECK(at.payload_per_packet() == c.per);
        CHECK(packet_count(10'000, c.per) == c.packets_of_10000);
        PacketHeader h = request;
        h.message_size = 10'000;
        for (std::uint32_t i = 0; i < c.packets_of_10000; ++i) {
            h.index = static_cast<std::uint16_t>(i);
            const auto bytes = valid(h, at);
            CHECK(bytes.size() <= c.mtu); // a full packet fills the MTU, no more
            CHECK(decode(bytes, at).has_value());
        }
        h.index = static_cast<std::uint16_t>(c.packets_of_10000);
        CHECK(dropped(packet(h, 0), at) == DropReason::bad_index);
    }
}

TEST_CASE("rpc packet: 20,000 random corruptions: nothing accepted that does not re-encode the same") {
    std::mt19937 random(7);
    const auto kinds = one_of_each_kind();
    int accepted = 0;
    for (int i = 0; i < 20'000; ++i) {
        auto bytes = valid(kinds[random() % kinds.size()]);
        for (int flips = 1 + static_cast<int>(random() % 3); flips > 0; --flips)
            bytes[random() % std::min<std::size_t>(bytes.size(), header_bytes + 4)] = static_cast<std::byte>(random());
        if (random() % 4 == 0)
            bytes.resize(random() % (bytes.size() + 1));
        const auto got = decode(bytes, limits);
        if (!got)
            continue;
        ++accepted;
        std::array<std::byte, header_bytes> again{};
        encode(*got, again);
        CHECK(std::equal(again.begin(), again.end(), bytes.begin()));
    }
    CHECK(accepted > 0);
}

TEST_CASE("rpc packet: limits no index can number are a programming error") {
    RDMAXX_CHECK_DEATH((void)PacketLimits(100, 0), "0 bytes of payload per packet");
    RDMAXX_CHECK_DEATH((void)PacketLimits(65'537, 1), "more than 65536 packets");
    (void)PacketLimits(65'536, 1);
}

TEST_CASE("rpc packet: every drop reason has a name") {
    for (int r = 0; r <= static_cast<int>(DropReason::handler_running); ++r)
        CHECK(to_string(static_cast<DropReason>(r)) != "unknown");
}

TEST_CASE("rpc packet: a whole request is one packet of its whole message, within whole_max, and only a "
          "descriptor request or its in_progress carries the flag") {
    const PacketLimits whole_limits(100'000, mtu - header_bytes, 16'424);
    PacketHeader whole = by_rdma(like_request(Kind::request, 0, Status::ok, 5000)); // 6 UD packets' worth
    whole.whole = true;
    const auto bytes = packet(whole, 5000);
    const auto got = decode(bytes, whole_limits);
    REQUIRE(got.has_value());
    CHECK(*got == whole);
    CHECK(static_cast<std::uint8_t>(bytes[26]) == 3); // rdma and whole
    CHECK(packets_of(5000, true, 992) == 1);
    CHECK(payload_bytes(5000, 0, 992, true) == 5000);
    CHECK(payload_bytes(5000, 1, 992, true) == 0);

    CHECK(dropped(bytes, limits) == DropReason::too_large); // an endpoint that takes none (whole_max 0)
    CHECK(dropped(packet(whole, 4999), whole_limits) == DropReason::bad_length);
    CHECK(dropped(packet(whole, 992), whole_limits) == DropReason::bad_length); // a UD packet's share
    whole.message_size = 16'425;
    CHECK(dropped(packet(whole, 16'425), whole_limits) == DropReason::too_large);
    whole.message_size = 5000;
    whole.index = 1;
    CHECK(dropped(packet(whole, 0), whole_limits) == DropReason::bad_index);

    // the in_progress about it names packet 0 of 1
    PacketHeader progress = like_request(Kind::in_progress, 0, Status::ok, 5000);
    progress.whole = true;
    const auto answered = decode(packet(progress, 0), whole_limits);
    REQUIRE(answered.has_value());
    CHECK(*answered == progress);
    progress.index = 5; // the last of 6 UD packets: not a whole request's
    CHECK(dropped(packet(progress, 0), whole_limits) == DropReason::bad_index);

    // no other kind carries it
    for (PacketHeader h : {like_request(Kind::credit_return, 0), like_request(Kind::request_for_response, 1),
                           like_request(Kind::response, 0), by_rdma(like_request(Kind::response, 0)), reset}) {
        h.whole = true;
        CHECK(dropped(valid(h, whole_limits), whole_limits) == DropReason::reserved_set);
    }
}

TEST_CASE("rpc packet: a probe is a whole request's header alone; no other packet carries the flag") {
    const PacketLimits whole_limits(100'000, mtu - header_bytes, 16'424);
    PacketHeader probe = by_rdma(like_request(Kind::request, 0, Status::ok, 5000));
    probe.whole = true;
    probe.probe = true;
    const auto bytes = packet(probe, 0);
    const auto got = decode(bytes, whole_limits);
    REQUIRE(got.has_value());
    CHECK(*got == probe);
    CHECK(static_cast<std::uint8_t>(bytes[26]) == 7); // rdma, whole and probe
    CHECK(dropped(packet(probe, 5000), whole_limits) == DropReason::bad_length); // the request with it
    CHECK(dropped(packet(probe, 1), whole_limits) == DropReason::bad_length);

    PacketHeader in_packets = by_rdma(like_request(Kind::request, 0, Status::ok, 500)); // not whole
    in_packets.probe = true;
    CHECK(dropped(packet(in_packets, 0), whole_limits) == DropReason::reserved_set);
    PacketHeader progress = like_request(Kind::in_progress, 0, Status::ok, 5000);
    progress.whole = true;
    progress.probe = true;
    CHECK(dropped(packet(progress, 0), whole_limits) == DropReason::reserved_set);
}
