// The versioned wire form of what two peers exchange to connect queue pairs: one or
// more QP endpoints and a caller-defined metadata blob (remote MR descriptors, ...).
//
//   offset  size  field
//        0     4  magic "RDMX"
//        4     2  version (1), big-endian like every integer here
//        6     2  flags, 0
//        8     4  body length: the bytes after this 12-byte header
//       12     2  QP count (1..max_qps)
//       14     2  reserved, 0
//       16  28*n  per QP: QPN u32, PSN u32, GID 16 bytes, LID u16, MTU u8, QP type u8
//        .     4  metadata length
//        .     m  metadata
//
// decode() takes untrusted bytes: every malformed input is an Error of kind protocol,
// and nothing is read outside the given span.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {

struct PeerQp {
    Endpoint endpoint;
    QpType type = QpType::rc;
    friend bool operator==(const PeerQp&, const PeerQp&) = default;
};

struct EndpointMessage {
    std::vector<PeerQp> qps;
    std::vector<std::byte> metadata;
    friend bool operator==(const EndpointMessage&, const EndpointMessage&) = default;
};

namespace endpoint_codec {

inline constexpr std::array<std::byte, 4> magic{std::byte{'R'}, std::byte{'D'}, std::byte{'M'}, std::byte{'X'}};
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t header_size = 12;
inline constexpr std::size_t qp_size = 28;
inline constexpr std::size_t max_qps = 256;
inline constexpr std::size_t max_metadata = 1 << 20;
inline constexpr std::size_t max_body = 4 + max_qps * qp_size + 4 + max_metadata;

// Programming error: no QP, more than max_qps, metadata above max_metadata.
std::vector<std::byte> encode(const EndpointMessage& message,
                              std::source_location where = std::source_location::current());

// The body length announced by a header, checked (magic, version, flags, bound), so
// that a stream reader knows how much more to read before decode().
Result<std::size_t> body_length(std::span<const std::byte, header_size> header);

// A whole message: header and body, nothing more, nothing less.
Result<EndpointMessage> decode(std::span<const std::byte> bytes);

} // namespace endpoint_codec
} // namespace rdmaxx
