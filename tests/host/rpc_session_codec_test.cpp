// The session setup messages (lib/rpc/src/session_codec.hpp): both round-trip through
// their byte tables, every malformation is an Error of kind protocol that says what,
// the limits' bounds hold at both ends, a server that raises a limit is caught, and
// random corruption is never accepted unless it re-encodes the same.
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "../support/check.hpp"
#include "session_codec.hpp"

using namespace rdmaxx::rpc::detail;
using rdmaxx::Endpoint;
using rdmaxx::Mtu;
using rdmaxx::test::check_protocol_error;
using rdmaxx::test::must;

namespace {

Endpoint endpoint(std::uint32_t qpn, Mtu mtu) {
    Endpoint e;
    e.qpn = qpn;
    for (std::size_t i = 0; i < e.gid.bytes.size(); ++i)
        e.gid.bytes[i] = static_cast<std::uint8_t>(0xf0 + i);
    e.lid = 0x1234;
    e.mtu = mtu;
    return e;
}

const SessionRequest request{.client = {.endpoint = endpoint(0xabcdef, Mtu::b4096), .qkey = 0x11111111},
                             .session = {.number = 0x0102, .generation = 0x03040506},
                             .limits = {.window = 8,
                                        .credits = 32,
                                        .max_request = 1 << 20,
                                        .max_response = 2 << 20,
                                        .payload_per_packet = 4096 - 32}};

const SessionReply accepted{.refusal = {},
                            .server = {.endpoint = endpoint(0x123456, Mtu::b1024), .qkey = 0x22222222},
                            .session = {.number = 7, .generation = 1},
                            .limits = {.window = 4,
                                       .credits = 16,
                                       .max_request = 1 << 20,
                                       .max_response = 1 << 19,
                                       .payload_per_packet = 1024 - 32}};

using Bytes = std::vector<std::byte>;

template <std::size_t N>
Bytes bytes_of(const std::array<std::byte, N>& array) {
    return {array.begin(), array.end()};
}

Bytes with_byte(Bytes bytes, std::size_t offset, std::uint8_t value) {
    bytes[offset] = std::byte{value};
    return bytes;
}

// The big-endian `value` written over bytes[offset, offset + size).
Bytes with_field(Bytes bytes, std::size_t offset, std::uint64_t value, std::size_t size) {
    for (std::size_t i = size; i-- > 0; value >>= 8)
        bytes[offset + i] = static_cast<std::byte>(value & 0xff);
    return bytes;
}

SessionRequest with_limits(SessionLimits limits, Mtu mtu = Mtu::b4096) {
    SessionRequest r = request;
    r.client.endpoint.mtu = mtu;
    r.limits = limits;
    return r;
}

} // namespace

TEST_CASE("rpc session codec: a request and a reply round-trip through their byte tables") {
    const auto request_bytes = encode(request);
    CHECK(must(decode_request(request_bytes)) == request);
    const std::vector<std::uint8_t> expected = {
        'R',  'X',  'S',  'Q',  0,    1,    0,    64,                         // prefix
        0,    0xab, 0xcd, 0xef, 0x11, 0x11, 0x11, 0x11,                       // QPN, qkey
        0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xfb, // GID
        0xfc, 0xfd, 0xfe, 0xff, 0x12, 0x34, 5,    0,                          // LID, MTU
        0x01, 0x02, 0,    0,    0x03, 0x04, 0x05, 0x06,                       // SessionId
        0,    0,    0,    8,    0,    0,    0,    32,                         // W, C
        0,    0x10, 0,    0,    0,    0x20, 0,    0,    0,    0,    0x0f, 0xe0, // sizes, payload
    };
    REQUIRE(expected.size() == session_request_bytes);
    for (std::size_t i = 0; i < session_request_bytes; ++i) {
        INFO("offset ", i);
        CHECK(static_cast<std::uint8_t>(request_bytes[i]) == expected[i]);
    }

    const auto reply_bytes = encode(accepted);
    CHECK(must(decode_reply(reply_bytes)) == accepted);
    CHECK(static_cast<std::uint8_t>(reply_bytes[3]) == 'R');
    CHECK(static_cast<std::uint8_t>(reply_bytes[7]) == 68);
    CHECK(static_cast<std::uint8_t>(reply_bytes[8]) == 0); // accepted
    // the terms sit 4 bytes later than in a request, in the same layout
    const auto same_layout = encode(SessionRequest{accepted.server, accepted.session, accepted.limits});
    CHECK(std::equal(reply_bytes.begin() + 12, reply_bytes.end(), same_layout.begin() + 8));

    for (int r = 1; r <= 5; ++r) {
        const auto refusal = static_cast<Refusal>(r);
        INFO(to_string(refusal));
        // the other fields are not sent
        SessionReply refused = accepted;
        refused.refusal = refusal;
        const auto bytes = encode(refused);
        CHECK(static_cast<std::uint8_t>(bytes[8]) == r);
        CHECK(std::all_of(bytes.begin() + 9, bytes.end(), [](std::byte b) { return b == std::byte{0}; }));
        CHECK(must(decode_reply(bytes)) == SessionReply::refused(refusal));
    }
}

