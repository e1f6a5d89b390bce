// What rdmaxx-perf's client and server say to each other over the control stream
// (TCP). Fixed-size big-endian messages (rdmaxx/wrap/wire.hpp); decode() takes
// untrusted bytes and answers anything malformed with a protocol Error.
//
//   client -> server  Request   the run's parameters (once, first)
//   server -> client  Reply     accepted, or refused with a reason
//   ... both connect their QPs (endpoint messages, the MR descriptor as metadata) ...
//   client -> server  Command   run SIZE x ITERS | done (the client finished a run) | finish
//   server -> client  Reply     ready (its side is set up) | verified | mismatch, with a reason
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "options.hpp"

namespace rdmaxx::perf::protocol {

inline constexpr std::uint16_t version = 1;

inline constexpr std::size_t request_size = 40;
using RequestWire = std::array<std::byte, request_size>;
RequestWire encode_request(const Options& options);
// Fills the run parameters of `into` (a server's options) from a client's request.
Result<void> decode_request(std::span<const std::byte> bytes, Options& into);

enum class CommandKind : std::uint8_t { run = 1, done = 2, finish = 3 };
struct Command {
    CommandKind kind = CommandKind::run;
    std::uint32_t size = 0;
    std::uint32_t iters = 0;
    friend bool operator==(const Command&, const Command&) = default;
};
inline constexpr std::size_t command_size = 12;
using CommandWire = std::array<std::byte, command_size>;
CommandWire encode_command(const Command& command);
// Also checks size and iterations against the limits of a run of `test`, and the size
// against `largest`, the one the client announced (the server's memory holds no more).
Result<Command> decode_command(std::span<const std::byte> bytes, Test test, std::uint32_t largest);

enum class ReplyKind : std::uint8_t { accepted = 1, refused = 2, ready = 3, verified = 4, mismatch = 5 };
struct Reply {
    ReplyKind kind = ReplyKind::accepted;
    std::string reason; // refused, mismatch: why (at most max_reason bytes)
    friend bool operator==(const Reply&, const Reply&) = default;
};
inline constexpr std::size_t max_reason = 200;
inline constexpr std::size_t reply_size = 4 + max_reason;
using ReplyWire = std::array<std::byte, reply_size>;
// A longer reason is cut to max_reason bytes.
ReplyWire encode_reply(const Reply& reply);
Result<Reply> decode_reply(std::span<const std::byte> bytes);

} // namespace rdmaxx::perf::protocol
