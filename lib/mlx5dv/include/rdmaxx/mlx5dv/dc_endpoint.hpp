/// @file
/// What an mlx5 DC initiator needs to reach a DC target: the DCT number, its access
/// key and its address. A plain value with a fixed 32-byte wire form (big-endian,
/// rdmaxx/wrap/wire.hpp), small enough for the metadata of ctrl's endpoint message:
///
/// @code{.unparsed}
///   offset  size  field
///        0     4  DCT number (24 bits; the top byte is 0)
///        4     8  DC access key
///       12    16  GID (network order, as on the wire)
///       28     2  LID
///       30     1  MTU (the ibv_mtu code, 1..5)
///       31     1  reserved, 0
/// @endcode
///
/// Plain data: the same in every build, with or without mlx5dv.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>

#include <rdmaxx/wrap/device.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::mlx5 {

/// A DC target's address as initiators need it (DcTarget::endpoint), and its 32-byte
/// wire form (the table at the top of dc_endpoint.hpp).
struct DcEndpoint {
    std::uint32_t dctn = 0;   ///< DCT number, 24 bits
    std::uint64_t dc_key = 0; ///< the DCT's access key: a WR with another key is refused
    Gid gid{};                ///< required on RoCE
    std::uint16_t lid = 0;    ///< required on InfiniBand
    Mtu mtu = Mtu::unknown;   ///< the DCT port's active MTU

    /// The wire form's size in bytes.
    static constexpr std::size_t wire_size = 32;
    /// The wire form, laid out as the table at the top of dc_endpoint.hpp says.
    using Wire = std::array<std::byte, wire_size>;

    /// The wire form of this endpoint.
    /// @misuse A DCT number wider than 24 bits, an unknown MTU.
    Wire serialize(std::source_location where = std::source_location::current()) const;
    /// Reads a wire form from untrusted bytes.
    /// @errors Anything but exactly `wire_size` bytes, a DCT number wider than 24 bits,
    /// an MTU code that is no MTU, a reserved byte that is not 0, or neither a GID nor
    /// a LID is an Error of kind protocol.
    static Result<DcEndpoint> parse(std::span<const std::byte> bytes);

    /// Equal when every field is.
    friend bool operator==(const DcEndpoint&, const DcEndpoint&) = default;
};

} // namespace rdmaxx::mlx5