TEST_CASE("rpc session codec: the prefix says how much to read, whatever the version") {
    const auto bytes = encode(request);
    const auto prefix = must(decode_request_prefix(std::span(bytes).first<session_prefix_bytes>()));
    CHECK(prefix.version == 1);
    CHECK(prefix.length == session_request_bytes);
    const auto reply = encode(accepted);
    CHECK(must(decode_reply_prefix(std::span(reply).first<session_prefix_bytes>())).length == session_reply_bytes);

    // a later version, longer: its prefix reads; the message does not decode, and says why
    auto v2 = with_field(with_field(bytes_of(bytes), 4, 2, 2), 6, 100, 2);
    v2.resize(100);
    const auto v2_prefix = must(decode_request_prefix(std::span(v2).first<session_prefix_bytes>()));
    CHECK(v2_prefix.version == 2);
    CHECK(v2_prefix.length == 100);
    check_protocol_error(decode_request(v2), "version 2 is newer than this build's 1");

    const auto prefix_of = [](const Bytes& b) { return std::span(b).first<session_prefix_bytes>(); };
    check_protocol_error(decode_request_prefix(prefix_of(bytes_of(reply))), "not an rdmaxx session request");
    check_protocol_error(decode_reply_prefix(prefix_of(bytes_of(bytes))), "not an rdmaxx session reply");
    check_protocol_error(decode_request_prefix(prefix_of(with_field(bytes_of(bytes), 6, 7, 2))), "length 7");
    check_protocol_error(decode_request_prefix(prefix_of(with_field(bytes_of(bytes), 6, 1025, 2))), "length 1025");
    CHECK(must(decode_request_prefix(prefix_of(with_field(bytes_of(bytes), 6, 1024, 2)))).length == 1024);
    CHECK(must(decode_request_prefix(prefix_of(with_field(bytes_of(bytes), 6, 8, 2)))).length == 8);
}

TEST_CASE("rpc session codec: each malformed request is an Error that says what") {
    const Bytes good = bytes_of(encode(request));
    check_protocol_error(decode_request({}), "0 bytes: shorter than the 8-byte prefix");
    check_protocol_error(decode_request(std::span(good).first(7)), "shorter than the 8-byte prefix");
    check_protocol_error(decode_request(std::span(good).first(63)), "63 bytes, length 64");
    Bytes longer = good;
    longer.push_back(std::byte{0});
    check_protocol_error(decode_request(longer), "65 bytes, length 64");
    check_protocol_error(decode_request(with_field(good, 6, 65, 2)), "64 bytes, length 65");
    check_protocol_error(decode_request(with_byte(good, 0, 'S')), "wrong magic");
    check_protocol_error(decode_request(encode(accepted)), "not an rdmaxx session request");
    check_protocol_error(decode_request(with_field(good, 4, 0, 2)), "version 0 is not supported");
    check_protocol_error(decode_request(with_field(good, 4, 0xffff, 2)), "version 65535 is newer");
    for (const std::size_t offset : {35, 38, 39})
        check_protocol_error(decode_request(with_byte(good, offset, 1)), "reserved field is not 0");
    check_protocol_error(decode_request(with_byte(good, 8, 1)), "QPN 0x1abcdef wider than 24 bits");
    check_protocol_error(decode_request(with_byte(good, 34, 0)), "MTU code 0 is not an MTU");
    check_protocol_error(decode_request(with_byte(good, 34, 6)), "MTU code 6 is not an MTU");
    check_protocol_error(decode_request(with_field(good, 40, 0, 4)), "generation 0");
    check_protocol_error(decode_request(with_field(good, 44, 0, 4)), "window 0 outside 1..1024");
    check_protocol_error(decode_request(with_field(good, 44, 1025, 4)), "window 1025 outside 1..1024");
    check_protocol_error(decode_request(with_field(good, 48, 0, 4)), "credits 0 outside 1..4096");
    check_protocol_error(decode_request(with_field(good, 48, 4097, 4)), "credits 4097 outside 1..4096");
    check_protocol_error(decode_request(with_field(good, 52, 0xffffffff, 4)), "largest request 4294967295");
    check_protocol_error(decode_request(with_field(good, 56, 1u << 30, 4)), "response 1073741824 above");
    check_protocol_error(decode_request(with_field(good, 60, 1000, 4)), "payload per packet 1000 is no MTU");
    check_protocol_error(decode_request(with_field(good, 60, 0, 4)), "payload per packet 0 is no MTU");
    check_protocol_error(decode_request(with_field(good, 60, 4096, 4)), "payload per packet 4096 is no MTU");
    // a payload its own port cannot carry
    check_protocol_error(decode_request(with_byte(good, 34, 4)), "payload per packet 4064 above its MTU 2048");
}

