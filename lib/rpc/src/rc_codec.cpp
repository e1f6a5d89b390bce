#include "rc_codec.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <rdmaxx/wrap/device.hpp>
#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::rpc::detail {
namespace {

Error bad(const char* call, std::string what) { return Error::protocol(call, std::move(what)); }

} // namespace

std::array<std::byte, rc_message_bytes> encode(const RcMessage& m) noexcept {
    std::array<std::byte, rc_message_bytes> out{};
    std::byte* at = out.data();
    wire::put(at, rc_magic, 4);
    wire::put(at + 4, rc_version, 2);
    wire::put(at + 6, rc_message_bytes, 2);
    wire::put(at + 8, static_cast<std::uint8_t>(m.kind), 1);
    if (m.kind == RcMessage::Kind::goodbye || m.kind == RcMessage::Kind::still_here)
        return out;
    wire::put(at + 9, m.available ? 0 : 1, 1);
    if (!m.available)
        return out;
    wire::put(at + 12, m.qp.qpn, 4);
    wire::put(at + 16, m.qp.psn, 4);
    std::memcpy(at + 20, m.qp.gid.bytes.data(), m.qp.gid.bytes.size());
    wire::put(at + 36, m.qp.lid, 2);
    wire::put(at + 38, static_cast<std::uint8_t>(m.qp.mtu), 1);
    wire::put(at + 10, m.whole_max, 2);
    wire::put(at + 39, m.whole_receives, 1);
    return out;
}

Result<std::size_t> decode_rc_prefix(std::span<const std::byte, rc_prefix_bytes> prefix) {
    constexpr const char* call = "rpc::decode_rc_prefix";
    if (wire::get(prefix.data(), 4) != rc_magic)
        return std::unexpected(bad(call, "wrong magic: not an rdmaxx RC setup message"));
    if (const auto version = wire::get(prefix.data() + 4, 2); version != rc_version)
        return std::unexpected(bad(call, fmt::format("version {} (this build speaks {})", version, rc_version)));
    if (const auto length = wire::get(prefix.data() + 6, 2); length != rc_message_bytes)
        return std::unexpected(bad(call, fmt::format("length {}, not {}", length, rc_message_bytes)));
    return rc_message_bytes;
}

Result<RcMessage> decode_rc(std::span<const std::byte> bytes) {
    constexpr const char* call = "rpc::decode_rc";
    if (bytes.size() != rc_message_bytes)
        return std::unexpected(bad(call, fmt::format("{} bytes, not {}", bytes.size(), rc_message_bytes)));
    if (auto prefix = decode_rc_prefix(bytes.first<rc_prefix_bytes>()); !prefix)
        return std::unexpected(std::move(prefix.error()));
    const std::byte* at = bytes.data();
    const auto kind = wire::get(at + 8, 1);
    const auto status = wire::get(at + 9, 1);
    if (kind < 1 || kind > 4)
        return std::unexpected(bad(call, fmt::format("kind {} is unknown", kind)));
    if (kind >= 3) { // a goodbye or a still-here: the kind alone
        if (std::any_of(at + 9, at + rc_message_bytes, [](std::byte b) { return b != std::byte{0}; }))
            return std::unexpected(
                bad(call, fmt::format("a {} with more than its kind", kind == 3 ? "goodbye" : "still-here")));
        return RcMessage{.kind = static_cast<RcMessage::Kind>(kind), .available = false, .qp = {}};
    }
    if (status > 1 || (status == 1 && kind == 1))
        return std::unexpected(bad(call, fmt::format("status {} for kind {}", status, kind)));
    const auto whole_max = static_cast<std::uint16_t>(wire::get(at + 10, 2));
    const auto whole_receives = static_cast<std::uint8_t>(wire::get(at + 39, 1));
    if ((whole_max != 0 || whole_receives != 0) && (kind != 2 || status != 0))
        return std::unexpected(bad(call, "whole requests offered by other than an available answer"));
    if ((whole_max == 0) != (whole_receives == 0))
        return std::unexpected(bad(call, fmt::format("whole requests of up to {} bytes, {} at once", whole_max,
                                                     whole_receives)));
    RcMessage m{.kind = static_cast<RcMessage::Kind>(kind),
                .available = status == 0,
                .qp = {},
                .whole_max = whole_max,
                .whole_receives = whole_receives};
    if (!m.available) {
        if (std::any_of(at + 12, at + rc_message_bytes, [](std::byte b) { return b != std::byte{0}; }))
            return std::unexpected(bad(call, "an unavailable answer with a QP"));
        return m;
    }
    m.qp.qpn = static_cast<std::uint32_t>(wire::get(at + 12, 4));
    m.qp.psn = static_cast<std::uint32_t>(wire::get(at + 16, 4));
    std::memcpy(m.qp.gid.bytes.data(), at + 20, m.qp.gid.bytes.size());
    m.qp.lid = static_cast<std::uint16_t>(wire::get(at + 36, 2));
    const auto mtu = static_cast<int>(wire::get(at + 38, 1));
    if (m.qp.qpn > 0xffffff || m.qp.psn > 0xffffff)
        return std::unexpected(bad(call, fmt::format("QPN {:#x} or PSN {:#x} wider than 24 bits", m.qp.qpn, m.qp.psn)));
    if (mtu_from_verbs(mtu) == Mtu::unknown)
        return std::unexpected(bad(call, fmt::format("MTU code {} is not an MTU", mtu)));
    m.qp.mtu = static_cast<Mtu>(mtu);
    return m;
}

