#include "control_codec.hpp"

#include <cerrno>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::detail::control {
namespace {

// Each field a control payload holds, in wire order: one list per kind, used by both
// directions.
struct Writer {
    std::byte* at;
    void operator()(std::uint64_t value, int width) {
        wire::put(at, value, width);
        at += width;
    }
};
struct Reader {
    const std::byte* at;
    std::uint64_t operator()(int width) {
        const auto value = wire::get(at, width);
        at += width;
        return value;
    }
};

constexpr std::size_t size_of(Kind kind) noexcept {
    switch (kind) {
    case Kind::mr_lend:
    case Kind::mr_grant: return region_bytes;
    case Kind::mr_request: return 24;
    case Kind::mr_deny: return 12;
    case Kind::mr_return: return 8;
    case Kind::mr_return_ack: return 12;
    case Kind::user:
    case Kind::credit:
    case Kind::goodbye: break;
    }
    return 0;
}

bool known_kind(std::uint8_t raw) noexcept {
    return raw >= static_cast<std::uint8_t>(Kind::user) && raw <= static_cast<std::uint8_t>(Kind::goodbye);
}

bool deny_code(int code) noexcept {
    return code == EACCES || code == EDQUOT || code == ENOMEM || code == EINVAL || code == EBUSY;
}
bool return_code(int code) noexcept { return code == 0 || code == ESTALE; }

// What decode() refuses in a region; empty when it is fine.
std::string region_fault(const Region& r) {
    if (r.memory.length == 0)
        return "a region of 0 bytes";
    if (r.memory.addr + r.memory.length < r.memory.addr)
        return fmt::format("a region at {:#x} of {} bytes wraps the address space", r.memory.addr, r.memory.length);
    if (r.token == 0)
        return "a region with token 0";
    if (!known_rights(r.access))
        return fmt::format("a region with unknown rights {:#x}", static_cast<unsigned>(r.access));
    return {};
}

void put_region(Writer& w, const Region& r) {
    w(r.request, 8);
    w(r.memory.addr, 8);
    w(r.memory.length, 8);
    w(r.memory.rkey, 4);
    w(r.token, 8);
    w(static_cast<unsigned>(r.access), 4);
    w(static_cast<std::uint64_t>(r.lease.count()), 4);
}

Region get_region(Reader& r) {
    Region region;
    region.request = r(8);
    region.memory.addr = r(8);
    region.memory.length = r(8);
    region.memory.rkey = static_cast<std::uint32_t>(r(4));
    region.token = r(8);
    region.access = static_cast<Access>(r(4));
    region.lease = std::chrono::milliseconds(r(4));
    return region;
}

} // namespace

Kind kind_of(const Message& message) noexcept {
    constexpr Kind kinds[] = {Kind::credit,    Kind::mr_lend,   Kind::mr_grant,      Kind::mr_request,
                              Kind::mr_deny,   Kind::mr_return, Kind::mr_return_ack, Kind::goodbye};
    static_assert(std::variant_size_v<Message> == std::size(kinds));
    return kinds[message.index()];
}

Encoded encode(const Message& message, std::uint16_t credits, std::source_location where) {
    Encoded out;
    const Kind kind = kind_of(message);
    out.size = header_bytes + size_of(kind);
    out.bytes[0] = static_cast<std::byte>(kind);
    wire::put(out.bytes.data() + 2, credits, 2);
    wire::put(out.bytes.data() + 4, size_of(kind), 4);
    Writer w{out.bytes.data() + header_bytes};
    std::visit(
        [&](const auto& m) {
            using M = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<M, Lend> || std::is_same_v<M, Grant>) {
                const std::string fault = region_fault(m.region);
                require(fault.empty(), where, "encoding {}", fault);
                put_region(w, m.region);
            } else if constexpr (std::is_same_v<M, Request>) {
                require(known_rights(m.access), where, "a request for unknown rights {:#x}",
                        static_cast<unsigned>(m.access));
                w(m.request, 8);
                w(m.size, 8);
                w(static_cast<unsigned>(m.access), 4);
                w(static_cast<std::uint64_t>(m.lease.count()), 4);
            } else if constexpr (std::is_same_v<M, Deny>) {
                require(deny_code(m.code), where, "a refusal with errno {}", m.code);
                w(m.request, 8);
                w(static_cast<std::uint32_t>(m.code), 4);
            } else if constexpr (std::is_same_v<M, Return>) {
                w(m.token, 8);
            } else if constexpr (std::is_same_v<M, ReturnAck>) {
                require(return_code(m.code), where, "a return answer with errno {}", m.code);
                w(m.token, 8);
                w(static_cast<std::uint32_t>(m.code), 4);
            }
        },
        message);
    return out;
}