TEST_CASE("rpc session codec: each malformed reply is an Error that says what") {
    const Bytes good = bytes_of(encode(accepted));
    check_protocol_error(decode_reply(std::span(good).first(67)), "67 bytes, length 68");
    check_protocol_error(decode_reply(encode(request)), "not an rdmaxx session reply");
    check_protocol_error(decode_reply(with_field(good, 4, 2, 2)), "version 2 is newer than this build's 1");
    check_protocol_error(decode_reply(with_byte(good, 8, 6)), "status 6 is unknown");
    check_protocol_error(decode_reply(with_byte(good, 8, 0xff)), "status 255 is unknown");
    for (const std::size_t offset : {10, 11, 39, 42, 43})
        check_protocol_error(decode_reply(with_byte(good, offset, 1)), "reserved field is not 0");
    check_protocol_error(decode_reply(with_byte(good, 9, 2)), "reserved field is not 0"); // flags but "both ways"
    check_protocol_error(decode_reply(with_field(good, 44, 0, 4)), "generation 0");
    check_protocol_error(decode_reply(with_field(good, 48, 0, 4)), "window 0");
    check_protocol_error(decode_reply(with_byte(good, 38, 9)), "MTU code 9");
    // the server's port (MTU 1024) cannot carry 2016 bytes a packet
    check_protocol_error(decode_reply(with_field(good, 64, 2016, 4)), "payload per packet 2016 above its MTU 1024");
    // a refusal carries nothing else
    const Bytes refused = bytes_of(encode(SessionReply::refused(Refusal::ring_full)));
    for (std::size_t offset = 12; offset < session_reply_bytes; ++offset)
        check_protocol_error(decode_reply(with_byte(refused, offset, 1)), "a refusal with more than its status");
    check_protocol_error(decode_reply(with_byte(refused, 9, 1)), "a refusal with more than its status");
}

TEST_CASE("rpc session codec: a both-ways reply says so in its flags byte") {
    SessionReply both = accepted;
    both.both_ways = true;
    const auto bytes = encode(both);
    CHECK(static_cast<std::uint8_t>(bytes[9]) == 1);
    CHECK(must(decode_reply(bytes)) == both);
    CHECK(static_cast<std::uint8_t>(encode(accepted)[9]) == 0);
    SessionReply refused = SessionReply::refused(Refusal::too_many_sessions);
    refused.both_ways = true; // a refusal says nothing else
    CHECK(static_cast<std::uint8_t>(encode(refused)[9]) == 0);
}

