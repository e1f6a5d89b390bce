// The header every UD packet of the RPC engine starts with, built and parsed in one
// place. A message (a request or a response) travels as one or more packets, each this
// header followed by its share of the message's bytes:
//
//   offset  size  field (big-endian)
//        0     2  magic 0x5258 ("RX")
//        2     1  version (1)
//        3     1  kind (Kind below)
//        4     1  rpc type: the user's handler number
//        5     1  status (Status below): responses and resets only, 0 in other kinds
//        6     2  destination session number: an index in the receiver's session table
//        8     4  session generation: the receiver's generation of that session (a
//                 reused table slot gets a new one, so a stale packet is recognised)
//       12     4  message size: the whole request or response, not this packet
//       16     8  request number: per session, increasing (slot = request % window)
//       24     2  packet index (what it means per kind: below)
//       26     1  flags: bit 0 "rdma" (requests and responses only; below), bit 1
//                 "whole", bit 2 "probe" (both below), others 0
//       27     1  reserved, 0
//       28     4  reserved, 0
//       32     n  payload: packet `index` of the message, request and response only
//
// What each kind names (slots.hpp tells who sends which and when):
//
//   kind                  message size       index k                    payload
//   request               the request's      0 <= k < packets           its share
//   response              the response's     0 <= k < packets           its share
//   credit_return         the request's      the request packet it      none
//                                            answers, k < packets - 1
//   request_for_response  the response's     the response packet it     none
//                                            asks for, 1 <= k < packets
//   reset                 0                  0                          none
//   in_progress           the request's      packets - 1: the last      none
//                                            request packet, whose
//                                            handler still runs
//
// A request or response with the rdma flag carries a descriptor, not the message: the
// bytes travel over the session's RC QP (rdma.hpp: the request's descriptor names the
// client's memory the server READs and the memory it may WRITE the response into; the
// response's says how many bytes it wrote). Every packet of a message has the same flag.
//
// A request with the whole flag (a descriptor: the rdma flag too) is one packet however
// large (up to PacketLimits::whole_max): it travels as a SEND over the session's RC QP
// into a receive buffer of the server's (rc_transport.hpp), not as UD packets. An
// in_progress answer to it carries the flag too (it names packet 0 of 1); no other kind
// may. What it saves: a request of a few KiB is one message, not a UD packet per MTU
// (each a system call on Soft-RoCE) or a descriptor and the server's READ (a round trip).
// A whole request with the probe flag (offset 26, bit 2) is its header alone, with no
// payload, sent as a UD packet: once the server has answered in_progress, the client
// asks again whether the response is ready with that, not by SENDing the request again
// (eRPC's request-for-response: what a slow handler's caller sends per RTO is a header,
// not up to 16 KiB). A server answers it as it would the request resent, and drops one
// for a call it does not have.
//
// "packets" is packets_of(message size, whole, payload_per_packet): every packet but the
// last carries payload_per_packet bytes; a 0-byte message is one empty packet. A
// response whose status is not ok carries an empty message. A response's status is
// ok, no_handler, too_large, handler_dropped or transfer_failed; a reset's is
// session_unknown, server_busy or out_of_step (whose request field names the request
// it answers).
//
// decode() takes untrusted bytes: it checks everything that needs no session state
// and never reads outside the span. What the session state decides (is this the packet
// expected next?) is the windows' (slots.hpp).
//
// Thread safety: the functions keep no state and a PacketLimits never changes: safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <source_location>
#include <span>
#include <string_view>

