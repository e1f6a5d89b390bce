#include "paths.hpp"

#include <cerrno>
#include <climits>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "protocol.hpp"

namespace rdmaxx::copy {
namespace {

Error refused(int code, std::string why) { return Error::from_errno("rdmaxx-copy", code, std::move(why)); }

} // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0)
            ::close(fd_);
        fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
}

Fd::~Fd() {
    if (fd_ >= 0)
        ::close(fd_);
}

Result<SplitPath> split_destination(std::string_view path) {
    SplitPath split;
    if (path.size() > max_target)
        return std::unexpected(refused(ENAMETOOLONG, fmt::format("a destination of {} B (at most {})", path.size(),
                                                                 max_target)));
    if (path.find('\0') != std::string_view::npos)
        return std::unexpected(refused(EINVAL, "a destination with a NUL byte"));
    if (path.empty())
        return split;
    if (path.front() == '/')
        return std::unexpected(refused(EACCES, fmt::format("'{}' is absolute: destinations are relative to the "
                                                           "served directory", path)));
    if (path.back() == '/') {
        split.directory = true;
        path.remove_suffix(1);
    }
    std::size_t at = 0;
    while (at <= path.size()) {
        const std::size_t slash = std::min(path.find('/', at), path.size());
        const std::string_view part = path.substr(at, slash - at);
        if (part.empty())
            return std::unexpected(refused(EINVAL, "a destination with an empty component ('//' or a lone '/')"));
        if (part == "..")
            return std::unexpected(refused(EACCES, "'..' in a destination: paths outside the served directory are "
                                                   "refused"));
        if (part == ".")
            return std::unexpected(refused(EINVAL, "'.' in a destination"));
        if (part.size() > NAME_MAX)
            return std::unexpected(refused(ENAMETOOLONG, "a destination component longer than NAME_MAX"));
        split.components.emplace_back(part);
        at = slash + 1;
    }
    return split;
}

Result<void> check_file_name(std::string_view name) {
    if (name.empty() || name == "." || name == "..")
        return std::unexpected(refused(EINVAL, fmt::format("'{}' is not a file name", name)));
    if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos)
        return std::unexpected(refused(EACCES, "a file name with '/' or NUL"));
    if (name.size() > NAME_MAX)
        return std::unexpected(refused(ENAMETOOLONG, "a file name longer than NAME_MAX"));
    return {};
}

namespace {

// Opens directory `name` in `dir`, never through a symbolic link.
Result<Fd> open_directory(int dir, const std::string& name, std::string_view shown) {
    const int fd = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0)
        return Fd(fd);
    const int e = errno;
    if (e == ELOOP)
        return std::unexpected(refused(EACCES, fmt::format("'{}' is a symbolic link: links are not followed", shown)));
    if (e == ENOTDIR) {
        struct stat st{};
        if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
            return std::unexpected(
                refused(EACCES, fmt::format("'{}' is a symbolic link: links are not followed", shown)));
        return std::unexpected(refused(ENOTDIR, fmt::format("'{}' is not a directory", shown)));
    }
    return std::unexpected(refused(e, fmt::format("'{}': {}", shown, std::strerror(e))));
}

} // namespace

Result<Destination> resolve(int root, std::string_view target, std::string_view name, bool into_directory) {
    if (auto ok = check_file_name(name); !ok)
        return std::unexpected(ok.error());
    auto split = split_destination(target);
    if (!split)
        return std::unexpected(split.error());
    const int self = ::openat(root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (self < 0)
        return std::unexpected(Error::from_last_errno("openat", "the served directory"));
    Destination d{.directory = Fd(self), .name = std::string(name), .shown = {}};
    std::string walked;
    bool renamed = false; // the path's last component is the file's new name
    const auto& parts = split->components;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        walked += (i ? "/" : "") + parts[i];
        const bool last = i + 1 == parts.size();
        if (last) {
            struct stat st{};
            if (::fstatat(d.directory.get(), parts[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
                if (S_ISLNK(st.st_mode))
                    return std::unexpected(refused(EACCES, fmt::format("'{}' is a symbolic link: links are not "
                                                                       "followed", walked)));
                if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
                    return std::unexpected(refused(EINVAL, fmt::format("'{}' is not a regular file", walked)));
                if (S_ISREG(st.st_mode) && !into_directory && !split->directory) {
                    d.name = parts[i]; // an existing file, replaced
                    renamed = true;
                    break;
                }
                if (S_ISREG(st.st_mode))
                    return std::unexpected(refused(ENOTDIR, fmt::format("'{}' is not a directory", walked)));
            } else if (errno == ENOENT) {
                if (into_directory || split->directory)
                    return std::unexpected(refused(ENOENT, fmt::format("no directory '{}'", walked)));
                d.name = parts[i]; // a new name
                renamed = true;
                break;
            } else {
                const int e = errno;
                return std::unexpected(refused(e, fmt::format("'{}': {}", walked, std::strerror(e))));
            }
        }
        auto next = open_directory(d.directory.get(), parts[i], walked);
        if (!next)
            return std::unexpected(next.error());
        d.directory = std::move(*next);
    }
    d.shown = renamed ? walked : walked.empty() ? d.name : walked + "/" + d.name;
    // the final name itself: a regular file (replaced) or nothing
    struct stat st{};
    if (::fstatat(d.directory.get(), d.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISLNK(st.st_mode))
            return std::unexpected(
                refused(EACCES, fmt::format("'{}' is a symbolic link: links are not replaced", d.shown)));
        if (S_ISDIR(st.st_mode))
            return std::unexpected(refused(EISDIR, fmt::format("'{}' is a directory", d.shown)));
        if (!S_ISREG(st.st_mode))
            return std::unexpected(refused(EINVAL, fmt::format("'{}' is not a regular file", d.shown)));
    }
    return d;
}

std::string temporary_name(std::string_view name, std::uint64_t random) {
    constexpr std::size_t room = NAME_MAX - 1 - 14; // "." + ".rdmaxx-" + 6
    return fmt::format(".{}.rdmaxx-{:06x}", name.substr(0, room), random & 0xffffff);
}

} // namespace rdmaxx::copy
