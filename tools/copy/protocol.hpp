// rdmaxx-copy's control messages: what the client and the server say to each other
// over the Connection's send/receive (the file's bytes go by RDMA WRITE, not here).
//
// Every message: an 8-byte header, then its body; integers big-endian.
//   offset size
//        0    4  magic "RDXC"
//        4    1  version (1)
//        5    1  type (Type)
//        6    2  zero
// Bodies (exact sizes: a byte more or less is refused):
//   hello   (c->s) block u32, depth u32, files u32, total_bytes u64
//   ready   (s->c) -                      the staging region was lent just before
//   file    (c->s) size u64, mode u32, flags u8, target_len u16, name_len u16, target, name
//   file_ok (s->c) -                      send the chunks
//   ack     (s->c) through u32            chunks 0..through-1 are written: their slots are free
//   done    (c->s) checksum u64           XXH64 of the file's bytes
//   result  (s->c) code u32, text_len u16, text   per file: 0 and the final name, or errno and why
//   error   (s->c) code u32, text_len u16, text   the session ends (the server closes)
//
// Decoding trusts nothing: a wrong magic, version, type, size or field is an Error of
// kind protocol naming what was wrong. Encoding checks its own limits (a programming error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::copy {

inline constexpr std::uint32_t magic = 0x52445843; // "RDXC"
inline constexpr std::uint8_t version = 1;
inline constexpr std::size_t header_bytes = 8;
inline constexpr std::size_t max_message = 4096;  // the connections' max_message
inline constexpr std::size_t max_target = 3800;   // bytes of a destination path
inline constexpr std::size_t max_name = 255;      // a file name (NAME_MAX)
// a result's or error's text: what a message holds after its header, code and length
// (a stored file's name, up to max_target + 1 + max_name, is a result's text)
inline constexpr std::size_t max_text = max_message - header_bytes - 6;
static_assert(max_text >= max_target + 1 + max_name);

// Limits on the transfer's shape, checked by both sides.
inline constexpr std::uint32_t min_block = 4096;
inline constexpr std::uint32_t max_block = 16u << 20;
inline constexpr std::uint32_t max_depth = 64;
inline constexpr std::uint64_t max_staging = 64ull << 20; // block x depth
inline constexpr std::uint32_t max_files = 1u << 20;

enum class Type : std::uint8_t { hello = 1, ready, file, file_ok, ack, done, result, error };

struct Hello {
    std::uint32_t block = 0;
    std::uint32_t depth = 0;
    std::uint32_t files = 0;
    std::uint64_t total_bytes = 0;
    bool operator==(const Hello&) const = default;
};
struct Ready {
    bool operator==(const Ready&) const = default;
};
inline constexpr std::uint8_t file_into_directory = 1; // several files: target must be a directory
struct File {
    std::uint64_t size = 0;
    std::uint32_t mode = 0;
    std::uint8_t flags = 0;
    std::string target; // relative to the served directory; empty: the directory itself
    std::string name;   // the source's base name
    bool operator==(const File&) const = default;
};
struct FileOk {
    bool operator==(const FileOk&) const = default;
};
struct Ack {
    std::uint32_t through = 0;
    bool operator==(const Ack&) const = default;
};
struct Done {
    std::uint64_t checksum = 0;
    bool operator==(const Done&) const = default;
};
struct FileResult {
    std::uint32_t code = 0; // 0: stored under `text`; else an errno value, `text` says why
    std::string text;
    bool operator==(const FileResult&) const = default;
};
struct SessionError {
    std::uint32_t code = 0;
    std::string text;
    bool operator==(const SessionError&) const = default;
};

using Message = std::variant<Hello, Ready, File, FileOk, Ack, Done, FileResult, SessionError>;

// Encodes into `out` (resized). Programming error: a field beyond its limit.
void encode(const Message& message, std::vector<std::byte>& out,
            std::source_location where = std::source_location::current());
// Decodes one received message.
Result<Message> decode(std::span<const std::byte> bytes);

// Checks a hello's shape (from the network or the command line).
Result<void> check_hello(const Hello& hello);
// Chunks of a file of `size` bytes in blocks of `block` (an Error above 2^32 - 1).
Result<std::uint32_t> chunk_count(std::uint64_t size, std::uint32_t block);

std::string_view type_name(Type type) noexcept;

} // namespace rdmaxx::copy
