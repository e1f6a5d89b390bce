// The RC path's wire formats (lib/rpc/src/rc_codec.hpp): the setup messages round-trip
// through their byte table and every malformation is a protocol Error; request and
// response descriptors round-trip, and a descriptor that names more than the session
// allows, or both memory and inline bytes, is refused; random corruption of a setup
// message is never accepted unless it re-encodes the same.
#include <algorithm>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "../support/check.hpp"
#include "rc_codec.hpp"

using namespace rdmaxx::rpc::detail;
using rdmaxx::Mtu;
using rdmaxx::RemoteMemory;
using rdmaxx::test::check_protocol_error;
using rdmaxx::test::must;

namespace {

rdmaxx::Endpoint qp_endpoint() {
    rdmaxx::Endpoint e;
    e.qpn = 0xabcdef;
    e.psn = 0x123456;
    for (std::size_t i = 0; i < e.gid.bytes.size(); ++i)
        e.gid.bytes[i] = static_cast<std::uint8_t>(0xa0 + i);
    e.lid = 0x0102;
    e.mtu = Mtu::b1024;
    return e;
}

const RcMessage offer{.kind = RcMessage::Kind::offer, .available = true, .qp = qp_endpoint()};
const RcMessage unavailable{.kind = RcMessage::Kind::answer, .available = false, .qp = {}};
const RcMessage whole_answer{.kind = RcMessage::Kind::answer,
                             .available = true,
                             .qp = qp_endpoint(),
                             .whole_max = 0x4028,
                             .whole_receives = 8};

std::vector<std::byte> bytes_of(const RcMessage& m) {
    const auto a = encode(m);
    return {a.begin(), a.end()};
}

} // namespace

TEST_CASE("rpc rc codec: the setup messages, the goodbye and the still-here round-trip through their 40 bytes") {
    for (const RcMessage& m : {offer, RcMessage{.kind = RcMessage::Kind::answer, .available = true, .qp = qp_endpoint()},
                               whole_answer, unavailable,
                               RcMessage{.kind = RcMessage::Kind::goodbye, .available = false, .qp = {}},
                               RcMessage{.kind = RcMessage::Kind::still_here, .available = false, .qp = {}}}) {
        const auto bytes = bytes_of(m);
        CHECK(must(decode_rc_prefix(std::span(bytes).first<rc_prefix_bytes>())) == rc_message_bytes);
        CHECK(must(decode_rc(bytes)) == m);
    }
    const auto bytes = bytes_of(offer);
    const std::vector<std::uint8_t> head = {'R', 'X', 'R', 'C', 0, 4, 0, 40, 1, 0, 0, 0,
                                            0,   0xab, 0xcd, 0xef, 0, 0x12, 0x34, 0x56};
    for (std::size_t i = 0; i < head.size(); ++i)
        CHECK(static_cast<std::uint8_t>(bytes[i]) == head[i]);
    CHECK(static_cast<std::uint8_t>(bytes[38]) == 3); // IBV_MTU_1024
    CHECK(static_cast<std::uint8_t>(bytes[39]) == 0);
    const auto answer = bytes_of(whole_answer);
    CHECK(static_cast<std::uint8_t>(answer[8]) == 2);
    CHECK(static_cast<std::uint8_t>(answer[10]) == 0x40); // whole max, big-endian
    CHECK(static_cast<std::uint8_t>(answer[11]) == 0x28);
    CHECK(static_cast<std::uint8_t>(answer[39]) == 8); // whole receives
    const auto still_here = bytes_of(RcMessage{.kind = RcMessage::Kind::still_here, .available = false, .qp = {}});
    CHECK(static_cast<std::uint8_t>(still_here[8]) == 4);
    CHECK(std::all_of(still_here.begin() + 9, still_here.end(), [](std::byte b) { return b == std::byte{0}; }));
}

TEST_CASE("rpc rc codec: each malformed setup message is a protocol Error that says what") {
    const auto good = bytes_of(offer);
    const auto with_byte = [&](std::size_t offset, std::uint8_t value) {
        auto copy = good;
        copy[offset] = std::byte{value};
        return copy;
    };
    check_protocol_error(decode_rc(with_byte(0, 'Q')), "wrong magic");
    check_protocol_error(decode_rc(with_byte(5, 1)), "version 1"); // before responses came by WRITE_WITH_IMM
    check_protocol_error(decode_rc(with_byte(5, 2)), "version 2"); // before whole requests
    check_protocol_error(decode_rc(with_byte(5, 3)), "version 3"); // before the still-here
    check_protocol_error(decode_rc(with_byte(5, 5)), "version 5");
    check_protocol_error(decode_rc(with_byte(7, 41)), "length 41");
    check_protocol_error(decode_rc(with_byte(8, 0)), "kind 0 is unknown");
    check_protocol_error(decode_rc(with_byte(8, 5)), "kind 5 is unknown");
    check_protocol_error(decode_rc(with_byte(8, 3)), "a goodbye with more than its kind"); // an offer's QP
    check_protocol_error(decode_rc(with_byte(8, 4)), "a still-here with more than its kind");
    check_protocol_error(decode_rc(with_byte(9, 1)), "status 1 for kind 1"); // an offer is never unavailable
    // whole requests are the server's to offer, in an available answer, both fields or neither
    check_protocol_error(decode_rc(with_byte(10, 1)), "whole requests offered by other than an available answer");
    check_protocol_error(decode_rc(with_byte(39, 1)), "whole requests offered by other than an available answer");
    auto answer_bytes = bytes_of(whole_answer);
    answer_bytes[39] = std::byte{0};
    check_protocol_error(decode_rc(answer_bytes), "whole requests of up to 16424 bytes, 0 at once");
    answer_bytes = bytes_of(whole_answer);
    answer_bytes[10] = answer_bytes[11] = std::byte{0};
    check_protocol_error(decode_rc(answer_bytes), "whole requests of up to 0 bytes, 8 at once");
    auto unavailable_bytes = bytes_of(unavailable);
    unavailable_bytes[39] = std::byte{1};
    check_protocol_error(decode_rc(unavailable_bytes), "whole requests offered by other than an available answer");
    check_protocol_error(decode_rc(with_byte(12, 1)), "wider than 24 bits");
    check_protocol_error(decode_rc(with_byte(16, 1)), "wider than 24 bits");
    check_protocol_error(decode_rc(with_byte(38, 0)), "MTU code 0");
    check_protocol_error(decode_rc(with_byte(38, 6)), "MTU code 6");
    check_protocol_error(decode_rc(std::span(good).first(39)), "39 bytes");
    auto answer = bytes_of(unavailable);
    answer[20] = std::byte{1};
    check_protocol_error(decode_rc(answer), "an unavailable answer with a QP");
    for (const auto kind : {RcMessage::Kind::goodbye, RcMessage::Kind::still_here}) {
        const auto alone = bytes_of(RcMessage{.kind = kind, .available = false, .qp = {}});
        for (const std::size_t offset : {9, 10, 39}) {
            auto bad = alone;
            bad[offset] = std::byte{1};
            check_protocol_error(decode_rc(bad), "with more than its kind");
        }
    }
}

