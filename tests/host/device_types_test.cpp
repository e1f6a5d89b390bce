#include <doctest/doctest.h>

#include <rdmaxx/wrap/device.hpp>
#include <rdmaxx/wrap/qp.hpp>

using namespace rdmaxx;

namespace {

Gid gid_of(std::initializer_list<std::uint8_t> tail) {
    Gid g;
    std::copy(tail.begin(), tail.end(), g.bytes.end() - static_cast<std::ptrdiff_t>(tail.size()));
    return g;
}

const Gid link_local = [] {
    Gid g = gid_of({0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55});
    g.bytes[0] = 0xfe;
    g.bytes[1] = 0x80;
    return g;
}();
const Gid ipv4 = gid_of({0xff, 0xff, 192, 0, 2, 1});

} // namespace

TEST_CASE("GIDs print like sysfs and know the IPv4-mapped form") {
    CHECK(ipv4.to_string() == "0000:0000:0000:0000:0000:ffff:c000:0201");
    CHECK(ipv4.is_ipv4_mapped());
    CHECK_FALSE(link_local.is_ipv4_mapped());
    CHECK(Gid{}.is_zero());
    CHECK(Gid::from_verbs(ipv4.to_verbs()) == ipv4);
}

TEST_CASE("the preferred GID on RoCE is the IPv4-mapped RoCE v2 entry") {
    const std::vector<GidEntry> table{
        {.gid = link_local, .index = 0, .port = 1, .type = GidType::roce_v1},
        {.gid = link_local, .index = 1, .port = 1, .type = GidType::roce_v2},
        {.gid = ipv4, .index = 2, .port = 1, .type = GidType::roce_v1},
        {.gid = ipv4, .index = 3, .port = 1, .type = GidType::roce_v2},
    };
    CHECK(preferred_gid(LinkLayer::ethernet, table)->index == 3);
    // without an IPv4 address: any RoCE v2, then RoCE v1
    CHECK(preferred_gid(LinkLayer::ethernet, {table[0], table[1]})->index == 1);
    CHECK(preferred_gid(LinkLayer::ethernet, {table[0]})->index == 0);
    // zero GIDs are unusable
    CHECK_FALSE(preferred_gid(LinkLayer::ethernet, {{.gid = {}, .index = 0, .port = 1, .type = GidType::roce_v2}}));
    CHECK_FALSE(preferred_gid(LinkLayer::ethernet, {}));
    // an entry beyond ibv_ah_attr's 8-bit sgid_index would be used as index 300 % 256
    CHECK(preferred_gid(LinkLayer::ethernet, {table[1], {.gid = ipv4, .index = 300, .port = 1, .type = GidType::roce_v2}})
              ->index == 1);
    CHECK(preferred_gid(LinkLayer::ethernet, {{.gid = ipv4, .index = 255, .port = 1, .type = GidType::roce_v2}})
              ->index == 255);
}

TEST_CASE("the preferred GID on InfiniBand is the port GID at index 0") {
    const std::vector<GidEntry> table{
        {.gid = link_local, .index = 0, .port = 1, .type = GidType::ib},
        {.gid = ipv4, .index = 1, .port = 1, .type = GidType::ib},
    };
    CHECK(preferred_gid(LinkLayer::infiniband, table)->index == 0);
    CHECK_FALSE(preferred_gid(LinkLayer::infiniband, {table[1]}));
}

TEST_CASE("values the headers do not know map to unknown") {
    CHECK(mtu_from_verbs(IBV_MTU_1024) == Mtu::b1024);
    CHECK(mtu_from_verbs(0) == Mtu::unknown);
    CHECK(mtu_from_verbs(6) == Mtu::unknown);
    CHECK(mtu_bytes(Mtu::b4096) == 4096);
    CHECK(mtu_bytes(Mtu::b256) == 256);
    CHECK(mtu_bytes(Mtu::unknown) == 0);
    CHECK(qp_state_from_verbs(IBV_QPS_RTS) == QpState::rts);
    CHECK(qp_state_from_verbs(99) == QpState::unknown);
    CHECK(to_string(QpState::error) == "ERR");
    CHECK(to_string(GidType::roce_v2) == "RoCE v2");
}

TEST_CASE("connection defaults are the careful ones") {
    const QpConnectOptions o;
    CHECK(o.ack_timeout == 14);
    CHECK(o.retry_cnt == 7);
    CHECK(o.rnr_retry == 6);
    CHECK(o.min_rnr_timer == 12);
    CHECK_FALSE(o.path_mtu);
    CHECK_FALSE(o.max_rd_atomic);
}
