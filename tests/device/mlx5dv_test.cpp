// lib/mlx5dv on the device at hand. On rxe (or any non-mlx5 device) every entry point
// answers with an unsupported Error; the hardware cases run only where an mlx5 device
// is present and are reported as skipped otherwise.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include <doctest/doctest.h>

#include <rdmaxx/mlx5dv/dc.hpp>
#include <rdmaxx/mlx5dv/mlx5dv.hpp>

#include "../support/device.hpp"

using namespace rdmaxx;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

// The first mlx5 device, or "" when there is none (or the build lacks mlx5dv).
std::string first_mlx5() {
    auto devices = list_devices();
    if (!devices || !mlx5::built_with_mlx5dv())
        return {};
    for (const DeviceInfo& d : *devices)
        if (auto yes = mlx5::is_supported(d.name); yes && *yes)
            return d.name;
    return {};
}

const std::string mlx5_device = first_mlx5();

// Devices that are not mlx5 (rxe0 in the VM), found before the tests run: a case
// with none to test is skipped, not passed.
std::vector<std::string> other_devices() {
    std::vector<std::string> names;
    for (const DeviceInfo& d : list_devices().value_or(std::vector<DeviceInfo>{}))
        if (!mlx5::is_supported(d.name).value_or(false))
            names.push_back(d.name);
    return names;
}
const std::vector<std::string> non_mlx5_devices = other_devices();

// The next completion on `cq`, which must be a success; at most 5 s away.
void expect_success(const CompletionQueue& cq, std::uint64_t wr_id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    ibv_wc wc{};
    int polled = 0;
    while ((polled = ibv_poll_cq(cq.get(), 1, &wc)) == 0)
        REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "no completion within 5 s");
    REQUIRE(polled == 1);
    CHECK_MESSAGE(wc.status == IBV_WC_SUCCESS, ibv_wc_status_str(wc.status));
    CHECK(wc.wr_id == wr_id);
}

// A DC target and a DC initiator on one mlx5 port, the initiator addressing the
// target through its endpoint's wire form, as a peer would.
struct DcLoopback {
    Context context = must(mlx5::open(mlx5_device));
    ProtectionDomain pd = must(ProtectionDomain::create(context));
    CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 64}));
    SharedReceiveQueue srq = must(SharedReceiveQueue::create(pd, {.max_wr = 16}));
    mlx5::DcTarget target = must(mlx5::DcTarget::create(pd, {.cq = &cq, .srq = &srq}));
    mlx5::DcInitiator initiator = must(mlx5::DcInitiator::create(pd, {.cq = &cq}));
    mlx5::DcDestination to = connect();
    MemoryRegion local = must(MemoryRegion::allocate(pd, 4096, access_all));

    mlx5::DcDestination connect() {
        must(target.activate());
        CHECK(target.state() == QpState::rtr);
        must(initiator.activate());
        CHECK(initiator.state() == QpState::rts);
        const mlx5::DcEndpoint::Wire wire = target.endpoint().serialize();
        return must(initiator.destination(must(mlx5::DcEndpoint::parse(wire))));
    }
};

} // namespace

TEST_CASE("on a non-mlx5 device every mlx5dv entry point is an unsupported Error, and nothing aborts" *
          doctest::skip(non_mlx5_devices.empty())) {
    REQUIRE(mlx5::built_with_mlx5dv());
    for (const std::string& name : non_mlx5_devices) {
        CAPTURE(name);
        CHECK_FALSE(must(mlx5::is_supported(name)));
        const Error opened = must_fail(mlx5::open(name));
        CHECK(opened.kind() == Error::Kind::unsupported);
        CHECK(opened.message().find(name + " is not an mlx5 device") != std::string::npos);
        const Context context = must(Context::open(name));
        const Error queried = must_fail(mlx5::query(context));
        CHECK(queried.kind() == Error::Kind::unsupported);
        CHECK(queried.message().find("not an mlx5 device") != std::string::npos);
        // device memory is plain verbs; rxe has none (so DeviceMemoryRegion, which
        // needs a DeviceMemory, cannot be reached here)
        if (auto dm = mlx5::DeviceMemory::allocate(context, 4096); !dm)
            CHECK((dm.error().kind() == Error::Kind::unsupported || dm.error().kind() == Error::Kind::system));
        const ProtectionDomain pd = must(ProtectionDomain::create(context));
        const CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 16}));
        const SharedReceiveQueue srq = must(SharedReceiveQueue::create(pd, {.max_wr = 16}));
        for (const Error& e : {must_fail(mlx5::DcTarget::create(pd, {.cq = &cq, .srq = &srq})),
                               must_fail(mlx5::DcInitiator::create(pd, {.cq = &cq}))}) {
            CHECK(e.kind() == Error::Kind::unsupported);
            CHECK(e.message().find(name + " is not an mlx5 device") != std::string::npos);
        }
    }
    CHECK(must_fail(mlx5::is_supported("no-such-device")).is_errno(ENODEV));
    CHECK(must_fail(mlx5::open("no-such-device")).is_errno(ENODEV));
}

