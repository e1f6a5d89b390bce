// Devices, ports and GIDs as value types. Values a device reports that this header
// does not know (a newer MTU, link layer or GID type) map to `unknown`, never to UB.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <infiniband/verbs.h>

#include <fmt/format.h>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx {

enum class Mtu : std::uint8_t { unknown = 0, b256 = 1, b512, b1024, b2048, b4096 };
Mtu mtu_from_verbs(int value) noexcept;
// 0 for `Mtu::unknown`.
std::uint32_t mtu_bytes(Mtu mtu) noexcept;

enum class PortState : std::uint8_t { unknown, down, init, armed, active, active_defer };
enum class LinkLayer : std::uint8_t { unknown, infiniband, ethernet };
enum class GidType : std::uint8_t { unknown, ib, roce_v1, roce_v2 };

std::string_view to_string(Mtu mtu) noexcept;
std::string_view to_string(PortState state) noexcept;
std::string_view to_string(LinkLayer layer) noexcept;
std::string_view to_string(GidType type) noexcept;

// A 128-bit GID in network byte order, as on the wire.
struct Gid {
    std::array<std::uint8_t, 16> bytes{};

    static Gid from_verbs(const ibv_gid& gid) noexcept;
    ibv_gid to_verbs() const noexcept;

    bool is_zero() const noexcept;
    // ::ffff:a.b.c.d, the form RoCE v2 uses for an IPv4 address
    bool is_ipv4_mapped() const noexcept;
    // "fe80:0000:...:0001", the notation of sysfs and `ibv_devinfo -v`
    std::string to_string() const;

    friend bool operator==(const Gid&, const Gid&) = default;
};

struct GidEntry {
    Gid gid{};
    std::uint32_t index = 0;
    std::uint8_t port = 0;
    GidType type = GidType::unknown;
    std::uint32_t netdev_ifindex = 0; // 0 on InfiniBand
};

struct PortAttributes {
    std::uint8_t number = 0;
    PortState state = PortState::unknown;
    Mtu max_mtu = Mtu::unknown;
    Mtu active_mtu = Mtu::unknown;
    LinkLayer link_layer = LinkLayer::unknown;
    std::uint16_t lid = 0; // host order; 0 on RoCE
    std::int32_t gid_table_len = 0;
    ibv_port_attr raw{}; // every other field, as the device reported it
};

struct DeviceAttributes {
    std::string firmware{};
    std::uint64_t node_guid = 0; // host order
    std::uint32_t vendor_id = 0;
    std::uint32_t vendor_part_id = 0;
    std::uint8_t port_count = 0;
    bool atomics = false; // IBV_ATOMIC_HCA or IBV_ATOMIC_GLOB
    bool type2_windows = false; // memory windows bound by a work request (MemoryWindow)
    ibv_device_attr raw{}; // limits (max_qp_wr, max_sge, ...) and every other field
};

// An entry of the device list; open it with `Context::open(info.name)`.
struct DeviceInfo {
    std::string name{};
    std::uint64_t guid = 0; // host order
    std::string transport{}; // "InfiniBand", "iWARP", "usNIC", ... or "unknown"
};

Result<std::vector<DeviceInfo>> list_devices();

// The GID an application should use on a port: on RoCE (Ethernet) the RoCE v2 entry
// with an IPv4-mapped address (routable, the common deployment), else any RoCE v2
// entry, else the first RoCE v1 entry; on InfiniBand index 0, the port GID (paired
// with the LID). nullopt when the table has no usable entry.
std::optional<GidEntry> preferred_gid(LinkLayer layer, const std::vector<GidEntry>& table);

} // namespace rdmaxx

// A GID formats as Gid::to_string() writes it.
template <>
struct fmt::formatter<rdmaxx::Gid> : fmt::formatter<std::string_view> {
    auto format(const rdmaxx::Gid& gid, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(gid.to_string(), ctx);
    }
};
