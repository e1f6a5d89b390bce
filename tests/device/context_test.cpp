#include <cstdlib>
#include <string>

#include <doctest/doctest.h>

#include "../support/device.hpp"

using namespace rdmaxx;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

// Sets an environment variable for one scope.
struct ScopedEnv {
    const char* name;
    std::optional<std::string> saved;
    ScopedEnv(const char* n, const char* value) : name(n) {
        if (const char* old = std::getenv(n))
            saved = old;
        ::setenv(n, value, 1);
    }
    ~ScopedEnv() { saved ? (void)::setenv(name, saved->c_str(), 1) : (void)::unsetenv(name); }
};

} // namespace

TEST_CASE("the device list names the devices and Context opens them") {
    const auto devices = must(list_devices());
    REQUIRE_FALSE(devices.empty());
    for (const DeviceInfo& info : devices) {
        const Context context = must(Context::open(info.name));
        CHECK(context.name() == info.name);
        CHECK(context.attributes().port_count >= 1);
        CHECK(context.attributes().raw.max_qp_wr > 0);
    }
    const Context first = must(Context::open());
    CHECK(first.name() == devices.front().name);
}

TEST_CASE("a device name that does not exist is an Error listing what exists") {
    const Error e = must_fail(Context::open("no-such-device"));
    CHECK(e.is_errno(ENODEV));
    CHECK(e.message().find("no-such-device") != std::string::npos);
    CHECK(e.message().find(must(list_devices()).front().name) != std::string::npos);
}

TEST_CASE("$RDMAXX_DEVICE chooses the device when no name is given") {
    const std::string name = must(list_devices()).back().name;
    {
        const ScopedEnv env(device_env, name.c_str());
        CHECK(must(Context::open()).name() == name);
    }
    const ScopedEnv env(device_env, "bogus0");
    CHECK(must_fail(Context::open()).is_errno(ENODEV));
}

TEST_CASE("port attributes and the GID table are read from the device") {
    const Context context = must(Context::open());
    const PortAttributes port = must(context.query_port(1));
    CHECK(port.number == 1);
    CHECK(port.state == PortState::active);
    CHECK(port.active_mtu != Mtu::unknown);
    CHECK(port.link_layer != LinkLayer::unknown);
    const auto gids = must(context.query_gids());
    REQUIRE_FALSE(gids.empty());
    for (const GidEntry& e : gids) {
        CHECK(e.port == 1);
        CHECK_FALSE(e.gid.is_zero());
        CHECK(e.type != GidType::unknown);
    }
    CHECK(must_fail(context.query_port(77)).kind() == Error::Kind::system);
}

namespace {

// Whether the default device's port 1 is RoCE, found before the tests run; on
// InfiniBand the GID case is skipped (the host test of preferred_gid covers it).
bool default_port_is_roce() {
    const auto context = Context::open();
    if (!context)
        return false;
    const auto port = context->query_port(1);
    return port && port->link_layer == LinkLayer::ethernet;
}

} // namespace

TEST_CASE("the chosen GID on RoCE is the IPv4-mapped RoCE v2 entry" * doctest::skip(!default_port_is_roce())) {
    const Context context = must(Context::open());
    const GidEntry gid = must(context.choose_gid(1));
    CHECK(gid.type == GidType::roce_v2);
    CHECK(gid.gid.is_ipv4_mapped());
    if (const char* vm_index = std::getenv("RDMAXX_VM_GID_INDEX"); vm_index && *vm_index)
        CHECK(gid.index == static_cast<std::uint32_t>(std::atoi(vm_index)));
}

TEST_CASE("the GID choice can be overridden, by argument or $RDMAXX_GID_INDEX") {
    const Context context = must(Context::open());
    const auto gids = must(context.query_gids());
    const GidEntry& other = gids.front();
    CHECK(must(context.choose_gid(1, other.index)).index == other.index);
    {
        const ScopedEnv env(gid_index_env, std::to_string(other.index).c_str());
        CHECK(must(context.choose_gid(1)).index == other.index);
    }
    CHECK(must_fail(context.choose_gid(1, 9999)).is_errno(EINVAL));
    // rxe's table has 1024 entries: one past 255 would reach a QP as its low 8 bits
    CHECK(must_fail(context.choose_gid(1, 256)).message().find("sgid_index holds 8 bits") != std::string::npos);
    const ScopedEnv env(gid_index_env, "one");
    CHECK(must_fail(context.choose_gid(1)).message().find("RDMAXX_GID_INDEX") != std::string::npos);
}

TEST_CASE("a moved-from Context is a programming error") {
    Context context = must(Context::open());
    const Context moved = std::move(context);
    CHECK(moved.get() != nullptr);
    RDMAXX_CHECK_DEATH((void)context.get(), "moved-from Context");
    RDMAXX_CHECK_DEATH((void)ProtectionDomain::create(context), "moved-from Context");
}
