/// @file
/// rdmaxx::Error as a std::error_code, for code that needs one (an Asio composition, a
/// library that reports std::error_code). Kinds whose code is an errno value map to
/// std::generic_category (so `code == std::errc::timed_out` works); a failed work
/// completion maps to completion_category(), whose values are ibv_wc_status values and
/// whose messages are ibv_wc_status_str's. The mapping drops the Error's call and
/// detail: keep the Error where a person will read it.
#pragma once

#include <system_error>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::async {

/// The category of failed work completions ("rdmaxx.completion"): its values are
/// ibv_wc_status values, its messages ibv_wc_status_str's.
const std::error_category& completion_category() noexcept;

/// `error` as a std::error_code: a failed work completion's in completion_category(),
/// every other kind's errno value in std::generic_category. Call and detail are dropped.
std::error_code to_error_code(const Error& error) noexcept;

/// The errno value an Asio (or std) error code carries: its value when its category is
/// Asio's system category (which is not std::system_category: comparing with the latter
/// turns a refused connection into EIO) or std's system or generic one; EIO otherwise.
int errno_of(const std::error_code& code) noexcept;

} // namespace rdmaxx::async
