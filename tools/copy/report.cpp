#include "report.hpp"

#include <cmath>

#include <fmt/format.h>

namespace rdmaxx::copy {

double mib_per_s(std::uint64_t bytes, double seconds) noexcept {
    return seconds > 0 ? static_cast<double>(bytes) / (1 << 20) / seconds : 0.0;
}

std::string format_eta(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0)
        return "--:--";
    const auto s = static_cast<std::uint64_t>(seconds + 0.5);
    if (s >= 3600)
        return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
    return fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string progress_line(const std::string& file, std::uint64_t done, std::uint64_t total, double seconds) {
    const double percent = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
    const double rate = mib_per_s(done, seconds);
    const double left = rate > 0 ? static_cast<double>(total - done) / (1 << 20) / rate : -1;
    return fmt::format("{}  {:5.1f}%  {:9.1f} MiB/s  ETA {}", file, percent, rate, format_eta(left));
}

std::string summary_line(const FileReport& r) {
    if (!r.ok)
        return fmt::format("{}: FAILED: {}", r.file, r.error);
    return fmt::format("{} -> {}  {} B  {:.3f} s  {:.1f} MiB/s", r.file, r.stored_as, r.bytes, r.seconds,
                       mib_per_s(r.bytes, r.seconds));
}

std::string json_escape(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 2);
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\')
            out += {'\\', c};
        else if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (u < 0x20 || u == 0x7f)
            out += fmt::format("\\u{:04x}", u);
        else
            out += c; // UTF-8 passes through; other bytes too (file names are bytes)
    }
    return out;
}

std::string json_line(const FileReport& r) {
    std::string line = fmt::format(R"({{"file": "{}", "ok": {}, "bytes": {}, "seconds": {:.6f}, "mib_per_s": {:.3f})",
                                   json_escape(r.file), r.ok ? "true" : "false", r.bytes, r.seconds,
                                   mib_per_s(r.bytes, r.seconds));
    if (r.ok)
        line += fmt::format(R"(, "stored_as": "{}")", json_escape(r.stored_as));
    else
        line += fmt::format(R"(, "error": "{}")", json_escape(r.error));
    return line + "}";
}

std::string json_total(std::uint64_t files, std::uint64_t ok, std::uint64_t bytes, double seconds) {
    return fmt::format(R"({{"total": true, "files": {}, "ok": {}, "failed": {}, "bytes": {}, "seconds": {:.6f}, )"
                       R"("mib_per_s": {:.3f}}})",
                       files, ok, files - ok, bytes, seconds, mib_per_s(bytes, seconds));
}

void Progress::start(const std::string& file, std::uint64_t total) {
    file_ = file;
    total_ = total;
    started_ = Clock::now();
    drawn_ = {};
    shown_ = false;
}

void Progress::advance(std::uint64_t done) {
    if (!terminal_)
        return;
    const auto now = Clock::now();
    if (shown_ && now - drawn_ < std::chrono::milliseconds(200) && done != total_)
        return;
    drawn_ = now;
    shown_ = true;
    const double seconds = std::chrono::duration<double>(now - started_).count();
    fmt::print(stderr, "\r{}\x1b[K", progress_line(file_, done, total_, seconds));
    std::fflush(stderr);
}

void Progress::finish() {
    if (terminal_ && shown_) {
        fmt::print(stderr, "\r\x1b[K");
        std::fflush(stderr);
    }
    shown_ = false;
}

} // namespace rdmaxx::copy
