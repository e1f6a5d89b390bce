// The wire formats of what follows a session's setup: the messages its control connection
// carries (the two that connect a session's RC QPs, for messages above the endpoint's
// rdma_threshold, the goodbye of a graceful close, and the still-here of an idle
// session over RDMA CM), and the descriptors that
// travel in place of a large message's bytes in UD packets with the rdma flag
// (packet.hpp).
//
// RC setup. A client that first needs the RC path sends an RcOffer over the session's
// control connection (TCP or RDMA CM, kept open for the session's life:
// control_channel.hpp); the server answers with an RcAnswer. Goodbye: an end whose Session::close() found its calls finished says so
// (the peer finishes its own calls through the session, then closes the connection).
// Still here: over RDMA CM each end says so every EndpointOptions::peer_silence / 3 and
// ends the session once it heard nothing for peer_silence (an idle RC QP hears of no
// loss; over TCP the kernel's keepalive does it: control_channel.hpp).
// All are 40 bytes, big-endian:
//
//   offset  size  field
//        0     4  magic "RXRC"
//        4     2  version (4)
//        6     2  length (40)
//        8     1  kind: 1 offer (client), 2 answer (server), 3 goodbye (either end),
//                 4 still here (either end)
//        9     1  status: 0 a QP follows (goodbye, still here: 0, and no QP); 1 unavailable
//                 (answer only: the server has no RC QP for the session; the client
//                 keeps to UD)
//       10     2  whole max (answer only, else 0): the largest request descriptor the
//                 server takes whole, SENT into its receive buffers (packet.hpp); 0: none
//       12     4  QPN of the sender's RC QP (24 bits)
//       16     4  its first PSN (24 bits)
//       20    16  GID of its port
//       36     2  LID of its port
//       38     1  MTU of its port, an ibv_mtu (1..5)
//       39     1  whole receives (answer only, else 0): how many whole requests of the
//                 session may be on their way at once (receive buffers the server keeps
//                 for it); 0 exactly when whole max is
// An unavailable answer's bytes 12..40 are 0, and a goodbye's or still-here's bytes 9..40.
//
// A request descriptor (the message of a request with the rdma flag), 40 bytes and
// maybe the request itself:
//
//   offset  size  field
//        0    20  the request's bytes in the client's memory (RemoteMemory's wire
//                 form: address, length, rkey), for the server to READ; length 0: the
//                 request follows inline, from offset 40
//       20    20  memory the response may be written into (address, length, rkey);
//                 length 0: none (the response comes back in UD packets)
//       40     n  the request, when not read (n = message size - 40)
//
// A large response is WRITTEN into the memory the request offered with an immediate
// (WRITE_WITH_IMM), whose completion at the client is the response: its byte_len the
// response's size, its immediate (32 bits) names the call:
//
//   bits  field
//  31-16  the client's session number (the server's SessionState::remote)
//   15-6  the call's window slot (request % window; window <= 1024)
//    5-0  the call's round in its slot ((request / window) % 64), which tells it from
//         the slot's earlier and later calls
//
// A response descriptor (the message of a response with the rdma flag), 4 bytes: the
// response's size, written into the memory the request offered before this was sent.
// A WRITE's completion at the server makes it the call's response in the UD window:
// what a resent request gets (the WRITE is not repeated).
//
// decode_*() take untrusted bytes: anything malformed is an Error of kind protocol.
// Thread safety: the functions keep no state: safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx::rpc::detail {

inline constexpr std::uint32_t rc_magic = 0x52585243; // "RXRC"
// 2: responses by WRITE_WITH_IMM; 3: whole requests; 4: still here
inline constexpr std::uint16_t rc_version = 4;
inline constexpr std::size_t rc_prefix_bytes = 8;
inline constexpr std::size_t rc_message_bytes = 40;
inline constexpr std::size_t request_descriptor_bytes = 40;
inline constexpr std::size_t response_descriptor_bytes = 4;

struct RcMessage {
    enum class Kind : std::uint8_t { offer = 1, answer = 2, goodbye = 3, still_here = 4 };
    Kind kind = Kind::offer;
    bool available = true;    // false: an answer without a QP (and every goodbye and still-here)
    rdmaxx::Endpoint qp = {}; // when available
    std::uint16_t whole_max = 0;     // an available answer's (above)
    std::uint8_t whole_receives = 0; // an available answer's (above)
    friend bool operator==(const RcMessage&, const RcMessage&) = default;
};

std::array<std::byte, rc_message_bytes> encode(const RcMessage& message) noexcept;
// How many bytes the message whose first rc_prefix_bytes these are has in all (the
// reader reads that many before decode): a wrong magic, version or length is an Error.
Result<std::size_t> decode_rc_prefix(std::span<const std::byte, rc_prefix_bytes> prefix);
Result<RcMessage> decode_rc(std::span<const std::byte> bytes);

struct RequestDescriptor {
    RemoteMemory request;                  // length 0: `inline_request` holds it
    RemoteMemory response;                 // length 0: no memory offered
    std::span<const std::byte> inline_request;
};

// The descriptor's first request_descriptor_bytes (the inline request follows them).
std::array<std::byte, request_descriptor_bytes> encode_request_head(const RemoteMemory& request,
                                                                    const RemoteMemory& response) noexcept;
// `message`: a whole request descriptor, untrusted. Memory longer than the session's
// limits, or an inline request beside memory to read, is an Error.
Result<RequestDescriptor> decode_request_descriptor(std::span<const std::byte> message, std::uint32_t max_request,
                                                    std::uint32_t max_response);

// The immediate of a large response's WRITE (above).
struct WrittenResponse {
    std::uint16_t session = 0; // the client's number for it
    std::uint32_t slot = 0;    // below 1024
    std::uint8_t round = 0;    // below 64
    friend bool operator==(const WrittenResponse&, const WrittenResponse&) = default;
};
// Programming error: a slot or round past its bits.
std::uint32_t encode_written(const WrittenResponse& written,
                             std::source_location where = std::source_location::current());
// Every immediate is some WrittenResponse: the client checks it names a call of its
// own in progress (the session, the slot within its window, the round of that call).
WrittenResponse decode_written(std::uint32_t imm) noexcept;
// The round of call `request` in a window of `window` slots.
constexpr std::uint8_t round_of(std::uint64_t request, std::uint32_t window) noexcept {
    return static_cast<std::uint8_t>((request / window) % 64);
}

std::array<std::byte, response_descriptor_bytes> encode_response_descriptor(std::uint32_t size) noexcept;
// The size a response descriptor announces. Untrusted: not 4 bytes is an Error (the
// caller checks the size against the memory it offered).
Result<std::uint32_t> decode_response_descriptor(std::span<const std::byte> message);

} // namespace rdmaxx::rpc::detail