TEST_CASE("rpc rc codec: random corruption of a setup message is refused or re-encodes the same") {
    std::mt19937 random(7);
    const auto good = bytes_of(offer);
    for (int round = 0; round < 20'000; ++round) {
        auto bytes = good;
        for (int flips = 1 + static_cast<int>(random() % 3); flips > 0; --flips)
            bytes[random() % bytes.size()] ^= static_cast<std::byte>(1 + random() % 255);
        const auto decoded = decode_rc(bytes);
        if (decoded)
            CHECK(bytes_of(*decoded) == bytes);
    }
}

TEST_CASE("rpc rc codec: request descriptors carry memory to READ, memory offered, or the request inline") {
    const RemoteMemory request{.addr = 0x1000, .length = 300'000, .rkey = 7};
    const RemoteMemory response{.addr = 0x900000, .length = 1 << 20, .rkey = 9};
    const auto head = encode_request_head(request, response);
    const auto d = must(decode_request_descriptor(head, 1 << 20, 1 << 20));
    CHECK(d.request == request);
    CHECK(d.response == response);
    CHECK(d.inline_request.empty());

    std::vector<std::byte> with_inline;
    const auto small_head = encode_request_head({}, response);
    with_inline.assign(small_head.begin(), small_head.end());
    for (int i = 0; i < 100; ++i)
        with_inline.push_back(static_cast<std::byte>(i));
    const auto inline_d = must(decode_request_descriptor(with_inline, 1 << 20, 1 << 20));
    CHECK(inline_d.request.length == 0);
    REQUIRE(inline_d.inline_request.size() == 100);
    CHECK(inline_d.inline_request[99] == std::byte{99});

    check_protocol_error(decode_request_descriptor(std::span(head).first(39), 1 << 20, 1 << 20), "shorter than");
    check_protocol_error(decode_request_descriptor(head, 299'999, 1 << 20), "a 300000-byte request");
    check_protocol_error(decode_request_descriptor(head, 1 << 20, (1 << 20) - 1), "offered for the response");
    check_protocol_error(decode_request_descriptor(with_inline, 99, 1 << 20), "a 100-byte request");
    std::vector<std::byte> both(head.begin(), head.end());
    both.push_back(std::byte{1});
    check_protocol_error(decode_request_descriptor(both, 1 << 20, 1 << 20), "memory to read and an inline request");
    // memory whose end overflows the address space
    const auto overflow = encode_request_head({.addr = ~std::uint64_t{0} - 10, .length = 100, .rkey = 1}, {});
    CHECK_FALSE(decode_request_descriptor(overflow, 1 << 20, 1 << 20).has_value());
}

TEST_CASE("rpc rc codec: a response descriptor is the size written, 4 bytes and nothing else") {
    const auto d = encode_response_descriptor(1 << 20);
    CHECK(must(decode_response_descriptor(d)) == 1u << 20);
    check_protocol_error(decode_response_descriptor(std::span(d).first(3)), "3 bytes, not 4");
    const std::vector<std::byte> five(5);
    check_protocol_error(decode_response_descriptor(five), "5 bytes, not 4");
}

TEST_CASE("rpc rc codec: a written response's immediate names the session, slot and round, every bit used") {
    const WrittenResponse w{.session = 0xbeef, .slot = 1023, .round = 63};
    CHECK(encode_written(w) == 0xbeefffffu);
    CHECK(decode_written(encode_written(w)) == w);
    const WrittenResponse zero{};
    CHECK(encode_written(zero) == 0u);
    CHECK(decode_written(0x00010041u) == WrittenResponse{.session = 1, .slot = 1, .round = 1});
    CHECK(round_of(5, 8) == 0);
    CHECK(round_of(8, 8) == 1);
    CHECK(round_of(64 * 8 + 3, 8) == 0);
    RDMAXX_CHECK_DEATH((void)encode_written({.session = 1, .slot = 1024, .round = 0}), "slot 1024 or round 0");
    RDMAXX_CHECK_DEATH((void)encode_written({.session = 1, .slot = 0, .round = 64}), "slot 0 or round 64");
}
