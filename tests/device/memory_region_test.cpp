#include <cstdint>
#include <vector>

#include <unistd.h>

#include <doctest/doctest.h>

#include "../support/device.hpp"

using namespace rdmaxx;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

TEST_CASE("caller memory registers with every valid access mix") {
    test::Rig rig;
    std::vector<std::byte> memory(8192);
    // remote write or atomic without local write is invalid (ibv_reg_mr(3))
    const Access local = Access::local_write;
    for (const Access access : {Access::none, local, local | Access::remote_read, local | Access::remote_write,
                                local | Access::remote_atomic, Access::remote_read, access_all}) {
        const MemoryRegion mr = must(MemoryRegion::register_memory(rig.pd, memory, access));
        CHECK(mr.data() == memory.data());
        CHECK(mr.size() == memory.size());
        CHECK(mr.access() == access);
        CHECK(mr.remote().addr == reinterpret_cast<std::uintptr_t>(memory.data()));
        CHECK(mr.remote().rkey == mr.rkey());
    }
}

TEST_CASE("an access mix the device refuses is an Error, not an abort") {
    test::Rig rig;
    std::vector<std::byte> memory(4096);
    for (const Access access : {Access::remote_write, Access::remote_atomic}) {
        const Error e = must_fail(MemoryRegion::register_memory(rig.pd, memory, access));
        CHECK(e.is_errno(EINVAL));
        CHECK(std::string_view(e.call()) == "ibv_reg_mr");
    }
}

TEST_CASE("allocated regions are page-aligned and zeroed") {
    test::Rig rig;
    const MemoryRegion mr = must(MemoryRegion::allocate(rig.pd, 10000, access_all));
    CHECK(reinterpret_cast<std::uintptr_t>(mr.data()) % static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE)) == 0);
    CHECK(mr.size() == 10000);
    for (const std::byte b : mr.bytes())
        REQUIRE(b == std::byte{0});
    const MemoryRegion aligned = must(MemoryRegion::allocate(rig.pd, 100, Access::local_write, {.alignment = 1 << 16}));
    CHECK(reinterpret_cast<std::uintptr_t>(aligned.data()) % (1 << 16) == 0);
}

TEST_CASE("region slices are bounds-checked views") {
    test::Rig rig;
    const MemoryRegion mr = must(MemoryRegion::allocate(rig.pd, 4096, access_all));
    const LocalSlice s = mr.slice(100, 200);
    CHECK(s.data() == mr.data() + 100);
    CHECK(s.lkey() == mr.lkey());
    CHECK(mr.all().size() == 4096);
    CHECK(mr.remote().slice(4000, 96).addr == mr.remote().addr + 4000);
    RDMAXX_CHECK_DEATH(mr.slice(4000, 97), "out of range of a 4096-byte memory region");
    RDMAXX_CHECK_DEATH((void)MemoryRegion::allocate(rig.pd, 0, Access::none), "allocate of 0 bytes");
    RDMAXX_CHECK_DEATH((void)MemoryRegion::allocate(rig.pd, 64, Access::none, {.alignment = 3}),
                       "not a power of two");
}

TEST_CASE("a moved-from region is a programming error") {
    test::Rig rig;
    MemoryRegion mr = must(MemoryRegion::allocate(rig.pd, 64, Access::local_write));
    const MemoryRegion kept = std::move(mr);
    CHECK(kept.lkey() != 0);
    RDMAXX_CHECK_DEATH((void)mr.lkey(), "moved-from MemoryRegion");
    RDMAXX_CHECK_DEATH((void)mr.slice(0, 1), "moved-from MemoryRegion");
}
