#include "session_codec.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <rdmaxx/wrap/device.hpp>
#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::rpc::detail {
namespace {

// The block both messages carry (table in the header): UD address, SessionId, limits.
constexpr std::size_t terms_bytes = 56;
constexpr std::size_t request_terms_at = 8;
constexpr std::size_t reply_status_at = 8;
constexpr std::size_t reply_terms_at = 12;

struct Terms {
    UdAddress address;
    SessionId session;
    SessionLimits limits;
};

void put_prefix(std::byte* at, std::uint32_t magic, std::size_t length) noexcept {
    wire::put(at, magic, 4);
    wire::put(at + 4, session_version, 2);
    wire::put(at + 6, length, 2);
}

void put_terms(std::byte* at, const Terms& t) noexcept {
    const rdmaxx::Endpoint& e = t.address.endpoint;
    wire::put(at, e.qpn, 4);
    wire::put(at + 4, t.address.qkey, 4);
    std::memcpy(at + 8, e.gid.bytes.data(), e.gid.bytes.size());
    wire::put(at + 24, e.lid, 2);
    wire::put(at + 26, static_cast<std::uint8_t>(e.mtu), 1);
    wire::put(at + 27, 0, 1);
    wire::put(at + 28, t.session.number, 2);
    wire::put(at + 30, 0, 2);
    wire::put(at + 32, t.session.generation, 4);
    wire::put(at + 36, t.limits.window, 4);
    wire::put(at + 40, t.limits.credits, 4);
    wire::put(at + 44, t.limits.max_request, 4);
    wire::put(at + 48, t.limits.max_response, 4);
    wire::put(at + 52, t.limits.payload_per_packet, 4);
}

// The payload per packet of `mtu`; 0 for Mtu::unknown.
std::uint32_t payload_of(Mtu mtu) noexcept {
    return mtu == Mtu::unknown ? 0 : mtu_bytes(mtu) - static_cast<std::uint32_t>(header_bytes);
}

bool is_mtu_payload(std::uint32_t payload) noexcept {
    for (int code = static_cast<int>(Mtu::b256); code <= static_cast<int>(Mtu::b4096); ++code)
        if (payload == payload_of(static_cast<Mtu>(code)))
            return true;
    return false;
}

Result<void> limits_fit(const SessionLimits& l, const char* call) {
    const auto bad = [call](std::string what) { return std::unexpected(Error::protocol(call, std::move(what))); };
    if (l.window < 1 || l.window > max_window)
        return bad(fmt::format("window {} outside 1..{}", l.window, max_window));
    if (l.credits < 1 || l.credits > max_credits)
        return bad(fmt::format("credits {} outside 1..{}", l.credits, max_credits));
    if (!is_mtu_payload(l.payload_per_packet))
        return bad(fmt::format("payload per packet {} is no MTU (256..4096) minus {}", l.payload_per_packet,
                               header_bytes));
    const std::uint64_t most = std::uint64_t{max_packets} * l.payload_per_packet;
    if (l.max_request > most || l.max_response > most)
        return bad(fmt::format("largest request {} or response {} above {} ({} packets of {} bytes)", l.max_request,
                               l.max_response, most, max_packets, l.payload_per_packet));
    return {};
}

// The block at `at` (terms_bytes readable), checked.
Result<Terms> get_terms(const std::byte* at, const char* call) {
    const auto bad = [call](std::string what) { return std::unexpected(Error::protocol(call, std::move(what))); };
    Terms t;
    rdmaxx::Endpoint& e = t.address.endpoint;
    e.qpn = static_cast<std::uint32_t>(wire::get(at, 4));
    t.address.qkey = static_cast<std::uint32_t>(wire::get(at + 4, 4));
    std::memcpy(e.gid.bytes.data(), at + 8, e.gid.bytes.size());
    e.lid = static_cast<std::uint16_t>(wire::get(at + 24, 2));
    const auto mtu = static_cast<int>(wire::get(at + 26, 1));
    t.session.number = static_cast<std::uint16_t>(wire::get(at + 28, 2));
    t.session.generation = static_cast<std::uint32_t>(wire::get(at + 32, 4));
    t.limits = {.window = static_cast<std::uint32_t>(wire::get(at + 36, 4)),
                .credits = static_cast<std::uint32_t>(wire::get(at + 40, 4)),
                .max_request = static_cast<std::uint32_t>(wire::get(at + 44, 4)),
                .max_response = static_cast<std::uint32_t>(wire::get(at + 48, 4)),
                .payload_per_packet = static_cast<std::uint32_t>(wire::get(at + 52, 4))};
    if (wire::get(at + 27, 1) != 0 || wire::get(at + 30, 2) != 0)
        return bad("reserved field is not 0");
    if (e.qpn > 0xffffff)
        return bad(fmt::format("QPN {:#x} wider than 24 bits", e.qpn));
    if (mtu_from_verbs(mtu) == Mtu::unknown)
        return bad(fmt::format("MTU code {} is not an MTU", mtu));
    e.mtu = static_cast<Mtu>(mtu);
    if (t.session.generation == 0)
        return bad("session generation 0 names no session");
    if (auto fit = limits_fit(t.limits, call); !fit)
        return std::unexpected(std::move(fit.error()));
    if (t.limits.payload_per_packet > payload_of(e.mtu))
        return bad(fmt::format("payload per packet {} above its MTU {} minus {}", t.limits.payload_per_packet,
                               mtu_bytes(e.mtu), header_bytes));
    return t;
}

Result<SessionPrefix> get_prefix(const std::byte* at, std::uint32_t magic, const char* call, std::string_view what) {
    if (wire::get(at, 4) != magic)
        return std::unexpected(Error::protocol(call, fmt::format("wrong magic: not an rdmaxx session {}", what)));
    const SessionPrefix prefix{.version = static_cast<std::uint16_t>(wire::get(at + 4, 2)),
                               .length = static_cast<std::size_t>(wire::get(at + 6, 2))};
    if (prefix.length < session_prefix_bytes || prefix.length > max_session_message_bytes)
        return std::unexpected(Error::protocol(
            call, fmt::format("length {} outside {}..{}", prefix.length, session_prefix_bytes, max_session_message_bytes)));
    return prefix;
}

// The prefix of a whole message of this build's version and `length` bytes.
Result<void> check_whole(std::span<const std::byte> bytes, std::uint32_t magic, std::size_t length, const char* call,
                         std::string_view what) {
    if (bytes.size() < session_prefix_bytes)
        return std::unexpected(Error::protocol(
            call, fmt::format("{} bytes: shorter than the {}-byte prefix", bytes.size(), session_prefix_bytes)));
    auto prefix = get_prefix(bytes.data(), magic, call, what);
    if (!prefix)
        return std::unexpected(std::move(prefix.error()));
    if (prefix->version > session_version)
        return std::unexpected(Error::protocol(
            call, fmt::format("version {} is newer than this build's {}", prefix->version, session_version)));
    if (prefix->version != session_version)
        return std::unexpected(Error::protocol(
            call, fmt::format("version {} is not supported (this build speaks {})", prefix->version, session_version)));
    if (prefix->length != length || bytes.size() != length)
        return std::unexpected(Error::protocol(call, fmt::format("{} bytes, length {}: a version {} {} is {} bytes",
                                                                 bytes.size(), prefix->length, session_version, what,
                                                                 length)));
    return {};
}

} // namespace

