// lib/mlx5dv on the device at hand. On rxe (or any non-mlx5 device) every entry point
// answers with an unsupported Error; the hardware cases run only where an mlx5 device
// is present and are reported as skipped otherwise.
#include <algorithm>
#include <cstring>
#include <string>

#include <doctest/doctest.h>

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

// Devices that are not mlx5 (rxe0 in the VM).
std::vector<std::string> other_devices() {
    std::vector<std::string> names;
    for (const DeviceInfo& d : must(list_devices()))
        if (!mlx5::is_supported(d.name).value_or(false))
            names.push_back(d.name);
    return names;
}

} // namespace

TEST_CASE("on a non-mlx5 device every mlx5dv entry point is an unsupported Error, and nothing aborts") {
    const auto names = other_devices();
    if (names.empty())
        return; // only mlx5 devices here: the hardware cases below cover them
    REQUIRE(mlx5::built_with_mlx5dv());
    for (const std::string& name : names) {
        CAPTURE(name);
        CHECK_FALSE(must(mlx5::is_supported(name)));
        const Error opened = must_fail(mlx5::open(name));
        CHECK(opened.kind() == Error::Kind::unsupported);
        CHECK(opened.message().find(name + " is not an mlx5 device") != std::string::npos);
        const Context context = must(Context::open(name));
        const Error queried = must_fail(mlx5::query(context));
        CHECK(queried.kind() == Error::Kind::unsupported);
        CHECK(queried.message().find("not an mlx5 device") != std::string::npos);
        // device memory is plain verbs; rxe has none
        if (auto dm = mlx5::DeviceMemory::allocate(context, 4096); !dm)
            CHECK((dm.error().kind() == Error::Kind::unsupported || dm.error().kind() == Error::Kind::system));
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
