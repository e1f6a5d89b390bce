// What rdmaxx-copy prints: a progress line on a terminal, a line or a JSON object
// per file otherwise, and the total.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace rdmaxx::copy {

struct FileReport {
    std::string file;        // as given on the command line
    std::string stored_as;   // the server's name for it (relative to its directory)
    std::uint64_t bytes = 0;
    double seconds = 0;
    bool ok = false;
    std::string error;       // when !ok
};

double mib_per_s(std::uint64_t bytes, double seconds) noexcept;
// "12.5 MiB/s"-style pieces, pure.
std::string format_eta(double seconds);
std::string progress_line(const std::string& file, std::uint64_t done, std::uint64_t total, double seconds);
std::string summary_line(const FileReport& r);
std::string json_line(const FileReport& r);
std::string json_total(std::uint64_t files, std::uint64_t ok, std::uint64_t bytes, double seconds);
std::string json_escape(std::string_view text);

// Progress on a terminal: redrawn at most every 200 ms.
class Progress {
public:
    explicit Progress(bool terminal) : terminal_(terminal) {}
    void start(const std::string& file, std::uint64_t total);
    void advance(std::uint64_t done);
    // Clears the progress line (the caller prints the file's result next).
    void finish();

private:
    using Clock = std::chrono::steady_clock;
    bool terminal_;
    std::string file_;
    std::uint64_t total_ = 0;
    Clock::time_point started_{};
    Clock::time_point drawn_{};
    bool shown_ = false;
};

} // namespace rdmaxx::copy
