#include <array>
#include <cstddef>
#include <limits>

#include <doctest/doctest.h>

#include <rdmaxx/wrap/mr.hpp>

#include "../support/check.hpp"

using rdmaxx::LocalSlice;
using rdmaxx::RemoteMemory;

TEST_CASE("local slices stay inside their parent") {
    std::array<std::byte, 64> bytes{};
    const LocalSlice all(bytes.data(), 64, 0x1234);
    const LocalSlice mid = all.slice(16, 32);
    CHECK(mid.data() == bytes.data() + 16);
    CHECK(mid.size() == 32);
    CHECK(mid.lkey() == 0x1234);
    const ibv_sge sge = mid.slice(8, 8).sge();
    CHECK(sge.addr == reinterpret_cast<std::uintptr_t>(bytes.data() + 24));
    CHECK(sge.length == 8);
    CHECK(sge.lkey == 0x1234);
    CHECK(all.slice(64, 0).size() == 0);
    CHECK(all.slice(0, 64).bytes().size() == 64);
}

TEST_CASE("a local slice out of range is a programming error") {
    std::array<std::byte, 64> bytes{};
    const LocalSlice all(bytes.data(), 64, 1);
    RDMAXX_CHECK_DEATH(all.slice(60, 5), "out of range of a 64-byte local slice");
    RDMAXX_CHECK_DEATH(all.slice(65, 0), "out of range");
    // offset + length overflows: must not wrap around into "in range"
    RDMAXX_CHECK_DEATH(all.slice(8, std::numeric_limits<std::size_t>::max()), "out of range");
}

TEST_CASE("remote descriptors slice with bounds checks") {
    const RemoteMemory remote{.addr = 0x10000, .length = 4096, .rkey = 77};
    CHECK(remote.slice(100, 8) == RemoteMemory{.addr = 0x10064, .length = 8, .rkey = 77});
    CHECK(remote.slice(4096, 0).length == 0);
    RDMAXX_CHECK_DEATH(remote.slice(4090, 8), "out of range of a 4096-byte remote region");
    RDMAXX_CHECK_DEATH(remote.slice(1, std::numeric_limits<std::uint64_t>::max()), "out of range");
}

TEST_CASE("a remote descriptor's wire form is 20 big-endian bytes and round-trips") {
    const RemoteMemory remote{.addr = 0x0102030405060708, .length = 0x1112131415161718, .rkey = 0x21222324};
    const RemoteMemory::Wire wire = remote.serialize();
    const std::array<std::uint8_t, 20> expected{1,    2,    3,    4,    5,    6,    7,    8,    0x11, 0x12,
                                                0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x21, 0x22, 0x23, 0x24};
    for (std::size_t i = 0; i < wire.size(); ++i)
        CHECK(static_cast<std::uint8_t>(wire[i]) == expected[i]);
    CHECK(rdmaxx::test::must(RemoteMemory::parse(wire)) == remote);
}

TEST_CASE("parsing a remote descriptor rejects malformed bytes") {
    const RemoteMemory::Wire wire = RemoteMemory{.addr = 1, .length = 2, .rkey = 3}.serialize();
    const std::span<const std::byte> bytes(wire);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{19}}) {
        const auto e = rdmaxx::test::must_fail(RemoteMemory::parse(bytes.first(n)));
        CHECK(e.kind() == rdmaxx::Error::Kind::protocol);
    }
    std::array<std::byte, 21> longer{};
    CHECK(rdmaxx::test::must_fail(RemoteMemory::parse(longer)).kind() == rdmaxx::Error::Kind::protocol);
    // a region that wraps around the address space
    const auto wrapping = RemoteMemory{.addr = ~0ull - 4, .length = 8, .rkey = 1}.serialize();
    CHECK(rdmaxx::test::must_fail(RemoteMemory::parse(wrapping)).message().find("wraps") != std::string::npos);
}

TEST_CASE("access flags combine and test as sets") {
    using rdmaxx::Access;
    constexpr Access rw = Access::remote_read | Access::remote_write;
    static_assert(rdmaxx::has(rw, Access::remote_read));
    static_assert(!rdmaxx::has(rw, Access::remote_atomic));
    static_assert(rdmaxx::has(rdmaxx::access_all, rw | Access::local_write));
    CHECK(static_cast<unsigned>(rw) == (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
}
