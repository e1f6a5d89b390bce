#include <rdmaxx/ctrl/endpoint_codec.hpp>

#include <algorithm>

#include <fmt/format.h>

#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::endpoint_codec {
namespace {

// Appends big-endian integers.
struct Writer {
    std::vector<std::byte>& out;
    void put(std::uint64_t value, int bytes) {
        out.resize(out.size() + static_cast<std::size_t>(bytes));
        wire::put(out.data() + out.size() - static_cast<std::size_t>(bytes), value, bytes);
    }
    void put(std::span<const std::byte> bytes) { out.insert(out.end(), bytes.begin(), bytes.end()); }
};

// Reads big-endian integers; every read is bounds-checked by the caller's length
// checks first, and again here.
struct Reader {
    std::span<const std::byte> in;
    std::size_t at = 0;
    bool has(std::size_t n) const { return in.size() - at >= n; }
    std::uint64_t get(int bytes) {
        const std::uint64_t value = wire::get(in.data() + at, bytes);
        at += static_cast<std::size_t>(bytes);
        return value;
    }
    std::span<const std::byte> take(std::size_t n) {
        auto part = in.subspan(at, n);
        at += n;
        return part;
    }
};

Error bad(std::string what) { return Error::protocol("endpoint_codec::decode", std::move(what)); }

} // namespace

std::vector<std::byte> encode(const EndpointMessage& message, std::source_location where) {
    require(!message.qps.empty() && message.qps.size() <= max_qps, where, "an endpoint message with {} QPs (1..{})",
            message.qps.size(), max_qps);
    require(message.metadata.size() <= max_metadata, where, "{} bytes of metadata (at most {})",
            message.metadata.size(), max_metadata);
    const std::size_t body = 4 + message.qps.size() * qp_size + 4 + message.metadata.size();
    std::vector<std::byte> out;
    out.reserve(header_size + body);
    Writer w{out};
    w.put(magic);
    w.put(version, 2);
    w.put(0, 2);
    w.put(body, 4);
    w.put(message.qps.size(), 2);
    w.put(0, 2);
    for (const PeerQp& qp : message.qps) {
        w.put(qp.endpoint.qpn, 4);
        w.put(qp.endpoint.psn, 4);
        w.put(std::as_bytes(std::span(qp.endpoint.gid.bytes)));
        w.put(qp.endpoint.lid, 2);
        w.put(static_cast<std::uint8_t>(qp.endpoint.mtu), 1);
        w.put(static_cast<std::uint8_t>(qp.type), 1);
    }
    w.put(message.metadata.size(), 4);
    w.put(message.metadata);
    return out;
}

Result<std::size_t> body_length(std::span<const std::byte, header_size> header) {
    Reader r{header};
    if (!std::equal(magic.begin(), magic.end(), r.take(4).begin()))
        return std::unexpected(bad("wrong magic: not an rdmaxx endpoint message"));
    if (const auto v = r.get(2); v != version)
        return std::unexpected(bad(fmt::format("version {} is not supported (this build speaks {})", v, version)));
    if (const auto flags = r.get(2); flags != 0)
        return std::unexpected(bad(fmt::format("unknown flags {:#x}", flags)));
    const std::size_t body = r.get(4);
    if (body < 8 || body > max_body)
        return std::unexpected(bad(fmt::format("body length {} outside 8..{}", body, max_body)));
    return body;
}

Result<EndpointMessage> decode(std::span<const std::byte> bytes) {
    if (bytes.size() < header_size)
        return std::unexpected(bad(fmt::format("{} bytes: shorter than the {}-byte header", bytes.size(), header_size)));
    auto body = body_length(bytes.first<header_size>());
    if (!body)
        return std::unexpected(std::move(body.error()));
    if (bytes.size() != header_size + *body)
        return std::unexpected(bad(fmt::format("{} bytes, the header announces {}", bytes.size(), header_size + *body)));
    Reader r{bytes.subspan(header_size)};
    const std::size_t count = r.get(2);
    if (r.get(2) != 0)
        return std::unexpected(bad("reserved field is not 0"));
    if (count == 0 || count > max_qps)
        return std::unexpected(bad(fmt::format("{} QPs (1..{})", count, max_qps)));
    if (!r.has(count * qp_size + 4))
        return std::unexpected(bad(fmt::format("body too short for {} QPs", count)));
    EndpointMessage message;
    message.qps.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
        PeerQp qp;
        qp.endpoint.qpn = static_cast<std::uint32_t>(r.get(4));
        qp.endpoint.psn = static_cast<std::uint32_t>(r.get(4));
        const auto gid = r.take(16);
        std::transform(gid.begin(), gid.end(), qp.endpoint.gid.bytes.begin(),
                       [](std::byte b) { return static_cast<std::uint8_t>(b); });
        qp.endpoint.lid = static_cast<std::uint16_t>(r.get(2));
        const auto mtu = r.get(1);
        const auto type = r.get(1);
        if (qp.endpoint.qpn > 0xffffff || qp.endpoint.psn > 0xffffff)
            return std::unexpected(bad(fmt::format("QP {}: QPN or PSN wider than 24 bits", i)));
        if (mtu_from_verbs(static_cast<int>(mtu)) == Mtu::unknown)
            return std::unexpected(bad(fmt::format("QP {}: MTU code {} is not an MTU", i, mtu)));
        if (type > static_cast<std::uint8_t>(QpType::ud))
            return std::unexpected(bad(fmt::format("QP {}: QP type code {} is unknown", i, type)));
        qp.endpoint.mtu = static_cast<Mtu>(mtu);
        qp.type = static_cast<QpType>(type);
        message.qps.push_back(qp);
    }
    const std::size_t metadata = r.get(4);
    if (r.in.size() - r.at != metadata)
        return std::unexpected(
            bad(fmt::format("metadata length {} but {} bytes follow", metadata, r.in.size() - r.at)));
    const auto blob = r.take(metadata);
    message.metadata.assign(blob.begin(), blob.end());
    return message;
}

} // namespace rdmaxx::endpoint_codec
