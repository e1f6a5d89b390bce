/// @file
/// Devices, ports and GIDs as value types. Values a device reports that this header
/// does not know (a newer MTU, link layer or GID type) map to `unknown`, never to UB.
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

/// A path MTU: `b256` ... `b4096` are the verbs values IBV_MTU_256 ... IBV_MTU_4096.
enum class Mtu : std::uint8_t { unknown = 0, b256 = 1, b512, b1024, b2048, b4096 };
/// The Mtu of a verbs `ibv_mtu` value; `unknown` for a value outside IBV_MTU_256 ... 4096.
Mtu mtu_from_verbs(int value) noexcept;
/// The MTU in bytes (256 ... 4096); 0 for `Mtu::unknown`.
std::uint32_t mtu_bytes(Mtu mtu) noexcept;

/// A port's logical state, as `ibv_port_state` (`unknown`: IBV_PORT_NOP or a newer value).
enum class PortState : std::uint8_t { unknown, down, init, armed, active, active_defer };
/// What a port runs on: InfiniBand, or Ethernet (RoCE).
enum class LinkLayer : std::uint8_t { unknown, infiniband, ethernet };
/// The type of a GID table entry: InfiniBand, RoCE v1 or RoCE v2.
enum class GidType : std::uint8_t { unknown, ib, roce_v1, roce_v2 };

std::string_view to_string(Mtu mtu) noexcept;          ///< "256" ... "4096", or "unknown".
std::string_view to_string(PortState state) noexcept;  ///< "DOWN", "ACTIVE", ..., or "unknown".
std::string_view to_string(LinkLayer layer) noexcept;  ///< "InfiniBand", "Ethernet" or "unknown".
std::string_view to_string(GidType type) noexcept;     ///< "IB", "RoCE v1", "RoCE v2" or "unknown".

/// A 128-bit GID in network byte order, as on the wire. Formats with fmt as to_string()
/// writes it.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe to read concurrently.
struct Gid {
    std::array<std::uint8_t, 16> bytes{}; ///< Most significant first.

    static Gid from_verbs(const ibv_gid& gid) noexcept; ///< The same bytes as a Gid.
    ibv_gid to_verbs() const noexcept;                  ///< The same bytes as an `ibv_gid`.

    /// All bytes zero: no GID (an unused table entry, or none sent on InfiniBand).
    bool is_zero() const noexcept;
    /// Whether it is \::ffff:a.b.c.d, the form RoCE v2 uses for an IPv4 address.
    bool is_ipv4_mapped() const noexcept;
    /// "fe80:0000:...:0001", the notation of sysfs and `ibv_devinfo -v`.
    std::string to_string() const;

    /// Equal bytes.
    friend bool operator==(const Gid&, const Gid&) = default;
};

/// An entry of a port's GID table (Context::query_gids, Context::choose_gid).
struct GidEntry {
    Gid gid{};                        ///< The GID.
    std::uint32_t index = 0;          ///< Its index in the port's table.
    std::uint8_t port = 0;            ///< The port, from 1.
    GidType type = GidType::unknown;  ///< IB, RoCE v1 or RoCE v2.
    std::uint32_t netdev_ifindex = 0; ///< The network interface it belongs to; 0 on InfiniBand.
};

/// The highest GID index a QP or an address handle can use: ibv_ah_attr's sgid_index
/// holds 8 bits. A table may be longer (rxe's has 1024 entries).
inline constexpr std::uint32_t max_usable_gid_index = 255;

/// A port, as ibv_query_port reports it (Context::query_port).
struct PortAttributes {
    std::uint8_t number = 0;                   ///< The port, from 1.
    PortState state = PortState::unknown;      ///< Its logical state.
    Mtu max_mtu = Mtu::unknown;                ///< The largest MTU it supports.
    Mtu active_mtu = Mtu::unknown;             ///< The MTU in use (what an Endpoint carries).
    LinkLayer link_layer = LinkLayer::unknown; ///< InfiniBand or Ethernet (RoCE).
    std::uint16_t lid = 0;                     ///< The port's LID, host order; 0 on RoCE.
    std::int32_t gid_table_len = 0;            ///< Entries in its GID table, valid or not.
    ibv_port_attr raw{};                       ///< Every other field, as the device reported it.
};

/// A device's attributes, read once when its Context is opened (Context::attributes).
struct DeviceAttributes {
    std::string firmware{};           ///< The firmware version.
    std::uint64_t node_guid = 0;      ///< The node GUID, host order.
    std::uint32_t vendor_id = 0;      ///< The IEEE vendor ID.
    std::uint32_t vendor_part_id = 0; ///< The vendor's part ID.
    std::uint8_t port_count = 0;      ///< Physical ports, numbered from 1.
    bool atomics = false;             ///< Executes atomics: IBV_ATOMIC_HCA or IBV_ATOMIC_GLOB.
    /// Has memory windows bound by a work request (MemoryWindow): type 2A or 2B.
    bool type2_windows = false;
    /// The limits (max_qp_wr, max_sge, ...) and every other field, as ibv_query_device
    /// reported them.
    ibv_device_attr raw{};
};

/// An entry of the device list; open it with `Context::open(info.name)`.
struct DeviceInfo {
    std::string name{};      ///< The device's name (mlx5_0, rxe0, ...).
    std::uint64_t guid = 0;  ///< The node GUID, host order.
    std::string transport{}; ///< "InfiniBand", "iWARP", "usNIC", ... or "unknown".
};

/// The RDMA devices present, in the order of ibv_get_device_list.
///
/// @errors ibv_get_device_list fails (no RDMA support in the kernel, permissions,
/// memory).
Result<std::vector<DeviceInfo>> list_devices();

/// The GID an application should use on a port: on RoCE (Ethernet) the RoCE v2 entry
/// with an IPv4-mapped address (routable, the common deployment), else any RoCE v2
/// entry, else the first RoCE v1 entry; on InfiniBand index 0, the port GID (paired
/// with the LID). Entries above max_usable_gid_index are passed over. nullopt when the
/// table has no usable entry.
std::optional<GidEntry> preferred_gid(LinkLayer layer, const std::vector<GidEntry>& table);

} // namespace rdmaxx

/// @cond
// A GID formats as Gid::to_string() writes it.
template <>
struct fmt::formatter<rdmaxx::Gid> : fmt::formatter<std::string_view> {
    auto format(const rdmaxx::Gid& gid, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(gid.to_string(), ctx);
    }
};
/// @endcond