TEST_CASE("mlx5 hardware: open with mlx5dv, query typed capabilities" * doctest::skip(mlx5_device.empty())) {
    const Context context = must(mlx5::open(mlx5_device));
    CHECK(context.name() == mlx5_device);
    const mlx5::DeviceCaps caps = must(mlx5::query(context));
    CHECK(caps.version >= 1);
}

TEST_CASE("mlx5 hardware: device memory round trip" * doctest::skip(mlx5_device.empty())) {
    const Context context = must(mlx5::open(mlx5_device));
    mlx5::DeviceMemory dm = must(mlx5::DeviceMemory::allocate(context, 4096));
    std::array<std::byte, 256> out{}, back{};
    test::fill(out, 3);
    must(dm.copy_to(128, out));
    must(dm.copy_from(128, back));
    CHECK(std::equal(out.begin(), out.end(), back.begin()));
    RDMAXX_CHECK_DEATH((void)dm.copy_to(4000, out), "copy_to [4000, +256)");
}

TEST_CASE("mlx5 hardware: DC loopback WRITE, READ and atomics" * doctest::skip(mlx5_device.empty())) {
    DcLoopback dc;
    MemoryRegion remote = must(MemoryRegion::allocate(dc.pd, 4096, access_all));
    test::fill(dc.local.bytes().first(256), 1);
    must(dc.initiator.write(dc.to, dc.local.slice(0, 256), remote.remote().slice(512, 256), {.wr_id = 1}));
    expect_success(dc.cq, 1);
    CHECK(std::equal(remote.data() + 512, remote.data() + 768, dc.local.data()));

    test::fill(remote.bytes().first(128), 2);
    must(dc.initiator.read(dc.to, dc.local.slice(1024, 128), remote.remote().slice(0, 128), {.wr_id = 2}));
    expect_success(dc.cq, 2);
    CHECK(std::equal(remote.data(), remote.data() + 128, dc.local.data() + 1024));

    std::uint64_t start = 40;
    std::memcpy(remote.data() + 2048, &start, 8);
    must(dc.initiator.fetch_add(dc.to, dc.local.slice(2048, 8), remote.remote().slice(2048, 8), 2, {.wr_id = 3}));
    expect_success(dc.cq, 3);
    must(dc.initiator.compare_swap(dc.to, dc.local.slice(2056, 8), remote.remote().slice(2048, 8), 42, 7,
                                   {.wr_id = 4}));
    expect_success(dc.cq, 4);
    std::uint64_t fetched = 0, compared = 0, now = 0;
    std::memcpy(&fetched, dc.local.data() + 2048, 8);
    std::memcpy(&compared, dc.local.data() + 2056, 8);
    std::memcpy(&now, remote.data() + 2048, 8);
    CHECK(fetched == 40);
    CHECK(compared == 42);
    CHECK(now == 7);
    RDMAXX_CHECK_DEATH((void)dc.initiator.fetch_add(dc.to, dc.local.slice(0, 4), remote.remote().slice(0, 8), 1),
                       "an atomic needs an 8-byte local slice");
}

TEST_CASE("mlx5 hardware: device memory as an MR, written and read back over DC" *
          doctest::skip(mlx5_device.empty())) {
    DcLoopback dc;
    const mlx5::DeviceMemory dm = must(mlx5::DeviceMemory::allocate(dc.context, 4096));
    const mlx5::DeviceMemoryRegion region =
        must(mlx5::DeviceMemoryRegion::register_memory(dc.pd, dm, Access::local_write | Access::remote_write |
                                                                      Access::remote_read));
    const RemoteMemory on_device = region.remote();
    CHECK(on_device.addr == 0); // zero-based: addresses are offsets
    CHECK(on_device.length == 4096);
    test::fill(dc.local.bytes().first(512), 3);
    must(dc.initiator.write(dc.to, dc.local.slice(0, 512), on_device.slice(1024, 512), {.wr_id = 5}));
    expect_success(dc.cq, 5);
    std::array<std::byte, 512> copied{};
    must(dm.copy_from(1024, copied));
    CHECK(std::equal(copied.begin(), copied.end(), dc.local.data()));
    must(dc.initiator.read(dc.to, dc.local.slice(2048, 512), on_device.slice(1024, 512), {.wr_id = 6}));
    expect_success(dc.cq, 6);
    CHECK(std::equal(dc.local.data(), dc.local.data() + 512, dc.local.data() + 2048));
    const ibv_sge sge = region.sge(16, 32);
    CHECK(sge.addr == 16);
    CHECK(sge.lkey == region.lkey());
    RDMAXX_CHECK_DEATH((void)region.sge(4090, 8), "past its end");
}
