#include "options.hpp"

#include <cerrno>
#include <charconv>

#include <fmt/format.h>

#include <cli/flag.hpp>

#include "protocol.hpp"

namespace rdmaxx::copy {
namespace {

Error invalid(std::string detail) { return Error::from_errno("rdmaxx-copy", EINVAL, std::move(detail)); }

std::optional<std::uint64_t> number(std::string_view text) {
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size())
        return std::nullopt;
    return value;
}

bool takes_value(std::string_view flag) {
    for (const std::string_view f : {"--serve", "--bind", "-d", "--ib-dev", "-x", "--gid-index", "-p", "--port", "-b",
                                     "--block", "--depth", "--timeout", "--max-clients"})
        if (flag == f)
            return true;
    return false;
}

} // namespace

std::optional<std::uint64_t> parse_size(std::string_view text) {
    std::uint64_t unit = 1;
    if (text.ends_with("iB"))
        text.remove_suffix(2);
    else if (text.ends_with("B"))
        text.remove_suffix(1);
    if (!text.empty()) {
        const char last = text.back();
        if (last == 'K' || last == 'k')
            unit = 1ull << 10;
        else if (last == 'M' || last == 'm')
            unit = 1ull << 20;
        else if (last == 'G' || last == 'g')
            unit = 1ull << 30;
        if (unit != 1)
            text.remove_suffix(1);
    }
    const auto n = number(text);
    if (!n || *n > (~0ull) / unit)
        return std::nullopt;
    return *n * unit;
}

std::optional<Remote> parse_remote(std::string_view text) {
    if (text.starts_with('[')) {
        const auto close = text.find("]:");
        if (close == std::string_view::npos || close == 1)
            return std::nullopt;
        return Remote{.host = std::string(text.substr(1, close - 1)), .path = std::string(text.substr(close + 2))};
    }
    const auto colon = text.find(':');
    if (colon == std::string_view::npos || colon == 0)
        return std::nullopt;
    return Remote{.host = std::string(text.substr(0, colon)), .path = std::string(text.substr(colon + 1))};
}

Result<Options> parse_options(std::span<const std::string_view> args) {
    Options o;
    std::vector<std::string_view> positional;
    bool only_positional = false;
    for (std::size_t i = 0; i < args.size(); ++i) {
        std::string_view arg = args[i];
        if (only_positional || arg == "-" || !arg.starts_with('-')) {
            positional.push_back(arg);
            continue;
        }
        if (arg == "--") {
            only_positional = true;
            continue;
        }
        const cli::Flag flag = cli::split_flag(arg);
        arg = flag.name;
        const auto is = [&](std::string_view shorter, std::string_view longer) { return flag.is(shorter, longer); };
        std::optional<std::string_view> value;
        if (takes_value(arg)) {
            value = cli::flag_value(flag, args, i);
            if (!value)
                return std::unexpected(invalid(fmt::format("{} needs a value", arg)));
        }
        if (is("-h", "--help")) {
            o.help = true;
            return o;
        } else if (is("", "--json")) {
            o.json = true;
        } else if (is("", "--once")) {
            o.once = true;
        } else if (is("-R", "--rdma_cm")) {
            o.rdma_cm = true;
        } else if (is("", "--serve")) {
            o.serve = std::string(*value);
        } else if (is("", "--bind")) {
            o.bind = std::string(*value);
        } else if (is("-d", "--ib-dev")) {
            o.device = std::string(*value);
        } else if (is("-x", "--gid-index")) {
            const auto n = number(*value);
            if (!n || *n > 1023)
                return std::unexpected(invalid(fmt::format("{} takes 0..1023, not '{}'", arg, *value)));
            o.gid_index = static_cast<std::uint32_t>(*n);
        } else if (is("-p", "--port")) {
            const auto n = number(*value);
            if (!n || *n < 1 || *n > 65535)
                return std::unexpected(invalid(fmt::format("{} takes 1..65535, not '{}'", arg, *value)));
            o.port = static_cast<std::uint16_t>(*n);
        } else if (is("-b", "--block")) {
            const auto n = parse_size(*value);
            if (!n || *n < min_block || *n > max_block)
                return std::unexpected(
                    invalid(fmt::format("{} takes {}..{} bytes (K and M allowed), not '{}'", arg, min_block,
                                        max_block, *value)));
            o.block = static_cast<std::uint32_t>(*n);
        } else if (is("", "--depth")) {
            const auto n = number(*value);
            if (!n || *n < 1 || *n > max_depth)
                return std::unexpected(invalid(fmt::format("{} takes 1..{}, not '{}'", arg, max_depth, *value)));
            o.depth = static_cast<std::uint32_t>(*n);
        } else if (is("", "--max-clients")) {
            const auto n = number(*value);
            if (!n || *n < 1 || *n > 1024)
                return std::unexpected(invalid(fmt::format("{} takes 1..1024, not '{}'", arg, *value)));
            o.max_clients = static_cast<std::uint32_t>(*n);
        } else if (is("", "--timeout")) {
            const auto n = number(*value);
            if (!n || *n < 1 || *n > 86400)
                return std::unexpected(invalid(fmt::format("{} takes seconds, 1..86400, not '{}'", arg, *value)));
            o.timeout = std::chrono::seconds(*n);
        } else {
            return std::unexpected(invalid(fmt::format("unknown option {} (see --help)", arg)));
        }
    }
    if (std::uint64_t{o.block} * o.depth > max_staging)
        return std::unexpected(invalid(fmt::format("--block x --depth = {} B: at most {} B of staging",
                                                   std::uint64_t{o.block} * o.depth, max_staging)));
    if (o.serve) {
        if (!positional.empty())
            return std::unexpected(invalid(fmt::format("--serve DIR takes no files ('{}')", positional.front())));
        if (o.serve->empty())
            return std::unexpected(invalid("--serve needs a directory"));
        return o;
    }
    if (o.once)
        return std::unexpected(invalid("--once goes with --serve"));
    if (positional.size() < 2)
        return std::unexpected(invalid("usage: rdmaxx-copy FILE... HOST:[PATH], or rdmaxx-copy --serve DIR (see --help)"));
    const auto remote = parse_remote(positional.back());
    if (!remote)
        return std::unexpected(invalid(fmt::format("the last argument must be HOST:[PATH], not '{}'", positional.back())));
    if (remote->path.size() > max_target)
        return std::unexpected(invalid(fmt::format("a destination PATH of {} B: at most {}", remote->path.size(),
                                                   max_target)));
    o.host = remote->host;
    o.target = remote->path;
    positional.pop_back();
    if (positional.size() > max_files)
        return std::unexpected(invalid(fmt::format("{} files: at most {}", positional.size(), max_files)));
    for (const auto file : positional)
        o.files.emplace_back(file);
    return o;
}

