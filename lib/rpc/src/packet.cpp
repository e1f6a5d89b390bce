#include "packet.hpp"

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::rpc::detail {
namespace {

constexpr std::uint8_t flag_rdma = 1;
constexpr std::uint8_t flag_whole = 2;
constexpr std::uint8_t flag_probe = 4;

bool known_kind(std::uint8_t raw) noexcept {
    return raw >= static_cast<std::uint8_t>(Kind::request) && raw <= static_cast<std::uint8_t>(Kind::in_progress);
}

// Whether a packet of `kind` may carry status `raw` (table in packet.hpp).
bool status_fits(Kind kind, std::uint8_t raw) noexcept {
    switch (kind) {
    case Kind::response:
        return raw <= static_cast<std::uint8_t>(Status::handler_dropped) ||
               raw == static_cast<std::uint8_t>(Status::transfer_failed);
    case Kind::reset:
        return raw == static_cast<std::uint8_t>(Status::session_unknown) ||
               raw == static_cast<std::uint8_t>(Status::server_busy) ||
               raw == static_cast<std::uint8_t>(Status::out_of_step);
    case Kind::request:
    case Kind::credit_return:
    case Kind::request_for_response:
    case Kind::in_progress: break;
    }
    return raw == static_cast<std::uint8_t>(Status::ok);
}

// Whether `index` names a packet the kind may name in a message of `packets` packets.
bool index_fits(Kind kind, std::uint32_t index, std::uint32_t packets) noexcept {
    switch (kind) {
    case Kind::request:
    case Kind::response: return index < packets;
    case Kind::credit_return: return index + 1 < packets; // the last is answered by the response
    case Kind::request_for_response: return index >= 1 && index < packets; // packet 0 comes unasked
    case Kind::in_progress: return index + 1 == packets;                  // the last request packet
    case Kind::reset: break;
    }
    return index == 0;
}

// The message size and payload the kind and index require.
bool length_fits(const PacketHeader& h, std::size_t payload, std::uint32_t payload_per_packet) noexcept {
    switch (h.kind) {
    case Kind::request:
        return payload == (h.probe ? 0 : payload_bytes(h.message_size, h.index, payload_per_packet, h.whole));
    case Kind::response:
        return (h.status == Status::ok || h.message_size == 0) &&
               payload == payload_bytes(h.message_size, h.index, payload_per_packet);
    case Kind::reset: return h.message_size == 0 && payload == 0;
    case Kind::credit_return:
    case Kind::request_for_response:
    case Kind::in_progress: break;
    }
    return payload == 0;
}

} // namespace

std::string_view to_string(DropReason reason) noexcept {
    switch (reason) {
    case DropReason::too_short: return "too short";
    case DropReason::bad_magic: return "bad magic";
    case DropReason::bad_version: return "bad version";
    case DropReason::bad_kind: return "bad kind";
    case DropReason::bad_status: return "bad status";
    case DropReason::reserved_set: return "reserved bits set";
    case DropReason::too_large: return "message too large";
    case DropReason::bad_index: return "bad packet index";
    case DropReason::bad_length: return "bad length";
    case DropReason::stale_session: return "stale session";
    case DropReason::wrong_kind: return "wrong kind";
    case DropReason::stale_request: return "stale request";
    case DropReason::too_far_ahead: return "request number too far ahead";
    case DropReason::duplicate: return "duplicate";
    case DropReason::out_of_order: return "out of order";
    case DropReason::unsolicited: return "unsolicited";
    case DropReason::inconsistent: return "inconsistent with its message";
    case DropReason::handler_running: return "handler running";
    case DropReason::wrong_source: return "wrong source";
    case DropReason::receive_failed: return "receive failed";
    }
    return "unknown";
}

PacketLimits::PacketLimits(std::uint32_t max_message, std::uint32_t payload_per_packet, std::uint32_t whole_max,
                           std::source_location where)
    : max_message_(max_message), payload_per_packet_(payload_per_packet), whole_max_(whole_max) {
    require(payload_per_packet > 0, where, "PacketLimits: 0 bytes of payload per packet");
    require(packet_count(max_message, payload_per_packet) <= max_packets, where,
            "PacketLimits: a {}-byte message takes more than {} packets of {} bytes", max_message, max_packets,
            payload_per_packet);
}

void encode(const PacketHeader& h, std::span<std::byte, header_bytes> out) noexcept {
    std::byte* at = out.data();
    wire::put(at, magic, 2);
    wire::put(at + 2, version, 1);
    wire::put(at + 3, static_cast<std::uint8_t>(h.kind), 1);
    wire::put(at + 4, h.rpc_type, 1);
    wire::put(at + 5, static_cast<std::uint8_t>(h.status), 1);
    wire::put(at + 6, h.session, 2);
    wire::put(at + 8, h.generation, 4);
    wire::put(at + 12, h.message_size, 4);
    wire::put(at + 16, h.request, 8);
    wire::put(at + 24, h.index, 2);
    wire::put(at + 26, (h.rdma ? flag_rdma : 0) | (h.whole ? flag_whole : 0) | (h.probe ? flag_probe : 0), 1);
    wire::put(at + 27, 0, 5);
}

std::optional<SessionId> peek_session(std::span<const std::byte> packet) noexcept {
    if (packet.size() < header_bytes)
        return std::nullopt;
    return SessionId{.number = static_cast<std::uint16_t>(wire::get(packet.data() + 6, 2)),
                     .generation = static_cast<std::uint32_t>(wire::get(packet.data() + 8, 4))};
}

std::expected<PacketHeader, DropReason> decode(std::span<const std::byte> packet, const PacketLimits& limits) noexcept {
    const auto refuse = [](DropReason reason) { return std::unexpected(reason); };
    if (packet.size() < header_bytes)
        return refuse(DropReason::too_short);
    const std::byte* at = packet.data();
    if (wire::get(at, 2) != magic)
        return refuse(DropReason::bad_magic);
    if (wire::get(at + 2, 1) != version)
        return refuse(DropReason::bad_version);
    const auto raw_kind = static_cast<std::uint8_t>(wire::get(at + 3, 1));
    if (!known_kind(raw_kind))
        return refuse(DropReason::bad_kind);
    const auto kind = static_cast<Kind>(raw_kind);
    const auto raw_status = static_cast<std::uint8_t>(wire::get(at + 5, 1));
    if (!status_fits(kind, raw_status))
        return refuse(DropReason::bad_status);
    const auto flags = static_cast<std::uint8_t>(wire::get(at + 26, 1));
    if ((flags & ~(flag_rdma | flag_whole | flag_probe)) != 0 || wire::get(at + 27, 5) != 0)
        return refuse(DropReason::reserved_set);
    // a descriptor is a request's or an answered (ok) response's
    const bool rdma = (flags & flag_rdma) != 0;
    if (rdma && kind != Kind::request && !(kind == Kind::response && raw_status == 0))
        return refuse(DropReason::reserved_set);
    // whole: a descriptor request, or the in_progress about one
    const bool whole = (flags & flag_whole) != 0;
    if (whole && !(kind == Kind::request && rdma) && kind != Kind::in_progress)
        return refuse(DropReason::reserved_set);
    // probe: a whole request's header alone
    const bool probe = (flags & flag_probe) != 0;
    if (probe && !(kind == Kind::request && whole))
        return refuse(DropReason::reserved_set);
    const PacketHeader h{.kind = kind,
                         .rpc_type = static_cast<std::uint8_t>(wire::get(at + 4, 1)),
                         .status = static_cast<Status>(raw_status),
                         .session = static_cast<std::uint16_t>(wire::get(at + 6, 2)),
                         .generation = static_cast<std::uint32_t>(wire::get(at + 8, 4)),
                         .message_size = static_cast<std::uint32_t>(wire::get(at + 12, 4)),
                         .request = wire::get(at + 16, 8),
                         .index = static_cast<std::uint16_t>(wire::get(at + 24, 2)),
                         .rdma = rdma,
                         .whole = whole,
                         .probe = probe};
    if (h.message_size > (whole ? limits.whole_max() : limits.max_message()))
        return refuse(DropReason::too_large);
    if (!index_fits(kind, h.index, packets_of(h.message_size, whole, limits.payload_per_packet())))
        return refuse(DropReason::bad_index);
    if (!length_fits(h, packet.size() - header_bytes, limits.payload_per_packet()))
        return refuse(DropReason::bad_length);
    return h;
}

} // namespace rdmaxx::rpc::detail
