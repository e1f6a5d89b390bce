#include <rdmaxx/wrap/context.hpp>

#include <charconv>
#include <cstdlib>
#include <memory>
#include <span>

#include <endian.h>
#include <fmt/format.h>

#include <rdmaxx/wrap/handle.hpp>
#include "path.hpp"

namespace rdmaxx {
namespace detail {

DeviceState::~DeviceState() {
    if (const int rc = ibv_close_device(context); rc != 0)
        logger()->error("{}", Error::from_last_errno("ibv_close_device", "{}", name));
}

} // namespace detail

namespace {

std::string_view getenv_view(const char* name) {
    const char* value = std::getenv(name);
    return value ? std::string_view(value) : std::string_view();
}

DeviceAttributes to_attributes(const ibv_device_attr& raw) {
    return {
        .firmware = raw.fw_ver,
        .node_guid = be64toh(raw.node_guid),
        .vendor_id = raw.vendor_id,
        .vendor_part_id = raw.vendor_part_id,
        .port_count = raw.phys_port_cnt,
        .atomics = raw.atomic_cap == IBV_ATOMIC_HCA || raw.atomic_cap == IBV_ATOMIC_GLOB,
        .type2_windows = (raw.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0,
        .raw = raw,
    };
}

GidType gid_type_from_verbs(std::uint32_t type) {
    switch (type) {
    case IBV_GID_TYPE_IB: return GidType::ib;
    case IBV_GID_TYPE_ROCE_V1: return GidType::roce_v1;
    case IBV_GID_TYPE_ROCE_V2: return GidType::roce_v2;
    default: return GidType::unknown;
    }
}

} // namespace

Result<Context> Context::open(std::string_view name) {
    if (name.empty())
        name = getenv_view(device_env);
    int count = 0;
    std::unique_ptr<ibv_device*[], decltype(&ibv_free_device_list)> list(ibv_get_device_list(&count),
                                                                          &ibv_free_device_list);
    if (!list)
        return std::unexpected(Error::from_last_errno("ibv_get_device_list"));
    ibv_device* chosen = nullptr;
    std::string present;
    for (int i = 0; i < count; ++i) {
        const std::string_view dev_name = ibv_get_device_name(list[i]);
        fmt::format_to(std::back_inserter(present), "{}{}", present.empty() ? "" : ", ", dev_name);
        if (!chosen && (name.empty() || dev_name == name))
            chosen = list[i];
    }
    if (!chosen) {
        return std::unexpected(Error::from_errno(
            "ibv_get_device_list", ENODEV,
            name.empty() ? std::string("no RDMA device found")
                         : fmt::format("no RDMA device named '{}' (present: {})", name,
                                       present.empty() ? "none" : present)));
    }
    ibv_context* context = ibv_open_device(chosen);
    if (!context)
        return std::unexpected(Error::from_last_errno("ibv_open_device", "{}", ibv_get_device_name(chosen)));
    return adopt(context);
}

Result<Context> Context::adopt(ibv_context* context, std::source_location where) {
    require(context != nullptr, where, "Context::adopt of a null ibv_context");
    // from here on the state owns the context and closes it on every path
    std::shared_ptr<detail::DeviceState> state(new detail::DeviceState{
        .context = context, .name = ibv_get_device_name(context->device), .attributes = {}});
    ibv_device_attr raw{};
    if (const int rc = ibv_query_device(context, &raw); rc != 0)
        return std::unexpected(Error::from_errno("ibv_query_device", rc, state->name));
    state->attributes = to_attributes(raw);
    return Context(std::move(state));
}

const std::string& Context::name(std::source_location where) const {
    return detail::live(device_, "Context", where)->name;
}

const DeviceAttributes& Context::attributes(std::source_location where) const {
    return detail::live(device_, "Context", where)->attributes;
}


const detail::DeviceHandle& Context::handle(std::source_location where) const {
    return detail::live(device_, "Context", where);
}

namespace detail {

Result<PortAttributes> query_port(const DeviceState& device, std::uint8_t port) {
    ibv_port_attr raw{};
    if (const int rc = ibv_query_port(device.context, port, &raw); rc != 0)
        return std::unexpected(Error::from_errno("ibv_query_port", rc, fmt::format("{} port {}", device.name, port)));
    PortAttributes attrs{.number = port, .raw = raw};
    attrs.state = raw.state >= IBV_PORT_DOWN && raw.state <= IBV_PORT_ACTIVE_DEFER
                      ? static_cast<PortState>(raw.state)
                      : PortState::unknown;
    attrs.max_mtu = mtu_from_verbs(raw.max_mtu);
    attrs.active_mtu = mtu_from_verbs(raw.active_mtu);
    attrs.link_layer = raw.link_layer == IBV_LINK_LAYER_INFINIBAND ? LinkLayer::infiniband
                       : raw.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::ethernet
                                                                   : LinkLayer::unknown;
    attrs.lid = raw.lid;
    attrs.gid_table_len = raw.gid_tbl_len;
    return attrs;
}

Result<std::vector<GidEntry>> query_gids(const DeviceState& device) {
    std::size_t capacity = 0;
    for (std::uint8_t port = 1; port <= device.attributes.port_count; ++port) {
        auto attrs = query_port(device, port);
        if (!attrs)
            return std::unexpected(attrs.error());
        capacity += static_cast<std::size_t>(std::max(attrs->gid_table_len, 0));
    }
    std::vector<ibv_gid_entry> raw(capacity);
    const ssize_t n = ibv_query_gid_table(device.context, raw.data(), raw.size(), 0);
    if (n < 0)
        return std::unexpected(Error::from_errno("ibv_query_gid_table", static_cast<int>(-n), device.name));
    std::vector<GidEntry> table;
    table.reserve(static_cast<std::size_t>(n));
    for (const ibv_gid_entry& e : std::span(raw.data(), static_cast<std::size_t>(n))) {
        table.push_back({.gid = Gid::from_verbs(e.gid),
                         .index = e.gid_index,
                         .port = static_cast<std::uint8_t>(e.port_num),
                         .type = gid_type_from_verbs(e.gid_type),
                         .netdev_ifindex = e.ndev_ifindex});
    }
    return table;
}

Result<void> check_gid_index(std::uint32_t index, const char* operation) {
    if (index > max_usable_gid_index)
        return std::unexpected(Error::from_errno(
            operation, EINVAL,
            fmt::format("GID index {} is above {} (ibv_ah_attr's sgid_index holds 8 bits)", index,
                        max_usable_gid_index)));
    return {};
}

Result<GidEntry> choose_gid(const DeviceState& device, std::uint8_t port, std::optional<std::uint32_t> index) {
    if (!index) {
        const std::string_view env = getenv_view(gid_index_env);
        if (!env.empty()) {
            std::uint32_t value = 0;
            const auto [end, ec] = std::from_chars(env.data(), env.data() + env.size(), value);
            if (ec != std::errc() || end != env.data() + env.size())
                return std::unexpected(Error::from_errno(
                    "choose_gid", EINVAL, fmt::format("${}='{}' is not a GID index", gid_index_env, env)));
            index = value;
        }
    }
    auto attrs = query_port(device, port);
    if (!attrs)
        return std::unexpected(attrs.error());
    auto table = query_gids(device);
    if (!table)
        return std::unexpected(table.error());
    std::erase_if(*table, [&](const GidEntry& e) { return e.port != port; });
    if (index) {
        if (auto ok = detail::check_gid_index(*index, "choose_gid"); !ok)
            return std::unexpected(std::move(ok.error()));
        for (const GidEntry& e : *table)
            if (e.index == *index && !e.gid.is_zero())
                return e;
        return std::unexpected(Error::from_errno(
            "choose_gid", EINVAL, fmt::format("{} port {} has no valid GID at index {}", device.name, port, *index)));
    }
    if (auto e = preferred_gid(attrs->link_layer, *table))
        return *e;
    return std::unexpected(
        Error::from_errno("choose_gid", ENOENT, fmt::format("{} port {} has no usable GID", device.name, port)));
}

} // namespace detail

Result<PortAttributes> Context::query_port(std::uint8_t port, std::source_location where) const {
    return detail::query_port(*handle(where), port);
}

Result<std::vector<GidEntry>> Context::query_gids(std::source_location where) const {
    return detail::query_gids(*handle(where));
}

Result<GidEntry> Context::choose_gid(std::uint8_t port, std::optional<std::uint32_t> index,
                                     std::source_location where) const {
    return detail::choose_gid(*handle(where), port, index);
}

} // namespace rdmaxx
