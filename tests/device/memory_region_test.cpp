#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
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

namespace {

// The kernel page size (KiB) of the mapping holding `address`, from /proc/self/smaps.
std::size_t kernel_page_kib(const void* address) {
    const auto target = reinterpret_cast<std::uintptr_t>(address);
    std::ifstream smaps("/proc/self/smaps");
    bool inside = false;
    for (std::string line; std::getline(smaps, line);) {
        std::uintptr_t from = 0, to = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2 && line.find(':') > line.find('-'))
            inside = from <= target && target < to;
        else if (inside && line.rfind("KernelPageSize:", 0) == 0)
            return std::strtoull(line.c_str() + 15, nullptr, 10);
    }
    return 0;
}

// vm.nr_hugepages for one scope (the VM only: it is root and thrown away).
class ReservedHugePages {
public:
    explicit ReservedHugePages(int pages) {
        set(pages);
        int now = -1;
        std::ifstream("/proc/sys/vm/nr_hugepages") >> now;
        REQUIRE_MESSAGE(now == pages, "the kernel reserved ", now, " huge pages of ", pages);
    }
    ReservedHugePages(const ReservedHugePages&) = delete;
    ReservedHugePages& operator=(const ReservedHugePages&) = delete;
    ~ReservedHugePages() { set(0); }

private:
    static void set(int pages) {
        std::ofstream("/proc/sys/vm/nr_hugepages") << pages << '\n';
    }
};

} // namespace

TEST_CASE("huge pages: required ones are hugetlbfs pages or an Error; preferred ones always come" *
          doctest::skip(std::getenv("RDMAXX_VM") == nullptr)) {
    test::Rig rig;
    const AllocateOptions require{.huge_pages = HugePages::require};
    const AllocateOptions prefer{.huge_pages = HugePages::prefer};
    {
        const ReservedHugePages none(0);
        CHECK(must_fail(MemoryRegion::allocate(rig.pd, 1 << 20, access_all, require)).is_errno(ENOMEM));
        const MemoryRegion normal = must(MemoryRegion::allocate(rig.pd, 1 << 20, access_all, prefer));
        CHECK(normal.size() == 1 << 20);
        CHECK(reinterpret_cast<std::uintptr_t>(normal.data()) % (2 << 20) == 0); // ready for THP
        CHECK(kernel_page_kib(normal.data()) == 4);
    }
    // two pages for `huge`, three while `aligned` is mapped (a page of slack to align it)
    const ReservedHugePages eight(8);
    MemoryRegion huge = must(MemoryRegion::allocate(rig.pd, 3 << 20, access_all, require));
    CHECK(huge.size() == 3 << 20);
    CHECK(reinterpret_cast<std::uintptr_t>(huge.data()) % (2 << 20) == 0);
    CHECK(kernel_page_kib(huge.data()) == 2048);
    CHECK(huge.bytes()[(3 << 20) - 1] == std::byte{0}); // zeroed by the kernel
    const MemoryRegion aligned =
        must(MemoryRegion::allocate(rig.pd, 4096, access_all, {.alignment = 4 << 20, .huge_pages = HugePages::require}));
    CHECK(reinterpret_cast<std::uintptr_t>(aligned.data()) % (4 << 20) == 0);
    CHECK(kernel_page_kib(aligned.data()) == 2048);
    // the NIC reads and writes it: a loopback WRITE across the huge page boundary
    QueuePair a = rig.make_qp(QpType::rc);
    QueuePair b = rig.make_qp(QpType::rc);
    must(a.connect(b.endpoint()));
    must(b.connect(a.endpoint()));
    std::memset(huge.data(), 0x5a, 8192);
    ibv_sge sge = huge.slice(0, 8192).sge();
    const RemoteMemory across = huge.remote().slice((2 << 20) - 4096, 8192);
    ibv_send_wr wr = test::raw_write_wr(sge, across, true);
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(a.get(), &wr, &bad) == 0);
    ibv_wc wc{};
    int polled = 0;
    for (long spins = 0; polled == 0 && spins < 50'000'000; ++spins)
        polled = ibv_poll_cq(rig.cq.get(), 1, &wc);
    REQUIRE(polled == 1);
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(huge.bytes()[(2 << 20) + 4095] == std::byte{0x5a});
}
