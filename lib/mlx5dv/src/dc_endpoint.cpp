#include <rdmaxx/mlx5dv/dc_endpoint.hpp>

#include <algorithm>

#include <fmt/format.h>

#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::mlx5 {
namespace {

constexpr std::uint32_t max_dctn = 0xffffff;

Error malformed(std::string what) { return Error::protocol("DcEndpoint::parse", std::move(what)); }

} // namespace

DcEndpoint::Wire DcEndpoint::serialize(std::source_location where) const {
    require(dctn <= max_dctn, where, "DCT number {:#x} is wider than 24 bits", dctn);
    require(mtu != Mtu::unknown, where, "DcEndpoint with an unknown MTU");
    Wire wire{};
    wire::put(wire.data(), dctn, 4);
    wire::put(wire.data() + 4, dc_key, 8);
    std::transform(gid.bytes.begin(), gid.bytes.end(), wire.begin() + 12,
                   [](std::uint8_t b) { return static_cast<std::byte>(b); });
    wire::put(wire.data() + 28, lid, 2);
    wire::put(wire.data() + 30, static_cast<std::uint8_t>(mtu), 1);
    return wire; // byte 31 stays 0: reserved
}

Result<DcEndpoint> DcEndpoint::parse(std::span<const std::byte> bytes) {
    if (bytes.size() != wire_size)
        return std::unexpected(malformed(fmt::format("{} bytes, a DC endpoint takes {}", bytes.size(), wire_size)));
    DcEndpoint endpoint;
    const std::uint64_t dctn = wire::get(bytes.data(), 4);
    if (dctn > max_dctn)
        return std::unexpected(malformed(fmt::format("DCT number {:#x} is wider than 24 bits", dctn)));
    endpoint.dctn = static_cast<std::uint32_t>(dctn);
    endpoint.dc_key = wire::get(bytes.data() + 4, 8);
    std::transform(bytes.begin() + 12, bytes.begin() + 28, endpoint.gid.bytes.begin(),
                   [](std::byte b) { return static_cast<std::uint8_t>(b); });
    endpoint.lid = static_cast<std::uint16_t>(wire::get(bytes.data() + 28, 2));
    const auto mtu = static_cast<int>(wire::get(bytes.data() + 30, 1));
    endpoint.mtu = mtu_from_verbs(mtu);
    if (endpoint.mtu == Mtu::unknown)
        return std::unexpected(malformed(fmt::format("MTU code {} is not an MTU", mtu)));
    if (const auto reserved = wire::get(bytes.data() + 31, 1); reserved != 0)
        return std::unexpected(malformed(fmt::format("reserved byte is {:#x}, not 0", reserved)));
    if (endpoint.gid.is_zero() && endpoint.lid == 0)
        return std::unexpected(malformed("neither a GID nor a LID: the DCT cannot be reached"));
    return endpoint;
}

} // namespace rdmaxx::mlx5