std::array<std::byte, header_bytes> encode_user_header(std::uint32_t length, std::uint16_t credits) noexcept {
    std::array<std::byte, header_bytes> header{};
    header[0] = static_cast<std::byte>(Kind::user);
    wire::put(header.data() + 2, credits, 2);
    wire::put(header.data() + 4, length, 4);
    return header;
}

Result<Header> decode_header(std::span<const std::byte> header, std::size_t arrived) {
    if (arrived < header_bytes || header.size() < header_bytes)
        return std::unexpected(Error::protocol("Connection", fmt::format("a {}-byte message", arrived)));
    const auto raw_kind = static_cast<std::uint8_t>(header[0]);
    if (!known_kind(raw_kind))
        return std::unexpected(Error::protocol("Connection", fmt::format("unknown message kind {}", raw_kind)));
    if (header[1] != std::byte{0})
        return std::unexpected(Error::protocol("Connection", "a message with its reserved byte set"));
    const Header h{.kind = static_cast<Kind>(raw_kind),
                   .credits = static_cast<std::uint16_t>(wire::get(header.data() + 2, 2)),
                   .length = static_cast<std::uint32_t>(wire::get(header.data() + 4, 4))};
    if (h.length != arrived - header_bytes)
        return std::unexpected(Error::protocol(
            "Connection", fmt::format("header says {} bytes, {} arrived", h.length, arrived - header_bytes)));
    if (h.kind != Kind::user && h.length != size_of(h.kind))
        return std::unexpected(Error::protocol(
            "Connection", fmt::format("a control message of kind {} with {} bytes, not {}", raw_kind, h.length,
                                      size_of(h.kind))));
    return h;
}

Result<Message> decode(const Header& header, std::span<const std::byte> payload) {
    if (header.kind == Kind::user || payload.size() != size_of(header.kind))
        return std::unexpected(Error::protocol("Connection", "a control payload of the wrong size"));
    Reader r{payload.data()};
    const auto refuse = [](std::string what) -> Result<Message> {
        return std::unexpected(Error::protocol("Connection", std::move(what)));
    };
    switch (header.kind) {
    case Kind::credit: return Credit{};
    case Kind::goodbye: return Goodbye{};
    case Kind::mr_lend:
    case Kind::mr_grant: {
        const Region region = get_region(r);
        if (std::string fault = region_fault(region); !fault.empty())
            return refuse(std::move(fault));
        if (header.kind == Kind::mr_lend)
            return Lend{region};
        return Grant{region};
    }
    case Kind::mr_request: {
        Request m{.request = r(8), .size = r(8), .access = static_cast<Access>(r(4)), .lease = {}};
        m.lease = std::chrono::milliseconds(r(4));
        if (!known_rights(m.access))
            return refuse(fmt::format("a request for unknown rights {:#x}", static_cast<unsigned>(m.access)));
        return m;
    }
    case Kind::mr_deny: {
        const Deny m{.request = r(8), .code = static_cast<int>(r(4))};
        if (!deny_code(m.code))
            return refuse(fmt::format("a refusal with errno {}", m.code));
        return m;
    }
    case Kind::mr_return: return Return{.token = r(8)};
    case Kind::mr_return_ack: {
        const ReturnAck m{.token = r(8), .code = static_cast<int>(r(4))};
        if (!return_code(m.code))
            return refuse(fmt::format("a return answer with errno {}", m.code));
        return m;
    }
    case Kind::user: break;
    }
    return refuse("a user message is not a control message");
}

} // namespace rdmaxx::detail::control
