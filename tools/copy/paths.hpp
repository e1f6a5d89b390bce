// Where the server puts a file: the destination rules, and opening everything
// relative to the served directory without ever leaving it.
//
// Rules for a destination PATH (from the network: trusted for nothing):
//   * relative, at most max_target bytes, no NUL, no empty component ("a//b"), no "."
//     or ".." component; one trailing "/" is allowed and means "a directory";
//   * empty: the served directory itself, the file keeps its name;
//   * an existing directory: the file goes inside it under its own name;
//   * otherwise (one file only, no trailing "/"): the file's new name, in an existing
//     directory;
//   * no component, and not the final name, may be a symbolic link: links are never
//     followed nor replaced (each component is opened with O_NOFOLLOW, relative to
//     the one before, starting at the served directory's descriptor);
//   * the final name is a regular file (replaced) or does not exist.
// A file's own name: one component, not "." or "..", no "/" or NUL, at most NAME_MAX.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::copy {

// A descriptor closed on destruction.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) noexcept : fd_(fd) {}
    Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    Fd& operator=(Fd&& other) noexcept;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd();
    int get() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }

private:
    int fd_ = -1;
};

struct SplitPath {
    std::vector<std::string> components;
    bool directory = false; // a trailing "/"
};

// The rules above on a destination path's text (pure). An Error (EINVAL, EACCES for
// an escape) that says which rule it broke.
Result<SplitPath> split_destination(std::string_view path);
Result<void> check_file_name(std::string_view name);

// Where a file lands: an open directory (beneath the served one) and a name in it.
struct Destination {
    Fd directory;
    std::string name;
    std::string shown; // relative to the served directory, for messages
};

// Applies the rules under `root` (an open directory). `into_directory`: several files
// are sent, so the path must name a directory.
Result<Destination> resolve(int root, std::string_view target, std::string_view name, bool into_directory);

// The temporary name of `name` (".NAME.rdmaxx-XXXXXX", shortened to fit NAME_MAX).
std::string temporary_name(std::string_view name, std::uint64_t random);

} // namespace rdmaxx::copy