std::array<std::byte, request_descriptor_bytes> encode_request_head(const RemoteMemory& request,
                                                                    const RemoteMemory& response) noexcept {
    std::array<std::byte, request_descriptor_bytes> out{};
    const auto r = request.serialize();
    const auto w = response.serialize();
    std::memcpy(out.data(), r.data(), r.size());
    std::memcpy(out.data() + RemoteMemory::wire_size, w.data(), w.size());
    return out;
}

Result<RequestDescriptor> decode_request_descriptor(std::span<const std::byte> message, std::uint32_t max_request,
                                                    std::uint32_t max_response) {
    constexpr const char* call = "rpc::decode_request_descriptor";
    if (message.size() < request_descriptor_bytes)
        return std::unexpected(
            bad(call, fmt::format("{} bytes: shorter than a descriptor's {}", message.size(), request_descriptor_bytes)));
    auto request = RemoteMemory::parse(message.first(RemoteMemory::wire_size));
    if (!request)
        return std::unexpected(std::move(request.error()));
    auto response = RemoteMemory::parse(message.subspan(RemoteMemory::wire_size, RemoteMemory::wire_size));
    if (!response)
        return std::unexpected(std::move(response.error()));
    const auto inline_request = message.subspan(request_descriptor_bytes);
    if (request->length != 0 && !inline_request.empty())
        return std::unexpected(bad(call, "memory to read and an inline request both"));
    if (request->length > max_request || inline_request.size() > max_request)
        return std::unexpected(bad(call, fmt::format("a {}-byte request, the session's most is {}",
                                                     std::max<std::uint64_t>(request->length, inline_request.size()),
                                                     max_request)));
    if (response->length > max_response)
        return std::unexpected(bad(call, fmt::format("{} bytes offered for the response, the session's most is {}",
                                                     response->length, max_response)));
    return RequestDescriptor{.request = *request, .response = *response, .inline_request = inline_request};
}

std::uint32_t encode_written(const WrittenResponse& written, std::source_location where) {
    require(written.slot < 1024 && written.round < 64, where, "a written response's slot {} or round {} past its bits",
            written.slot, written.round);
    return std::uint32_t{written.session} << 16 | written.slot << 6 | written.round;
}

WrittenResponse decode_written(std::uint32_t imm) noexcept {
    return {.session = static_cast<std::uint16_t>(imm >> 16),
            .slot = (imm >> 6) & 0x3ff,
            .round = static_cast<std::uint8_t>(imm & 0x3f)};
}

std::array<std::byte, response_descriptor_bytes> encode_response_descriptor(std::uint32_t size) noexcept {
    std::array<std::byte, response_descriptor_bytes> out{};
    wire::put(out.data(), size, 4);
    return out;
}

Result<std::uint32_t> decode_response_descriptor(std::span<const std::byte> message) {
    if (message.size() != response_descriptor_bytes)
        return std::unexpected(bad("rpc::decode_response_descriptor",
                                   fmt::format("{} bytes, not {}", message.size(), response_descriptor_bytes)));
    return static_cast<std::uint32_t>(wire::get(message.data(), 4));
}

} // namespace rdmaxx::rpc::detail
