#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/log.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <infiniband/verbs.h>

namespace rdmaxx {

std::string_view to_string(Error::Kind kind) noexcept {
    switch (kind) {
    case Error::Kind::system: return "system";
    case Error::Kind::completion: return "completion";
    case Error::Kind::timeout: return "timeout";
    case Error::Kind::protocol: return "protocol";
    case Error::Kind::unsupported: return "unsupported";
    case Error::Kind::cancelled: return "cancelled";
    }
    return "unknown";
}

std::string Error::message() const {
    std::string text;
    switch (kind_) {
    case Kind::system:
        text = fmt::format("{}: {} (errno {})", call_, std::strerror(code_), code_);
        break;
    case Kind::completion:
        text = fmt::format("{}: work completion failed: {} (status {})", call_,
                           ibv_wc_status_str(static_cast<ibv_wc_status>(code_)), code_);
        break;
    default:
        text = fmt::format("{}: {}", call_, to_string(kind_));
        break;
    }
    if (!detail_.empty())
        fmt::format_to(std::back_inserter(text), ": {}", detail_);
    return text;
}

namespace detail {

void programming_error(std::string_view what, std::source_location where) {
    const auto text = fmt::format("programming error: {} (called from {}:{} in {})", what,
                                  where.file_name(), where.line(), where.function_name());
    const auto log = logger();
    if (log->should_log(spdlog::level::critical) && !log->sinks().empty()) {
        log->critical("{}", text);
        log->flush();
    } else {
        std::fprintf(stderr, "rdmaxx: %s\n", text.c_str());
    }
    std::abort();
}

} // namespace detail
} // namespace rdmaxx
