// mlx5::DcEndpoint's 32-byte wire form: exact bytes, round trip (alone and as the
// metadata of an endpoint message), and every malformed input a protocol Error.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <doctest/doctest.h>

#include <rdmaxx/ctrl/endpoint_codec.hpp>
#include <rdmaxx/mlx5dv/dc_endpoint.hpp>

#include "../support/check.hpp"

using namespace rdmaxx;
using rdmaxx::mlx5::DcEndpoint;
using rdmaxx::test::must;

namespace {

DcEndpoint sample() {
    DcEndpoint e{.dctn = 0x123456, .dc_key = 0x0102030405060708, .gid = {}, .lid = 0x2122, .mtu = Mtu::b4096};
    for (std::size_t i = 0; i < e.gid.bytes.size(); ++i)
        e.gid.bytes[i] = static_cast<std::uint8_t>(0xa0 + i);
    return e;
}

void expect_protocol_error(std::span<const std::byte> bytes, std::string_view what) {
    test::check_protocol_error(DcEndpoint::parse(bytes), what);
}

} // namespace

TEST_CASE("a DC endpoint's wire form is 32 big-endian bytes and round-trips") {
    const DcEndpoint endpoint = sample();
    const DcEndpoint::Wire wire = endpoint.serialize();
    const std::array<std::uint8_t, 32> expected{
        0,    0x12, 0x34, 0x56,                                    // DCT number
        1,    2,    3,    4,    5,    6,    7,    8,                // key
        0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, // GID
        0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,                         //
        0x21, 0x22,                                                 // LID
        5,                                                          // IBV_MTU_4096
        0};                                                         // reserved
    for (std::size_t i = 0; i < wire.size(); ++i) {
        CAPTURE(i);
        CHECK(static_cast<std::uint8_t>(wire[i]) == expected[i]);
    }
    CHECK(must(DcEndpoint::parse(wire)) == endpoint);
    // InfiniBand: a LID and no GID is reachable too
    const DcEndpoint infiniband{.dctn = 1, .dc_key = 0, .gid = {}, .lid = 3, .mtu = Mtu::b256};
    CHECK(must(DcEndpoint::parse(infiniband.serialize())) == infiniband);
}

TEST_CASE("a DC endpoint travels as the metadata of an endpoint message") {
    const DcEndpoint endpoint = sample();
    const DcEndpoint::Wire wire = endpoint.serialize();
    const EndpointMessage message{
        .qps = {{.endpoint = {.qpn = 7, .psn = 9, .gid = endpoint.gid, .lid = 0, .mtu = Mtu::b1024}}},
        .metadata = {wire.begin(), wire.end()}};
    const EndpointMessage received = must(endpoint_codec::decode(endpoint_codec::encode(message)));
    CHECK(must(DcEndpoint::parse(received.metadata)) == endpoint);
}

TEST_CASE("parsing a DC endpoint rejects every malformed input") {
    const DcEndpoint::Wire good = sample().serialize();
    const std::span<const std::byte> all(good);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}})
        expect_protocol_error(all.first(n), "a DC endpoint takes 32");
    std::array<std::byte, 33> longer{};
    std::copy(good.begin(), good.end(), longer.begin());
    expect_protocol_error(longer, "33 bytes");

    const auto corrupt = [&](std::size_t at, std::uint8_t value) {
        DcEndpoint::Wire bad = good;
        bad[at] = static_cast<std::byte>(value);
        return bad;
    };
    expect_protocol_error(corrupt(0, 0x01), "wider than 24 bits");
    expect_protocol_error(corrupt(30, 0), "MTU code 0 is not an MTU");
    expect_protocol_error(corrupt(30, 6), "MTU code 6 is not an MTU");
    expect_protocol_error(corrupt(31, 0x80), "reserved byte");

    DcEndpoint::Wire unreachable = DcEndpoint{.dctn = 1, .dc_key = 2, .gid = {}, .lid = 1, .mtu = Mtu::b1024}.serialize();
    unreachable[29] = std::byte{0}; // LID 0, and the GID is zero
    expect_protocol_error(unreachable, "neither a GID nor a LID");
}

TEST_CASE("serializing an impossible DC endpoint is a programming error") {
    DcEndpoint wide = sample();
    wide.dctn = 0x1000000;
    RDMAXX_CHECK_DEATH((void)wide.serialize(), "DCT number 0x1000000 is wider than 24 bits");
    DcEndpoint no_mtu = sample();
    no_mtu.mtu = Mtu::unknown;
    RDMAXX_CHECK_DEATH((void)no_mtu.serialize(), "unknown MTU");
}
