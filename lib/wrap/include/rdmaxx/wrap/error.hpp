/// @file
/// rdmaxx error model: the safety split.
///
///  * A runtime error is anything libibverbs, librdmacm, the peer or the network can
///    report. It is returned as `Result<T>` (`std::expected<T, Error>`), never thrown,
///    never aborted on.
///  * A programming error is a misuse the documentation of a call forbids (a slice out
///    of range, a moved-from object, an operation the QP type does not support). It is
///    logged with the caller's source location and aborts the process: such a bug must
///    be fixed, not handled. Every call documents its programming errors.
#pragma once

#include <cerrno>
#include <cstdint>
#include <expected>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace rdmaxx {

/// A runtime error: the call that failed, what kind of failure, its code, and context
/// for the reader. Formats with fmt as message() writes it.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe to read concurrently (every
/// member but assignment is const).
class Error {
public:
    /// What `code()` means.
    enum class Kind : std::uint8_t {
        system,      ///< code is an errno value
        completion,  ///< code is an `ibv_wc_status`
        timeout,     ///< a bounded wait ran out; code is ETIMEDOUT
        protocol,    ///< the peer sent something malformed; code is EPROTO
        unsupported, ///< the device or the build lacks a feature; code is EOPNOTSUPP
        cancelled,   ///< the caller cancelled the operation; code is ECANCELED
    };

    /// An Error of `kind` and `code`. `call` names the failing function
    /// (e.g.\ "ibv_create_qp"); it must be a string with static storage duration.
    /// `detail` adds context for the reader.
    Error(Kind kind, const char* call, int code, std::string detail = {})
        : call_(call), detail_(std::move(detail)), code_(code), kind_(kind) {}

    /// A system error: `errnum` is the errno value `call` failed with.
    static Error from_errno(const char* call, int errnum, std::string detail = {}) {
        return {Kind::system, call, errnum, std::move(detail)};
    }
    /// For the many verbs that return NULL or -1 and leave the reason in errno. A
    /// library that forgot to set errno must not produce "Success": that becomes EIO.
    /// The detail is a format string and its arguments, formatted after errno is read:
    /// a detail built at the call site (a std::string, fmt::format) is built before,
    /// and its allocation may change errno.
    template <class... Args>
    static Error from_last_errno(const char* call, fmt::format_string<Args...> detail = "", Args&&... args) {
        const int errnum = errno;
        return from_errno(call, errnum != 0 ? errnum : EIO, fmt::format(detail, std::forward<Args>(args)...));
    }
    /// A failed work completion; `code` is its `ibv_wc_status`.
    static Error completion(int status, std::string detail = {}) {
        return {Kind::completion, "ibv_poll_cq", status, std::move(detail)};
    }
    /// A bounded wait in `call` that ran out (code ETIMEDOUT).
    static Error timeout(const char* call, std::string detail = {}) {
        return {Kind::timeout, call, ETIMEDOUT, std::move(detail)};
    }
    /// Something malformed from the peer, found by `call` (code EPROTO); `detail` says
    /// what.
    static Error protocol(const char* call, std::string detail) {
        return {Kind::protocol, call, EPROTO, std::move(detail)};
    }
    /// A feature `call` needs that the device or the build lacks (code EOPNOTSUPP).
    static Error unsupported(const char* call, std::string detail) {
        return {Kind::unsupported, call, EOPNOTSUPP, std::move(detail)};
    }
    /// An operation the caller cancelled (code ECANCELED).
    static Error cancelled(const char* call, std::string detail = {}) {
        return {Kind::cancelled, call, ECANCELED, std::move(detail)};
    }

    Kind kind() const noexcept { return kind_; } ///< What code() means.
    const char* call() const noexcept { return call_; } ///< The failing function's name.
    int code() const noexcept { return code_; } ///< An errno value or an `ibv_wc_status` (kind()).
    const std::string& detail() const noexcept { return detail_; } ///< Context; may be empty.

    /// A system error with the errno value `errnum`.
    bool is_errno(int errnum) const noexcept { return kind_ == Kind::system && code_ == errnum; }
    bool is_timeout() const noexcept { return kind_ == Kind::timeout; } ///< Of kind timeout.
    bool is_cancelled() const noexcept { return kind_ == Kind::cancelled; } ///< Of kind cancelled.

    /// The error in one line, as a log shows it:
    /// "ibv_create_qp: Cannot allocate memory (errno 12): max_send_wr 1000000 ..."
    std::string message() const;

private:
    const char* call_;
    std::string detail_;
    int code_;
    Kind kind_;
};

/// `std::expected<T, Error>`, and `[[nodiscard]]`: a runtime error must not be dropped by
/// accident (write `(void)` where dropping it is meant).
///
/// @threadsafety As std::expected.
template <class T>
class [[nodiscard]] Result : public std::expected<T, Error> {
public:
    using std::expected<T, Error>::expected;
    /// A plain std::expected, as a Result.
    Result(std::expected<T, Error> value) : std::expected<T, Error>(std::move(value)) {} // NOLINT: implicit
};

/// The kind's name ("system", "completion", "timeout", ...).
std::string_view to_string(Error::Kind kind) noexcept;

namespace detail {

// Logs `what` with the caller's location at critical level and aborts.
[[noreturn]] void programming_error(std::string_view what, std::source_location where);

} // namespace detail

namespace detail {

// The failing side of require(): formatted out of line, so that the passing side is
// one branch the compiler inlines into the hot path without the formatting code.
template <class... Args>
[[noreturn, gnu::cold, gnu::noinline]] void fail(std::source_location where, fmt::format_string<Args...> what,
                                                 Args&&... args) {
    programming_error(fmt::format(what, std::forward<Args>(args)...), where);
}

} // namespace detail

/// Aborts with a programming error unless `condition` holds. `where` must be the public
/// call's own `std::source_location` parameter, so the message names the user's line.
/// The message is formatted only on failure: a passing check costs one branch.
template <class... Args>
inline void require(bool condition, std::source_location where, fmt::format_string<Args...> what,
                    Args&&... args) {
    if (!condition) [[unlikely]]
        detail::fail<Args...>(where, what, std::forward<Args>(args)...);
}

namespace detail {

// A wrapper's handle, or an abort naming the caller when the wrapper was moved from.
// Inline: every post and poll goes through one.
template <class Handle>
const Handle& live(const Handle& handle, std::string_view type, std::source_location where) {
    require(handle != nullptr, where, "use of a moved-from {}", type);
    return handle;
}

} // namespace detail

} // namespace rdmaxx

/// @cond
template <>
struct fmt::formatter<rdmaxx::Error> : fmt::formatter<std::string_view> {
    auto format(const rdmaxx::Error& e, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(e.message(), ctx);
    }
};
/// @endcond
