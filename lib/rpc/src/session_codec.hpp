// The two messages that set up a session, over the control connection (TCP or RDMA
// CM: control_channel.hpp) a client opens to the server endpoint's listener: the client sends a SessionRequest, the server answers
// with a SessionReply, and the connection then stays open for the session's life (its
// end tells a session that its peer is gone).
//
// Every message starts with the same 8-byte prefix, in every version:
//
//   offset  size  field (big-endian, like every integer here)
//        0     4  magic: "RXSQ" a request, "RXSR" a reply
//        4     2  version (1)
//        6     2  length: the whole message's bytes, this prefix included
//                 (8..max_session_message_bytes)
//
// so that a reader of any version knows how much to read: a server reads the whole
// request even when it does not speak its version, answers version_unsupported and only
// then closes (closing with unread bytes resets the connection, and the reset may
// destroy the reply before the client reads it).
//
// SessionRequest, version 1, 64 bytes:
//
//   offset  size  field
//        0     8  prefix ("RXSQ", 1, 64)
//                 the client's UD address (28 bytes):
//        8     4    QPN of its UD QP (24 bits)
//       12     4    qkey of its UD QP
//       16    16    GID of its port
//       32     2    LID of its port
//       34     1    MTU of its port, an ibv_mtu (1..5)
//       35     1    reserved, 0
//                 the client's SessionId (8 bytes): the server's packets to it carry it
//       36     2    number
//       38     2    reserved, 0
//       40     4    generation (not 0)
//                 the limits asked (20 bytes):
//       44     4    window W (1..max_window)
//       48     4    credits C (1..max_credits)
//       52     4    largest request the client will send
//       56     4    largest response it accepts
//       60     4    payload per packet: its path MTU - 32
//
// SessionReply, version 1, 68 bytes:
//
//   offset  size  field
//        0     8  prefix ("RXSR", 1, 68)
//        8     1  status: 0 accepted, or a Refusal (1..5)
//        9     1  flags: bit 0 "both ways": the server may call the client too (each end
//                 then reserves 2 C receive buffers); other bits 0, and 0 in a refusal
//       10     2  reserved, 0
//       12    28  the server's UD address (layout as in the request)
//       40     8  the server's SessionId: the client's packets to it carry it
//       48    20  the agreed limits (layout as in the request)
//
// A refusal's bytes 12..68 are 0. The status keeps offset 8 in every version.
//
// The limits, in both messages:
//  - W and C: 1..max_window and 1..max_credits.
//  - payload per packet: one of the five MTUs minus header_bytes (224, 480, 992, 2016,
//    4064), not above the sender's own MTU minus header_bytes.
//  - sizes: at most max_packets packets of that payload (what a packet's 2-byte index
//    numbers: 14,680,064 bytes at MTU 256, 266,338,304 at MTU 4096; so also below
//    1 GiB and a packet's 4-byte message size), 0 allowed.
// The agreed limits are each the smaller of the request's and the server's (the
// payload per packet too: the path MTU is the smaller of the two ports'), so never
// above the request's: check_reply() catches a server that raised one.
//
// decode_*() take untrusted bytes: anything malformed is an Error of kind protocol,
// nothing outside the span is read. A refusal decodes: it is the server's answer.
//
// Thread safety: the functions keep no state: safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

#include "packet.hpp"