std::string_view to_string(Refusal refusal) noexcept {
    switch (refusal) {
    case Refusal::version_unsupported: return "version unsupported";
    case Refusal::too_many_sessions: return "too many sessions";
    case Refusal::ring_full: return "receive ring full";
    case Refusal::limits_refused: return "limits refused";
    case Refusal::shutting_down: return "shutting down";
    }
    return "unknown";
}

std::array<std::byte, session_request_bytes> encode(const SessionRequest& request) noexcept {
    std::array<std::byte, session_request_bytes> out{};
    put_prefix(out.data(), session_request_magic, out.size());
    put_terms(out.data() + request_terms_at, {request.client, request.session, request.limits});
    return out;
}

std::array<std::byte, session_reply_bytes> encode(const SessionReply& reply) noexcept {
    std::array<std::byte, session_reply_bytes> out{}; // a refusal's terms stay 0
    put_prefix(out.data(), session_reply_magic, out.size());
    wire::put(out.data() + reply_status_at, reply.refusal ? static_cast<std::uint8_t>(*reply.refusal) : 0, 1);
    wire::put(out.data() + reply_status_at + 1, !reply.refusal && reply.both_ways ? 1 : 0, 1);
    if (!reply.refusal)
        put_terms(out.data() + reply_terms_at, {reply.server, reply.session, reply.limits});
    return out;
}

