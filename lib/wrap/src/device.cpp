#include <rdmaxx/wrap/device.hpp>

#include <algorithm>
#include <memory>

#include <endian.h>
#include <fmt/format.h>

namespace rdmaxx {

Mtu mtu_from_verbs(int value) noexcept {
    return value >= IBV_MTU_256 && value <= IBV_MTU_4096 ? static_cast<Mtu>(value) : Mtu::unknown;
}

std::uint32_t mtu_bytes(Mtu mtu) noexcept {
    return mtu == Mtu::unknown ? 0 : 128u << static_cast<unsigned>(mtu);
}

std::string_view to_string(Mtu mtu) noexcept {
    switch (mtu) {
    case Mtu::b256: return "256";
    case Mtu::b512: return "512";
    case Mtu::b1024: return "1024";
    case Mtu::b2048: return "2048";
    case Mtu::b4096: return "4096";
    case Mtu::unknown: break;
    }
    return "unknown";
}

std::string_view to_string(PortState state) noexcept {
    switch (state) {
    case PortState::down: return "DOWN";
    case PortState::init: return "INIT";
    case PortState::armed: return "ARMED";
    case PortState::active: return "ACTIVE";
    case PortState::active_defer: return "ACTIVE_DEFER";
    case PortState::unknown: break;
    }
    return "unknown";
}

std::string_view to_string(LinkLayer layer) noexcept {
    switch (layer) {
    case LinkLayer::infiniband: return "InfiniBand";
    case LinkLayer::ethernet: return "Ethernet";
    case LinkLayer::unknown: break;
    }
    return "unknown";
}

std::string_view to_string(GidType type) noexcept {
    switch (type) {
    case GidType::ib: return "IB";
    case GidType::roce_v1: return "RoCE v1";
    case GidType::roce_v2: return "RoCE v2";
    case GidType::unknown: break;
    }
    return "unknown";
}

Gid Gid::from_verbs(const ibv_gid& gid) noexcept {
    Gid g;
    std::copy_n(gid.raw, g.bytes.size(), g.bytes.begin());
    return g;
}

ibv_gid Gid::to_verbs() const noexcept {
    ibv_gid gid;
    std::copy(bytes.begin(), bytes.end(), gid.raw);
    return gid;
}

bool Gid::is_zero() const noexcept {
    return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

bool Gid::is_ipv4_mapped() const noexcept {
    return std::all_of(bytes.begin(), bytes.begin() + 10, [](std::uint8_t b) { return b == 0; }) &&
           bytes[10] == 0xff && bytes[11] == 0xff;
}

std::string Gid::to_string() const {
    std::string text;
    for (std::size_t i = 0; i < bytes.size(); i += 2)
        fmt::format_to(std::back_inserter(text), "{}{:02x}{:02x}", i == 0 ? "" : ":", bytes[i], bytes[i + 1]);
    return text;
}

Result<std::vector<DeviceInfo>> list_devices() {
    int count = 0;
    std::unique_ptr<ibv_device*[], decltype(&ibv_free_device_list)> list(ibv_get_device_list(&count),
                                                                          &ibv_free_device_list);
    if (!list)
        return std::unexpected(Error::from_last_errno("ibv_get_device_list"));
    std::vector<DeviceInfo> devices;
    devices.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
        ibv_device* dev = list[i];
        const char* transport = "unknown";
        switch (dev->transport_type) {
        case IBV_TRANSPORT_IB: transport = "InfiniBand"; break;
        case IBV_TRANSPORT_IWARP: transport = "iWARP"; break;
        case IBV_TRANSPORT_USNIC: transport = "usNIC"; break;
        case IBV_TRANSPORT_USNIC_UDP: transport = "usNIC UDP"; break;
        case IBV_TRANSPORT_UNSPECIFIED: transport = "unspecified"; break;
        default: break;
        }
        devices.push_back({ibv_get_device_name(dev), be64toh(ibv_get_device_guid(dev)), transport});
    }
    return devices;
}

std::optional<GidEntry> preferred_gid(LinkLayer layer, const std::vector<GidEntry>& table) {
    const auto first = [&](auto&& wanted) -> std::optional<GidEntry> {
        const auto it = std::find_if(table.begin(), table.end(),
                                     [&](const GidEntry& e) {
                                         return !e.gid.is_zero() && e.index <= max_usable_gid_index && wanted(e);
                                     });
        return it == table.end() ? std::nullopt : std::optional(*it);
    };
    if (layer == LinkLayer::infiniband)
        return first([](const GidEntry& e) { return e.index == 0; });
    if (auto e = first([](const GidEntry& e) { return e.type == GidType::roce_v2 && e.gid.is_ipv4_mapped(); }))
        return e;
    if (auto e = first([](const GidEntry& e) { return e.type == GidType::roce_v2; }))
        return e;
    return first([](const GidEntry& e) { return e.type == GidType::roce_v1; });
}

} // namespace rdmaxx
