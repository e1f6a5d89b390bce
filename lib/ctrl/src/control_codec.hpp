// The wire form of what a Connection's two ends say to each other over their queue
// pair, built and parsed in one place. Each message is one SEND into one of the
// peer's receive buffers:
//
//   offset  size  field (big-endian)
//        0     1  kind (Kind below)
//        1     1  reserved, 0
//        2     2  credits: receive buffers the sender reposted since its last message
//        4     4  payload length: the bytes after this 8-byte header
//        8     n  payload: the user's bytes (kind user), else a control payload:
//
//   credit          (empty)                  credits only
//   mr_lend         Region                   a region lent by send_local_mr
//   mr_grant        Region                   the answer to mr_request
//   mr_request      request u64, size u64, access u32, lease ms u32
//   mr_deny         request u64, errno u32   (EACCES, EDQUOT, ENOMEM, EINVAL)
//   mr_return       token u64                a region given back
//   mr_return_ack   token u64, errno u32     0 (taken back) or ESTALE (unknown, expired)
//   goodbye         (empty)                  the sender closes; nothing follows
//
//   Region: request u64 (0 for a lend), addr u64, length u64, rkey u32, token u64,
//           access u32, lease ms u32
//
// decode() takes untrusted bytes: anything malformed (unknown kind, reserved bits,
// a length that disagrees with what arrived, a payload of the wrong size, rights
// rdmaxx does not know, a region that wraps the address space, an errno a peer may
// not send) is an Error of kind protocol, and nothing outside the span is read.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/mr.hpp>

namespace rdmaxx::detail::control {

enum class Kind : std::uint8_t {
    user = 1, credit, mr_lend, mr_request, mr_grant, mr_deny, mr_return, mr_return_ack, goodbye,
};

inline constexpr std::size_t header_bytes = 8;
inline constexpr std::size_t region_bytes = 44;       // the largest control payload
inline constexpr std::size_t max_payload = region_bytes;
inline constexpr std::size_t max_message_bytes = header_bytes + max_payload; // a control message, whole
// The longest lease the wire carries (a u32 of milliseconds: ~49.7 days).
inline constexpr std::int64_t max_lease_ms = 0xffff'ffff;
// Rights a peer may name: what Connection lends and grants.
inline constexpr Access known_access =
    Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;
inline bool known_rights(Access access) noexcept { return (access & known_access) == access; }

struct Header {
    Kind kind = Kind::credit;
    std::uint16_t credits = 0;
    std::uint32_t length = 0; // payload bytes
    friend bool operator==(const Header&, const Header&) = default;
};

// mr_lend and mr_grant.
struct Region {
    std::uint64_t request = 0; // mr_grant: the request it answers; mr_lend: 0
    RemoteMemory memory;
    std::uint64_t token = 0;   // names the region to its owner
    Access access = Access::none;
    std::chrono::milliseconds lease{0};
    friend bool operator==(const Region&, const Region&) = default;
};
struct Credit {
    friend bool operator==(const Credit&, const Credit&) = default;
};
struct Lend {
    Region region;
    friend bool operator==(const Lend&, const Lend&) = default;
};
struct Grant {
    Region region;
    friend bool operator==(const Grant&, const Grant&) = default;
};
struct Request {
    std::uint64_t request = 0;
    std::uint64_t size = 0;
    Access access = Access::none;
    std::chrono::milliseconds lease{0};
    friend bool operator==(const Request&, const Request&) = default;
};
struct Deny {
    std::uint64_t request = 0;
    int code = 0; // errno: EACCES, EDQUOT, ENOMEM, EINVAL, EBUSY (binds in flight: ask again)
    friend bool operator==(const Deny&, const Deny&) = default;
};
struct Return {
    std::uint64_t token = 0;
    friend bool operator==(const Return&, const Return&) = default;
};
struct ReturnAck {
    std::uint64_t token = 0;
    int code = 0; // 0: taken back; ESTALE: expired or never lent
    friend bool operator==(const ReturnAck&, const ReturnAck&) = default;
};
struct Goodbye {
    friend bool operator==(const Goodbye&, const Goodbye&) = default;
};

// Every control message (all kinds but user).
using Message = std::variant<Credit, Lend, Grant, Request, Deny, Return, ReturnAck, Goodbye>;

Kind kind_of(const Message& message) noexcept;

// A control message's header (with `credits`) and payload, ready to send.
struct Encoded {
    std::array<std::byte, max_message_bytes> bytes{};
    std::size_t size = 0;
    std::span<const std::byte> span() const noexcept { return {bytes.data(), size}; }
};

// Programming error: a Deny or ReturnAck whose code a peer may not send, a message
// whose fields decode() would refuse (rights outside known_access, a wrapping region).
Encoded encode(const Message& message, std::uint16_t credits,
               std::source_location where = std::source_location::current());
// The header of a user message of `length` bytes.
std::array<std::byte, header_bytes> encode_user_header(std::uint32_t length, std::uint16_t credits) noexcept;

// The header of a message of `arrived` bytes (what the receive completion says), of
// which `header` holds the first min(arrived, header_bytes). Checks the kind, the
// reserved byte, that the length matches what arrived and that a control payload is
// of its kind's size.
Result<Header> decode_header(std::span<const std::byte> header, std::size_t arrived);
// A control message's payload (header.kind is not user; the header came from
// decode_header and `payload` holds exactly header.length bytes).
Result<Message> decode(const Header& header, std::span<const std::byte> payload);

} // namespace rdmaxx::detail::control