namespace rdmaxx::rpc::detail {

inline constexpr std::uint32_t session_request_magic = 0x52585351; // "RXSQ"
inline constexpr std::uint32_t session_reply_magic = 0x52585352;   // "RXSR"
inline constexpr std::uint16_t session_version = 1;
inline constexpr std::size_t session_prefix_bytes = 8;
inline constexpr std::size_t session_request_bytes = 64;
inline constexpr std::size_t session_reply_bytes = 68;
// Any version's message, so that a reader of an unknown version bounds what it reads.
inline constexpr std::size_t max_session_message_bytes = 1024;

inline constexpr std::uint32_t max_window = 1024;
inline constexpr std::uint32_t max_credits = 4096;

// Where the UD packets of a session go: AddressHandle::create(qp, address.endpoint)
// and the qkey of the send. endpoint.psn is not sent (a UD peer has no use for it):
// decode gives 0.
struct UdAddress {
    rdmaxx::Endpoint endpoint;
    std::uint32_t qkey = 0;
    friend bool operator==(const UdAddress&, const UdAddress&) = default;
};

// What a client asks for, or what both ends agreed to (table above).
struct SessionLimits {
    std::uint32_t window = 0;             // W: calls in flight
    std::uint32_t credits = 0;            // C: packets in flight
    std::uint32_t max_request = 0;        // bytes
    std::uint32_t max_response = 0;       // bytes
    std::uint32_t payload_per_packet = 0; // path MTU - header_bytes
    friend bool operator==(const SessionLimits&, const SessionLimits&) = default;
};

struct SessionRequest {
    UdAddress client;
    SessionId session; // the client's: the server's packets to it carry this
    SessionLimits limits;
    friend bool operator==(const SessionRequest&, const SessionRequest&) = default;
};

// Why a server refuses a session, and what the client should do.
enum class Refusal : std::uint8_t {
    version_unsupported = 1, // the server does not speak the request's version (give up)
    too_many_sessions = 2,   // the session table is full (retry later, or elsewhere)
    ring_full = 3,           // no receive-ring room for C more credits (retry later, or
                             // with fewer credits)
    limits_refused = 4,      // the server will not serve the limits asked (an endpoint's
                             // policy; admit() lowers what exceeds its maxima instead)
    shutting_down = 5,       // the server endpoint is closing (connect elsewhere)
};

std::string_view to_string(Refusal refusal) noexcept;

struct SessionReply {
    std::optional<Refusal> refusal; // nothing: accepted, and the fields below hold
    UdAddress server;
    SessionId session; // the server's: the client's packets to it carry this
    SessionLimits limits; // agreed
    bool both_ways = false; // the server may call the client

    static SessionReply refused(Refusal refusal) noexcept {
        return {.refusal = refusal, .server = {}, .session = {}, .limits = {}, .both_ways = false};
    }
    friend bool operator==(const SessionReply&, const SessionReply&) = default;
};

// What a message's prefix announces.
struct SessionPrefix {
    std::uint16_t version = 0;
    std::size_t length = 0; // the whole message, prefix included
};

// Write the message as it is (the peer's decode judges it). A refusal is written with
// zeros after its status, whatever the other fields hold.
std::array<std::byte, session_request_bytes> encode(const SessionRequest& request) noexcept;
std::array<std::byte, session_reply_bytes> encode(const SessionReply& reply) noexcept;

// The prefix of a request (a reply): checks the magic and the length's bounds, not
// the version, so that the reader reads the whole message, then decodes it if the
// version is session_version and answers (or reports) version_unsupported if not.
Result<SessionPrefix> decode_request_prefix(std::span<const std::byte, session_prefix_bytes> prefix);
Result<SessionPrefix> decode_reply_prefix(std::span<const std::byte, session_prefix_bytes> prefix);

// A whole message, nothing more, nothing less. A version other than session_version is
// an Error that says which.
Result<SessionRequest> decode_request(std::span<const std::byte> bytes);
Result<SessionReply> decode_reply(std::span<const std::byte> bytes);

// Whether `limits` lie within the bounds above (what decode accepts): a client checks
// what it is about to ask.
Result<void> check_limits(const SessionLimits& limits);

// Whether an accepted reply honours the request: no agreed limit above the one asked
// (a hostile or broken server could raise them). A refusal raises nothing: it passes.
// Both decoded (or otherwise within the bounds above).
Result<void> check_reply(const SessionRequest& request, const SessionReply& reply);

} // namespace rdmaxx::rpc::detail
