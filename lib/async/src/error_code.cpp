#include <rdmaxx/async/error_code.hpp>

#include <string>

#include <asio/error.hpp>

#include <infiniband/verbs.h>

namespace rdmaxx::async {

namespace {

class CompletionCategory final : public std::error_category {
public:
    const char* name() const noexcept override { return "rdmaxx.completion"; }
    std::string message(int status) const override { return ibv_wc_status_str(static_cast<ibv_wc_status>(status)); }
};

} // namespace

const std::error_category& completion_category() noexcept {
    static const CompletionCategory category;
    return category;
}

std::error_code to_error_code(const Error& error) noexcept {
    if (error.kind() == Error::Kind::completion)
        return {error.code(), completion_category()};
    return {error.code(), std::generic_category()};
}

int errno_of(const std::error_code& code) noexcept {
    const auto& category = code.category();
    if (category == asio::error::get_system_category() || category == std::system_category() ||
        category == std::generic_category())
        return code.value() != 0 ? code.value() : EIO;
    return EIO;
}

} // namespace rdmaxx::async