std::string_view manual() {
    return R"(RDMAXX-COPY(1)                  rdmaxx                  RDMAXX-COPY(1)

NAME
    rdmaxx-copy - copy files between two hosts over RDMA

SYNOPSIS
    rdmaxx-copy --serve DIR [--once] [--max-clients N] [--bind ADDRESS] [-p PORT]
                [-R] [-d DEVICE] [-x GID_INDEX] [--timeout SECONDS]
    rdmaxx-copy [-b BLOCK] [--depth N] [--json] [-p PORT] [-R] [-d DEVICE]
                [-x GID_INDEX] [--timeout SECONDS] FILE... HOST:[PATH]

DESCRIPTION
    The server (--serve DIR) receives files into DIR; the client sends each FILE
    to it. The file's bytes move by RDMA WRITE with an immediate, several blocks in
    flight, from the client's registered staging memory into a staging region the
    server lends for the session; the server writes each block to a temporary file
    (.NAME.rdmaxx-XXXXXX, beside the final name) with ordinary I/O. Both sides hash
    the bytes (XXH64); when they match the server syncs the file and renames it
    over the final name, otherwise it removes it and the client reports an error.
    No partial file is ever left under the final name, and none at all once a
    broken connection is noticed.

    Destination (PATH is relative to DIR):
      HOST:          DIR, under the file's own name
      HOST:PATH      if PATH is an existing directory, inside it; otherwise (one
                     FILE only) PATH is the new name, in an existing directory;
                     several FILEs need PATH to be a directory. A trailing '/'
                     says PATH must be a directory.
    The server refuses absolute paths, '..', '.', empty components, NUL bytes,
    and symbolic links anywhere on the way (links are neither followed nor
    replaced), so nothing is written outside DIR.

    The server serves clients until it is killed (--once: one client, then exit),
    several at once on one thread (at most --max-clients; one more is told the
    server is busy). A malformed or hostile client is logged and dropped; the next
    one is served.

    Output: on a terminal, a progress line per file on stderr (percent, MiB/s,
    ETA); otherwise one line per file on stdout (name, bytes, seconds, MiB/s).
    --json prints instead one JSON object per file and one for the total on
    stdout. Errors go to stderr.

OPTIONS
        --serve DIR        serve, receiving files into DIR
        --once             serve one client, then exit (its status: 0 only if
                           every file it sent was stored)
        --max-clients N    clients served at once (16; 1..1024): each pins up to
                           64 MiB of staging; one more is refused (busy)
        --bind ADDRESS     the address to listen on (0.0.0.0; with -R, an address
                           of the RDMA device's netdev)
    -b, --block BYTES      block size of each RDMA WRITE (1M; 4K..16M, K and M
                           allowed)
        --depth N          blocks in flight (4; 1..64; BLOCK x N at most 64 MiB)
        --json             JSON output (see above)
    -p, --port N           TCP port of the connection's handshake, or the RDMA CM
                           port (18520)
    -R, --rdma_cm          connect through RDMA CM instead of TCP
    -d, --ib-dev NAME      RDMA device (default $RDMAXX_DEVICE, else the first;
                           with -R, the device the address resolves to)
    -x, --gid-index N      GID index (default: the RoCE v2 IPv4 entry, or 0 on
                           InfiniBand)
        --timeout SECONDS  the longest either side waits for the other, plus 30 s
                           for each MiB a single wait covers (30)
    -h, --help             this page

EXIT STATUS
    0   every file arrived and its checksum matched (server with --once: every
        file of its client was stored)
    1   at least one file failed (refused, checksum mismatch, I/O error, the
        connection lost); each failure is named on stderr
    2   bad usage

EXAMPLES
    rdmaxx-copy --serve /srv/incoming
    rdmaxx-copy data.bin 10.0.0.1:
    rdmaxx-copy a.img b.img 10.0.0.1:images/
    rdmaxx-copy -R -b 4M --depth 8 big.img 10.0.0.1:backup/big.img
    rdmaxx-copy --json *.log 10.0.0.1:logs | jq .mib_per_s

SEE ALSO
    rdmaxx-perf(1)
)";
}

} // namespace rdmaxx::copy