Result<SessionPrefix> decode_request_prefix(std::span<const std::byte, session_prefix_bytes> prefix) {
    return get_prefix(prefix.data(), session_request_magic, "rpc::decode_request_prefix", "request");
}

Result<SessionPrefix> decode_reply_prefix(std::span<const std::byte, session_prefix_bytes> prefix) {
    return get_prefix(prefix.data(), session_reply_magic, "rpc::decode_reply_prefix", "reply");
}

Result<SessionRequest> decode_request(std::span<const std::byte> bytes) {
    constexpr const char* call = "rpc::decode_request";
    if (auto whole = check_whole(bytes, session_request_magic, session_request_bytes, call, "request"); !whole)
        return std::unexpected(std::move(whole.error()));
    auto terms = get_terms(bytes.data() + request_terms_at, call);
    if (!terms)
        return std::unexpected(std::move(terms.error()));
    return SessionRequest{.client = terms->address, .session = terms->session, .limits = terms->limits};
}

Result<SessionReply> decode_reply(std::span<const std::byte> bytes) {
    constexpr const char* call = "rpc::decode_reply";
    if (auto whole = check_whole(bytes, session_reply_magic, session_reply_bytes, call, "reply"); !whole)
        return std::unexpected(std::move(whole.error()));
    const auto status = static_cast<std::uint8_t>(wire::get(bytes.data() + reply_status_at, 1));
    const auto flags = wire::get(bytes.data() + reply_status_at + 1, 1);
    if (wire::get(bytes.data() + reply_status_at + 2, 2) != 0 || flags > 1)
        return std::unexpected(Error::protocol(call, "reserved field is not 0"));
    if (status > static_cast<std::uint8_t>(Refusal::shutting_down))
        return std::unexpected(Error::protocol(call, fmt::format("status {} is unknown", status)));
    if (status != 0) {
        const auto terms = bytes.subspan(reply_terms_at);
        if (flags != 0 || std::any_of(terms.begin(), terms.end(), [](std::byte b) { return b != std::byte{0}; }))
            return std::unexpected(Error::protocol(call, "a refusal with more than its status"));
        return SessionReply::refused(static_cast<Refusal>(status));
    }
    auto terms = get_terms(bytes.data() + reply_terms_at, call);
    if (!terms)
        return std::unexpected(std::move(terms.error()));
    return SessionReply{.refusal = {},
                        .server = terms->address,
                        .session = terms->session,
                        .limits = terms->limits,
                        .both_ways = flags == 1};
}

Result<void> check_limits(const SessionLimits& limits) {
    return limits_fit(limits, "rpc::check_limits");
}

Result<void> check_reply(const SessionRequest& request, const SessionReply& reply) {
    if (reply.refusal)
        return {};
    const SessionLimits& asked = request.limits;
    const SessionLimits& agreed = reply.limits;
    const struct {
        std::string_view name;
        std::uint32_t asked, agreed;
    } fields[] = {{"window", asked.window, agreed.window},
                  {"credits", asked.credits, agreed.credits},
                  {"largest request", asked.max_request, agreed.max_request},
                  {"largest response", asked.max_response, agreed.max_response},
                  {"payload per packet", asked.payload_per_packet, agreed.payload_per_packet}};
    for (const auto& f : fields)
        if (f.agreed > f.asked)
            return std::unexpected(Error::protocol(
                "rpc::check_reply", fmt::format("the server raised the {} from {} to {}", f.name, f.asked, f.agreed)));
    return {};
}

} // namespace rdmaxx::rpc::detail
