// The command-line walk rdmaxx's programs share (rdmaxx-perf, rdmaxx-copy): an
// argument seen as a flag, with the value attached to it ("--depth=8") or following it.
// What each flag means, and which take values, stays with each program.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace rdmaxx::cli {

struct Flag {
    std::string_view name;                    // "--depth" of "--depth=8"; a short flag whole
    std::optional<std::string_view> attached; // "8" of "--depth=8"

    // Whether this is `shorter` ("-d"; empty: the flag has no short form) or `longer`.
    bool is(std::string_view shorter, std::string_view longer) const noexcept {
        return (!shorter.empty() && name == shorter) || name == longer;
    }
};

// `arg` as a flag: a long one may carry its value after '='.
inline Flag split_flag(std::string_view arg) noexcept {
    if (arg.starts_with("--"))
        if (const auto eq = arg.find('='); eq != std::string_view::npos)
            return {arg.substr(0, eq), arg.substr(eq + 1)};
    return {arg, std::nullopt};
}

// The value of `flag`, which is args[i]: the attached one, else the next argument (i
// moves past it); nullopt when there is neither.
inline std::optional<std::string_view> flag_value(const Flag& flag, std::span<const std::string_view> args,
                                                  std::size_t& i) noexcept {
    if (flag.attached)
        return flag.attached;
    if (i + 1 < args.size())
        return args[++i];
    return std::nullopt;
}

} // namespace rdmaxx::cli
