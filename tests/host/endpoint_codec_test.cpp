#include <array>
#include <cstring>
#include <random>

#include <doctest/doctest.h>

#include <rdmaxx/ctrl/endpoint_codec.hpp>
#include <rdmaxx/wrap/wire.hpp>

#include "../support/check.hpp"

using namespace rdmaxx;
namespace codec = rdmaxx::endpoint_codec;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

EndpointMessage sample() {
    EndpointMessage m;
    PeerQp a{.endpoint = {.qpn = 0x123456, .psn = 0xabcdef, .gid = {}, .lid = 7, .mtu = Mtu::b1024}, .type = QpType::rc};
    a.endpoint.gid.bytes[10] = 0xff;
    a.endpoint.gid.bytes[11] = 0xff;
    a.endpoint.gid.bytes[15] = 1;
    PeerQp b{.endpoint = {.qpn = 0x11, .psn = 0, .gid = {}, .lid = 0, .mtu = Mtu::b4096}, .type = QpType::ud};
    m.qps = {a, b};
    const char blob[] = "remote MR descriptors";
    m.metadata.assign(reinterpret_cast<const std::byte*>(blob), reinterpret_cast<const std::byte*>(blob) + sizeof blob);
    return m;
}

void expect_protocol_error(std::span<const std::byte> bytes, std::string_view what) {
    const Error e = must_fail(codec::decode(bytes));
    CHECK(e.kind() == Error::Kind::protocol);
    INFO(e.message());
    CHECK(e.message().find(what) != std::string::npos);
}

void put32(std::vector<std::byte>& bytes, std::size_t at, std::uint32_t value) {
    for (int i = 0; i < 4; ++i)
        bytes[at + static_cast<std::size_t>(i)] = static_cast<std::byte>(value >> (24 - 8 * i));
}

} // namespace

TEST_CASE("an endpoint message round-trips") {
    const EndpointMessage m = sample();
    const auto bytes = codec::encode(m);
    CHECK(bytes.size() == codec::header_size + 4 + 2 * codec::qp_size + 4 + m.metadata.size());
    CHECK(std::memcmp(bytes.data(), "RDMX", 4) == 0);
    CHECK(must(codec::decode(bytes)) == m);
    CHECK(must(codec::body_length(std::span(bytes).first<codec::header_size>())) == bytes.size() - codec::header_size);
    EndpointMessage bare{.qps = {sample().qps[0]}, .metadata = {}};
    CHECK(must(codec::decode(codec::encode(bare))) == bare);
}

TEST_CASE("malformed endpoint messages are protocol Errors") {
    const auto good = codec::encode(sample());
    const std::span<const std::byte> all(good);
    expect_protocol_error(all.first(0), "shorter than");
    expect_protocol_error(all.first(11), "shorter than");
    expect_protocol_error(all.first(good.size() - 1), "the header announces");
    auto longer = good;
    longer.push_back(std::byte{0});
    expect_protocol_error(longer, "the header announces");

    auto wrong_magic = good;
    wrong_magic[0] = std::byte{'X'};
    expect_protocol_error(wrong_magic, "wrong magic");
    auto future = good;
    future[5] = std::byte{2};
    expect_protocol_error(future, "version 2 is not supported");
    auto flags = good;
    flags[7] = std::byte{1};
    expect_protocol_error(flags, "unknown flags");
    auto huge = good;
    put32(huge, 8, 0xffffffff);
    expect_protocol_error(huge, "body length");

    auto no_qps = good;
    no_qps[12] = no_qps[13] = std::byte{0};
    expect_protocol_error(no_qps, "0 QPs");
    auto many_qps = good;
    many_qps[13] = std::byte{200}; // claims 200 QPs in a body that holds 2
    expect_protocol_error(many_qps, "too short");
    auto metadata_lies = good;
    put32(metadata_lies, codec::header_size + 4 + 2 * codec::qp_size, 5);
    expect_protocol_error(metadata_lies, "metadata length 5");
    auto wide_qpn = good;
    wide_qpn[codec::header_size + 4] = std::byte{1};
    expect_protocol_error(wide_qpn, "24 bits");
    auto bad_mtu = good;
    bad_mtu[codec::header_size + 4 + 26] = std::byte{9};
    expect_protocol_error(bad_mtu, "not an MTU");
    auto bad_type = good;
    bad_type[codec::header_size + 4 + 27] = std::byte{7};
    expect_protocol_error(bad_type, "QP type code 7");
}

TEST_CASE("random corruption of a message never crashes the decoder") {
    const auto good = codec::encode(sample());
    std::mt19937 random(12345);
    int rejected = 0;
    for (int round = 0; round < 20000; ++round) {
        auto bytes = good;
        const int flips = 1 + static_cast<int>(random() % 4);
        for (int i = 0; i < flips; ++i)
            bytes[random() % bytes.size()] = static_cast<std::byte>(random());
        if (random() % 4 == 0)
            bytes.resize(random() % (bytes.size() + 8));
        // a heap copy of exactly that size, so that ASan sees any read past its end
        const std::vector<std::byte> exact(bytes.begin(), bytes.end());
        if (!codec::decode(exact))
            ++rejected;
    }
    CHECK(rejected > 10000);
}

TEST_CASE("encoding an impossible message is a programming error") {
    RDMAXX_CHECK_DEATH((void)codec::encode(EndpointMessage{}), "0 QPs");
}

TEST_CASE("wire: every width from 1 to 8 bytes is written most significant first, within its bytes, and read back") {
    const std::uint64_t pattern = 0x0102030405060708;
    for (int bytes = 1; bytes <= 8; ++bytes) {
        CAPTURE(bytes);
        const std::uint64_t value = bytes == 8 ? pattern : pattern & ((std::uint64_t{1} << (8 * bytes)) - 1);
        std::array<std::byte, 10> out;
        out.fill(std::byte{0xee});
        wire::put(out.data() + 1, value, bytes);
        CHECK(out[0] == std::byte{0xee});
        CHECK(out[static_cast<std::size_t>(bytes) + 1] == std::byte{0xee});
        for (int i = 0; i < bytes; ++i) // the last byte is 0x08, the one before it 0x07, ...
            CHECK(std::to_integer<int>(out[static_cast<std::size_t>(i) + 1]) == 8 - (bytes - 1 - i));
        CHECK(wire::get(out.data() + 1, bytes) == value);
    }
}