TEST_CASE("rpc session codec: the limits at their bounds") {
    const SessionLimits base = request.limits;
    const auto decodes = [](const SessionRequest& r) { return decode_request(encode(r)).has_value(); };
    for (const std::uint32_t window : {1u, max_window}) {
        SessionLimits l = base;
        l.window = window;
        CHECK(decodes(with_limits(l)));
    }
    for (const std::uint32_t credits : {1u, max_credits}) {
        SessionLimits l = base;
        l.credits = credits;
        CHECK(decodes(with_limits(l)));
    }
    struct Case {
        Mtu mtu;
        std::uint32_t payload, largest;
    };
    for (const Case c : {Case{Mtu::b256, 224, 14'680'064}, Case{Mtu::b512, 480, 31'457'280},
                         Case{Mtu::b1024, 992, 65'011'712}, Case{Mtu::b2048, 2016, 132'120'576},
                         Case{Mtu::b4096, 4064, 266'338'304}}) {
        INFO("payload ", c.payload);
        SessionLimits l{.window = 1, .credits = 1, .max_request = 0, .max_response = c.largest,
                        .payload_per_packet = c.payload};
        CHECK(decodes(with_limits(l, c.mtu)));
        CHECK(check_limits(l).has_value());
        l.max_request = c.largest;
        CHECK(decodes(with_limits(l, c.mtu)));
        l.max_request = c.largest + 1;
        CHECK_FALSE(decodes(with_limits(l, c.mtu)));
        check_protocol_error(check_limits(l), "above");
        l.max_request = c.largest;
        l.max_response = c.largest + 1;
        CHECK_FALSE(decodes(with_limits(l, c.mtu)));
        // smaller packets than the port allows are allowed; larger are not
        l.max_response = 0;
        CHECK(decodes(with_limits(l, Mtu::b4096)));
        if (c.mtu != Mtu::b256)
            CHECK_FALSE(decodes(with_limits(l, static_cast<Mtu>(static_cast<int>(c.mtu) - 1))));
    }
}

TEST_CASE("rpc session codec: check_reply catches a server that raised a limit") {
    // a server whose port has the client's MTU
    const SessionReply reply{.refusal = {},
                             .server = {.endpoint = endpoint(0x123456, Mtu::b4096), .qkey = 2},
                             .session = accepted.session,
                             .limits = request.limits};
    CHECK(check_reply(request, reply).has_value()); // all as asked
    CHECK(check_reply(request, accepted).has_value()); // each lowered or equal
    struct Raise {
        std::uint32_t SessionLimits::*field;
        const char* says;
    };
    for (const Raise r : {Raise{&SessionLimits::window, "raised the window from 8 to 9"},
                          Raise{&SessionLimits::credits, "raised the credits from 32 to 33"},
                          Raise{&SessionLimits::max_request, "raised the largest request from 1048576 to 1048577"},
                          Raise{&SessionLimits::max_response, "raised the largest response"},
                          Raise{&SessionLimits::payload_per_packet, "raised the payload per packet"}}) {
        SessionReply raised = reply;
        raised.limits.*r.field += 1;
        check_protocol_error(check_reply(request, raised), r.says);
    }
    // a decoded reply of a hostile server: window 1024 for 8 asked
    auto hostile = bytes_of(encode(reply));
    hostile = with_field(hostile, 48, max_window, 4);
    check_protocol_error(check_reply(request, must(decode_reply(hostile))), "raised the window from 8 to 1024");
    // a refusal raises nothing
    CHECK(check_reply(request, SessionReply::refused(Refusal::shutting_down)).has_value());
}

TEST_CASE("rpc session codec: 20,000 random corruptions: nothing accepted that does not re-encode the same") {
    std::mt19937 random(11);
    const std::vector<Bytes> seeds = {bytes_of(encode(request)), bytes_of(encode(accepted)),
                                      bytes_of(encode(SessionReply::refused(Refusal::too_many_sessions)))};
    int accepted_count = 0;
    for (int i = 0; i < 20'000; ++i) {
        Bytes bytes = seeds[random() % seeds.size()];
        for (int flips = 1 + static_cast<int>(random() % 3); flips > 0; --flips)
            bytes[random() % bytes.size()] = static_cast<std::byte>(random());
        if (random() % 8 == 0)
            bytes.resize(random() % (bytes.size() + 2));
        if (const auto r = decode_request(bytes)) {
            ++accepted_count;
            CHECK(bytes_of(encode(*r)) == bytes);
        }
        if (const auto r = decode_reply(bytes)) {
            ++accepted_count;
            CHECK(bytes_of(encode(*r)) == bytes);
        }
    }
    CHECK(accepted_count > 0);
}

TEST_CASE("rpc session codec: every refusal has a name") {
    for (int r = 1; r <= static_cast<int>(Refusal::shutting_down); ++r)
        CHECK(to_string(static_cast<Refusal>(r)) != "unknown");
}
