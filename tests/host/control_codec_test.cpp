// The connection's control messages (lib/ctrl/src/control_codec.hpp): every kind
// round-trips, every malformed input is a protocol Error, random corruption never
// reads outside the bytes or accepts what does not re-encode the same.
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "../support/check.hpp"
#include "control_codec.hpp"

using namespace rdmaxx;
using namespace rdmaxx::detail::control;
using rdmaxx::test::check_protocol_error;
using rdmaxx::test::must;

namespace {

const Region region{.request = 7,
                    .memory = {.addr = 0x7f0000001000, .length = 4096, .rkey = 0x1234},
                    .token = 0xfeedface,
                    .access = Access::remote_read | Access::remote_write,
                    .lease = std::chrono::milliseconds(30000)};

std::vector<Message> samples() {
    return {Credit{},
            Lend{region},
            Grant{region},
            Request{.request = 9, .size = 1 << 20, .access = Access::remote_atomic, .lease = std::chrono::milliseconds(5)},
            Deny{.request = 9, .code = EDQUOT},
            Return{.token = 0xfeedface},
            ReturnAck{.token = 0xfeedface, .code = ESTALE},
            Goodbye{}};
}

// What a receiver does with bytes that arrived.
Result<Message> receive(std::span<const std::byte> bytes) {
    auto header = decode_header(bytes.first(std::min(bytes.size(), header_bytes)), bytes.size());
    if (!header)
        return std::unexpected(std::move(header.error()));
    if (header->kind == Kind::user)
        return std::unexpected(Error::protocol("test", "a user message"));
    return decode(*header, bytes.subspan(header_bytes));
}

std::vector<std::byte> bytes_of(const Encoded& e) { return {e.span().begin(), e.span().end()}; }

} // namespace

TEST_CASE("control messages of every kind round-trip with their credits") {
    for (const Message& m : samples()) {
        const Encoded e = encode(m, 513);
        const Header h = must(decode_header(e.span().first(header_bytes), e.size));
        CHECK(h.kind == kind_of(m));
        CHECK(h.credits == 513);
        CHECK(must(decode(h, e.span().subspan(header_bytes))) == m);
    }
    const auto user = encode_user_header(100, 3);
    const Header h = must(decode_header(user, header_bytes + 100));
    CHECK(h == Header{.kind = Kind::user, .credits = 3, .length = 100});
}

TEST_CASE("malformed control messages are protocol Errors that say what is wrong") {
    auto lend = bytes_of(encode(Lend{region}, 0));
    check_protocol_error(decode_header(std::span(lend).first(4), 4), "a 4-byte message");
    auto wrong = lend;
    wrong[0] = std::byte{0};
    check_protocol_error(receive(wrong), "unknown message kind 0");
    wrong[0] = std::byte{99};
    check_protocol_error(receive(wrong), "unknown message kind 99");
    wrong = lend;
    wrong[1] = std::byte{1};
    check_protocol_error(receive(wrong), "reserved byte");
    check_protocol_error(receive(std::span(lend).first(lend.size() - 1)), "header says 44 bytes, 43 arrived");
    wrong = lend;
    wrong.push_back(std::byte{0});
    wrong[7] = std::byte{45};
    check_protocol_error(receive(wrong), "with 45 bytes, not 44");
    const auto field = [&](std::size_t offset, std::uint64_t value, int width) {
        auto copy = lend;
        for (int i = width - 1; i >= 0; --i, value >>= 8)
            copy[header_bytes + offset + static_cast<std::size_t>(i)] = static_cast<std::byte>(value & 0xff);
        return copy;
    };
    check_protocol_error(receive(field(16, 0, 8)), "a region of 0 bytes");
    check_protocol_error(receive(field(8, ~0ull - 10, 8)), "wraps the address space");
    check_protocol_error(receive(field(28, 0, 8)), "token 0");
    check_protocol_error(receive(field(36, 0x80000000u, 4)), "unknown rights 0x80000000");
    auto deny = bytes_of(encode(Deny{.request = 1, .code = EACCES}, 0));
    deny[header_bytes + 11] = std::byte{1}; // errno 1: not one a peer may send
    check_protocol_error(receive(deny), "a refusal with errno 1");
    auto ack = bytes_of(encode(ReturnAck{.token = 1, .code = 0}, 0));
    ack[header_bytes + 11] = std::byte{5};
    check_protocol_error(receive(ack), "a return answer with errno 5");
    auto request = bytes_of(encode(Request{.request = 1, .size = 1, .access = Access::remote_read, .lease = {}}, 0));
    request[header_bytes + 16] = std::byte{0x40};
    check_protocol_error(receive(request), "unknown rights");
}

TEST_CASE("20,000 random corruptions: nothing read outside, nothing accepted that does not re-encode the same") {
    std::mt19937 random(11);
    int accepted = 0;
    for (int i = 0; i < 20000; ++i) {
        const auto all = samples();
        const Encoded e = encode(all[random() % all.size()], static_cast<std::uint16_t>(random()));
        std::vector<std::byte> bytes = bytes_of(e);
        for (int flips = 1 + static_cast<int>(random() % 3); flips > 0; --flips)
            bytes[random() % bytes.size()] = static_cast<std::byte>(random());
        bytes.resize(bytes.size() - (random() % 4 == 0 ? random() % bytes.size() : 0));
        const auto got = receive(bytes); // ASan builds check the reads
        if (!got)
            continue;
        ++accepted;
        const Header h = must(decode_header(std::span(bytes).first(header_bytes), bytes.size()));
        const Encoded again = encode(*got, h.credits);
        CHECK(std::vector<std::byte>(again.span().begin(), again.span().end()) == bytes);
    }
    CHECK(accepted > 0);
}

TEST_CASE("encoding what a peer would refuse is a programming error") {
    Region empty = region;
    empty.memory.length = 0;
    RDMAXX_CHECK_DEATH((void)encode(Lend{empty}, 0), "a region of 0 bytes");
    RDMAXX_CHECK_DEATH((void)encode(Deny{.request = 1, .code = EIO}, 0), "a refusal with errno 5");
    RDMAXX_CHECK_DEATH((void)encode(ReturnAck{.token = 1, .code = EIO}, 0), "a return answer with errno 5");
}
