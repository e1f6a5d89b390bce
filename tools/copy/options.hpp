// rdmaxx-copy's command line (pure: tested on the host).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::copy {

inline constexpr std::uint16_t default_port = 18520;

struct Options {
    bool help = false;
    // server
    std::optional<std::string> serve; // DIR
    bool once = false;
    std::string bind = "0.0.0.0";
    // sessions served at once: each pins up to max_staging of the server's memory
    std::uint32_t max_clients = 16;
    // client
    std::vector<std::string> files;
    std::string host;
    std::string target; // after "HOST:", may be empty
    std::uint32_t block = 1u << 20;
    std::uint32_t depth = 4;
    bool json = false;
    // both
    std::string device;
    std::optional<std::uint32_t> gid_index;
    std::uint16_t port = default_port;
    bool rdma_cm = false;
    std::chrono::milliseconds timeout{30'000};
};

// The arguments after the program's name. An Error (EINVAL) saying what is wrong.
Result<Options> parse_options(std::span<const std::string_view> args);

// "HOST:PATH" or "[V6ADDR]:PATH" -> host and path; nullopt without a ':'.
struct Remote {
    std::string host;
    std::string path;
};
std::optional<Remote> parse_remote(std::string_view text);

// "4096", "64K", "1M", "1MiB": bytes (K = 1024).
std::optional<std::uint64_t> parse_size(std::string_view text);

// --help: a manual page in plain text.
std::string_view manual();

} // namespace rdmaxx::copy