namespace rdmaxx::rpc::detail {

inline constexpr std::size_t header_bytes = 32;
inline constexpr std::uint16_t magic = 0x5258;
inline constexpr std::uint8_t version = 1;
// The packets one message may take: what the 2-byte packet index numbers.
inline constexpr std::uint32_t max_packets = 0x10000;

enum class Kind : std::uint8_t {
    request = 1,
    response = 2,
    credit_return = 3,
    request_for_response = 4,
    reset = 5,
    // the server's answer to a resent last request packet while its handler (or the
    // RDMA transfer it needs) runs: the request is whole there, ask again later
    in_progress = 6,
};

// The server's answer in a response or a reset, and what the client should do next.
enum class Status : std::uint8_t {
    ok = 0,              // response: the handler's message follows
    no_handler = 1,      // response: no handler has this rpc type (a caller's mistake: do not retry)
    too_large = 2,       // response: the handler's response exceeded max_message (do not retry)
    handler_dropped = 3, // response: the handler ended without answering (retry if the call is idempotent)
    session_unknown = 4, // reset: the server has no such session (connect again)
    server_busy = 5,     // reset: the server cannot take the session now (connect again later)
    transfer_failed = 6, // response: the server could not READ the request's bytes (its
                         // descriptor was unusable, or the session has no RC QP)
    out_of_step = 7,     // reset: a request number more than the window past the highest
                         // the server saw (the client lost a window of calls in a row):
                         // the session's numbers are out of step and it ends
};

// Why a packet was dropped: one enum, so that an endpoint counts its drops in one table.
// decode() returns the first group; the windows (slots.hpp) the second.
enum class DropReason : std::uint8_t {
    // malformed: decode()
    too_short,   // fewer bytes than a header
    bad_magic,   // not an rdmaxx RPC packet
    bad_version, // a protocol version this build does not speak
    bad_kind,    // an unknown kind
    bad_status,  // a status the kind cannot carry
    reserved_set,
    too_large,   // a message size above max_message
    bad_index,   // an index the kind and message size do not allow (table above)
    bad_length,  // a payload (or message size) other than the kind and index require
    // unwanted in its session: ClientWindow and ServerWindow
    stale_session,   // addressed to another session number or generation than this one
    wrong_kind,      // a kind this side does not take (a client takes credit_return and
                     // response, a server request and request_for_response; resets
                     // are for the session layer)
    stale_request,   // not the slot's current call (completed, abandoned, superseded)
    too_far_ahead,   // a request number beyond what the window lets a client have issued
    duplicate,       // already received
    out_of_order,    // not the next packet expected: one before it is missing
    unsolicited,     // answers nothing outstanding (a packet rolled back by go-back-N, a
                     // response not made yet)
    inconsistent,    // message size or rpc type differs from the message's other packets
    handler_running, // the request's handler has not answered yet
    // the endpoint's
    wrong_source, // not from the session's peer: another QP, or its QPN from another address (PeerSource)
    // the device's
    receive_failed, // a receive the device failed: a packet longer than a ring buffer (no honest peer's)
};
inline constexpr std::size_t drop_reasons = static_cast<std::size_t>(DropReason::receive_failed) + 1;

std::string_view to_string(DropReason reason) noexcept;

// What an endpoint accepts; valid by construction.
class PacketLimits {
public:
    // `max_message`: the largest message (request or response) in bytes.
    // `payload_per_packet`: the path MTU minus header_bytes.
    // `whole_max`: the largest message a whole request may carry (0: none is taken).
    // Programming error: payload_per_packet 0, or a max_message of more packets than an
    // index can number (65,536).
    PacketLimits(std::uint32_t max_message, std::uint32_t payload_per_packet, std::uint32_t whole_max = 0,
                 std::source_location where = std::source_location::current());

    std::uint32_t max_message() const noexcept { return max_message_; }
    std::uint32_t payload_per_packet() const noexcept { return payload_per_packet_; }
    std::uint32_t whole_max() const noexcept { return whole_max_; }

private:
    std::uint32_t max_message_;
    std::uint32_t payload_per_packet_;
    std::uint32_t whole_max_;
};

// A session as packets name it: an entry of the receiver's session table and that
// entry's generation (session_table.hpp). A generation is never 0: 0 names no session.
struct SessionId {
    std::uint16_t number = 0;     // the index in its end's session table
    std::uint32_t generation = 0; // of that table entry
    friend bool operator==(const SessionId&, const SessionId&) = default;
};

struct PacketHeader {
    Kind kind = Kind::request;
    std::uint8_t rpc_type = 0;
    Status status = Status::ok;
    std::uint16_t session = 0; // the receiver's session number
    std::uint32_t generation = 0;
    std::uint32_t message_size = 0;
    std::uint64_t request = 0;
    std::uint16_t index = 0;
    bool rdma = false; // the message is a descriptor: its bytes travel by RDMA
    bool whole = false; // a request sent whole over RC, or an in_progress about one
    bool probe = false; // a whole request's header alone, over UD: is the response ready?
    friend bool operator==(const PacketHeader&, const PacketHeader&) = default;
};

// The packets of a message of `size` bytes (1 for 0 bytes). payload_per_packet > 0.
constexpr std::uint32_t packet_count(std::uint32_t size, std::uint32_t payload_per_packet) noexcept {
    return size == 0 ? 1 : static_cast<std::uint32_t>((std::uint64_t{size} + payload_per_packet - 1) / payload_per_packet);
}
// The packets of a message of `size` bytes, sent whole (1) or in UD packets.
constexpr std::uint32_t packets_of(std::uint32_t size, bool whole, std::uint32_t payload_per_packet) noexcept {
    return whole ? 1 : packet_count(size, payload_per_packet);
}
// The bytes packet `index` of a message of `size` bytes carries (0 past the end); a
// whole message's one packet carries all.
constexpr std::uint32_t payload_bytes(std::uint32_t size, std::uint32_t index, std::uint32_t payload_per_packet,
                                      bool whole = false) noexcept {
    if (whole)
        return index == 0 ? size : 0;
    const std::uint64_t offset = std::uint64_t{index} * payload_per_packet;
    return offset >= size ? 0 : static_cast<std::uint32_t>(std::min<std::uint64_t>(payload_per_packet, size - offset));
}

// The session a packet names (its number and generation), read before decode(), which
// needs the session's limits: nothing when it is shorter than a header. Untrusted.
std::optional<SessionId> peek_session(std::span<const std::byte> packet) noexcept;

// Writes `header` as it is (decode() judges what arrives, not encode()).
void encode(const PacketHeader& header, std::span<std::byte, header_bytes> out) noexcept;

// The header of a packet of packet.size() bytes (header and payload, as received).
// A malformed packet is a DropReason, not an Error: the endpoint counts drops by reason
// and goes on; nothing from the network ends a session by itself.
std::expected<PacketHeader, DropReason> decode(std::span<const std::byte> packet, const PacketLimits& limits) noexcept;

} // namespace rdmaxx::rpc::detail
