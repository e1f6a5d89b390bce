/// @file
/// The versioned wire form of what two peers exchange to connect queue pairs: one or
/// more QP endpoints and a caller-defined metadata blob (remote MR descriptors, ...).
///
/// ~~~{.unparsed}
///   offset  size  field
///        0     4  magic "RDMX"
///        4     2  version (1), big-endian like every integer here
///        6     2  flags, 0
///        8     4  body length: the bytes after this 12-byte header
///       12     2  QP count (1..max_qps)
///       14     2  reserved, 0
///       16  28*n  per QP: QPN u32, PSN u32, GID 16 bytes, LID u16, MTU u8, QP type u8
///        .     4  metadata length
///        .     m  metadata
/// ~~~
///
/// decode() takes untrusted bytes: every malformed input is an Error of kind protocol,
/// and nothing is read outside the given span.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

/// One QP of an endpoint message: what the peer needs to connect to it, and its type.
struct PeerQp {
    Endpoint endpoint;        ///< QPN, PSN, GID, LID and MTU
    QpType type = QpType::rc; ///< the peer connects a QP of the same type to it
    /// Field by field.
    friend bool operator==(const PeerQp&, const PeerQp&) = default;
};

/// What two peers exchange to connect queue pairs (endpoint_codec gives its wire form).
struct EndpointMessage {
    std::vector<PeerQp> qps;         ///< 1..endpoint_codec::max_qps
    std::vector<std::byte> metadata; ///< the caller's, at most endpoint_codec::max_metadata bytes
    /// Field by field.
    friend bool operator==(const EndpointMessage&, const EndpointMessage&) = default;
};

/// The wire form of EndpointMessage (its layout: endpoint_codec.hpp).
namespace endpoint_codec {

/// The first 4 bytes: "RDMX".
inline constexpr std::array<std::byte, 4> magic{std::byte{'R'}, std::byte{'D'}, std::byte{'M'}, std::byte{'X'}};
/// The version this build writes, and the only one it reads.
inline constexpr std::uint16_t version = 1;
/// Magic, version, flags and body length.
inline constexpr std::size_t header_size = 12;
/// Bytes per QP in the body.
inline constexpr std::size_t qp_size = 28;
/// Most QPs in one message.
inline constexpr std::size_t max_qps = 256;
/// Most metadata bytes in one message.
inline constexpr std::size_t max_metadata = 1 << 20;
/// The largest body length a header may announce.
inline constexpr std::size_t max_body = 4 + max_qps * qp_size + 4 + max_metadata;

/// The wire form of `message`.
/// @misuse no QP, more than max_qps, metadata above max_metadata.
std::vector<std::byte> encode(const EndpointMessage& message,
                              std::source_location where = std::source_location::current());

/// The body length announced by a header, checked (magic, version, flags, bound), so
/// that a stream reader knows how much more to read before decode().
/// @errors (kind protocol) a wrong magic, another version, flags not 0, a body length
/// outside 8..max_body.
Result<std::size_t> body_length(std::span<const std::byte, header_size> header);

/// The message `bytes` hold: a whole message, header and body, nothing more, nothing less.
/// @errors (kind protocol) a header body_length() refuses, a size other than it announces,
/// a reserved field not 0, 0 or more than max_qps QPs, a QPN or PSN above 24 bits, an
/// unknown MTU or QP type, a metadata length that does not match what follows.
Result<EndpointMessage> decode(std::span<const std::byte> bytes);

} // namespace endpoint_codec
} // namespace rdmaxx
