#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/events.hpp>
#include <rdmaxx/wrap/deadline.hpp>

#include <fmt/format.h>

namespace rdmaxx {

std::string_view to_string(WcOpcode opcode) noexcept {
    switch (opcode) {
    case WcOpcode::send: return "SEND";
    case WcOpcode::rdma_write: return "RDMA_WRITE";
    case WcOpcode::rdma_read: return "RDMA_READ";
    case WcOpcode::compare_swap: return "COMPARE_SWAP";
    case WcOpcode::fetch_add: return "FETCH_ADD";
    case WcOpcode::recv: return "RECV";
    case WcOpcode::recv_rdma_with_imm: return "RECV_RDMA_WITH_IMM";
    case WcOpcode::unknown: break;
    }
    return "unknown";
}

WcOpcode WorkCompletion::opcode() const noexcept {
    if (!ok())
        return WcOpcode::unknown;
    switch (wc_.opcode) {
    case IBV_WC_SEND: return WcOpcode::send;
    case IBV_WC_RDMA_WRITE: return WcOpcode::rdma_write;
    case IBV_WC_RDMA_READ: return WcOpcode::rdma_read;
    case IBV_WC_COMP_SWAP: return WcOpcode::compare_swap;
    case IBV_WC_FETCH_ADD: return WcOpcode::fetch_add;
    case IBV_WC_RECV: return WcOpcode::recv;
    case IBV_WC_RECV_RDMA_WITH_IMM: return WcOpcode::recv_rdma_with_imm;
    default: return WcOpcode::unknown;
    }
}

Error WorkCompletion::error(std::source_location where) const {
    require(!ok(), where, "error() of a successful completion (wr_id {})", wc_.wr_id);
    return Error::completion(wc_.status, fmt::format("wr_id {} on QP {:#x}, vendor error {:#x}", wc_.wr_id, wc_.qp_num,
                                                     wc_.vendor_err));
}

namespace detail {

Error poll_error(int n) { return Error::from_errno("ibv_poll_cq", EIO, fmt::format("the provider returned {}", n)); }

Result<void> WaitPause::operator()(CompletionQueue& cq, const WaitOptions& options) {
    if (options.events)
        if (auto ok = options.events->check(options.qp, &cq); !ok)
            return ok;
    const auto now = std::chrono::steady_clock::now();
    if (!deadline_)
        deadline_ = deadline_after(now, options.timeout);
    if (now >= *deadline_)
        return std::unexpected(
            Error::timeout("wait", fmt::format("no completion within {} ms", options.timeout.count())));
    if (options.mode == WaitMode::event) {
        auto woke = cq.wait_event_until(*deadline_, options.events ? options.events->fd() : -1);
        if (!woke && !woke.error().is_timeout())
            return woke;
    }
    return {};
}

} // namespace detail
} // namespace rdmaxx
