// devinfo: every RDMA device, its ports and GID table, and the GID rdmaxx would pick
// (like ibv_devinfo, on the wrap layer alone).
//
//   devinfo [DEVICE]      (default: every device)
#include <cstdio>
#include <string_view>

#include <fmt/format.h>

#include <rdmaxx/wrap/context.hpp>

namespace {

bool show(const rdmaxx::DeviceInfo& info) {
    auto context = rdmaxx::Context::open(info.name);
    if (!context) {
        fmt::print(stderr, "devinfo: {}\n", context.error());
        return false;
    }
    const rdmaxx::DeviceAttributes& attrs = context->attributes();
    fmt::print("{}: transport {}, node GUID {:016x}, firmware '{}', vendor {:#x}/{}, {} port(s), atomics {}\n",
               info.name, info.transport, attrs.node_guid, attrs.firmware, attrs.vendor_id, attrs.vendor_part_id,
               attrs.port_count, attrs.atomics ? "yes" : "no");
    auto gids = context->query_gids();
    if (!gids) {
        fmt::print(stderr, "devinfo: {}\n", gids.error());
        return false;
    }
    bool ok = true;
    for (std::uint8_t port = 1; port <= attrs.port_count; ++port) {
        auto p = context->query_port(port);
        if (!p) {
            fmt::print(stderr, "devinfo: {}\n", p.error());
            ok = false;
            continue;
        }
        fmt::print("  port {}: {}, link layer {}, active MTU {} (max {}), LID {}\n", port, to_string(p->state),
                   to_string(p->link_layer), to_string(p->active_mtu), to_string(p->max_mtu), p->lid);
        auto chosen = context->choose_gid(port);
        for (const rdmaxx::GidEntry& e : *gids) {
            if (e.port != port)
                continue;
            const bool picked = chosen && chosen->index == e.index;
            fmt::print("    GID[{}] {} {}{}\n", e.index, e.gid.to_string(), to_string(e.type),
                       picked ? "  <- chosen" : "");
        }
        if (chosen)
            fmt::print("  port {} chosen GID index {}: {} ({})\n", port, chosen->index, chosen->gid.to_string(),
                       to_string(chosen->type));
        else
            fmt::print("  port {} has no usable GID: {}\n", port, chosen.error());
    }
    return ok;
}

} // namespace

int main(int argc, char** argv) {
    auto devices = rdmaxx::list_devices();
    if (!devices) {
        fmt::print(stderr, "devinfo: {}\n", devices.error());
        return 1;
    }
    if (devices->empty()) {
        fmt::print(stderr, "devinfo: no RDMA device found\n");
        return 1;
    }
    const std::string_view only = argc > 1 ? argv[1] : "";
    bool ok = true;
    bool found = only.empty();
    for (const rdmaxx::DeviceInfo& info : *devices) {
        if (!only.empty() && info.name != only)
            continue;
        found = true;
        ok = show(info) && ok;
    }
    if (!found) {
        fmt::print(stderr, "devinfo: no device named '{}'\n", only);
        return 1;
    }
    return ok ? 0 : 1;
}
