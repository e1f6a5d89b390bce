#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/events.hpp>

#include <algorithm>
#include <optional>

#include <poll.h>

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

Result<void> wait_until(CompletionQueue& cq, const WaitOptions& options, FunctionRef<std::size_t()> room,
                        FunctionRef<bool(const WorkCompletion&)> take, std::source_location where) {
    require(options.mode != WaitMode::event || cq.has_channel(), where,
            "an event wait on a completion queue created without a channel");
    using clock = std::chrono::steady_clock;
    // A busy wait that ends within its first 256 polls never reads the clock (most
    // waits on a hot path): the deadline starts at the first look, 256 polls in.
    std::optional<clock::time_point> deadline;
    if (options.mode == WaitMode::event)
        deadline = clock::now() + options.timeout;
    std::array<WorkCompletion, 16> batch;
    // Drains what is there; true when `take` is satisfied, an Error on a failure.
    const auto drain = [&]() -> Result<bool> {
        for (;;) {
            const std::size_t want = std::min(room(), batch.size());
            auto n = poll(cq, std::span(batch).first(want));
            if (!n)
                return std::unexpected(std::move(n.error()));
            for (std::size_t i = 0; i < *n; ++i) {
                const bool done = take(batch[i]);
                if (!batch[i].ok())
                    return std::unexpected(batch[i].error());
                if (done)
                    return true;
            }
            if (*n < want)
                return false;
        }
    };
    const auto fatal_event = [&]() -> Result<void> {
        if (!options.events)
            return {};
        return options.events->check(options.qp_num);
    };
    for (unsigned spins = 0;; ++spins) {
        auto done = drain();
        if (!done || *done)
            return done ? Result<void>{} : std::unexpected(std::move(done.error()));
        if (options.mode == WaitMode::event) {
            // arm, then poll once more: a completion that landed before the arm
            // raises no event
            if (auto armed = cq.arm(); !armed)
                return armed;
            done = drain();
            if (!done || *done)
                return done ? Result<void>{} : std::unexpected(std::move(done.error()));
        }
        // the clock and the device's async events are looked at every 256 spins
        // when busy polling (a system call each), at every wake-up otherwise
        if (options.mode == WaitMode::event || spins % 256 == 255) {
            if (auto ok = fatal_event(); !ok)
                return ok;
            const auto now = clock::now();
            if (!deadline)
                deadline = now + options.timeout;
            if (now >= *deadline)
                return std::unexpected(Error::timeout(
                    "wait", fmt::format("no completion within {} ms", options.timeout.count())));
            if (options.mode == WaitMode::event) {
                const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - now);
                const int async_fd = options.events ? options.events->fd() : -1;
                auto woke = cq.wait_event(left, async_fd);
                if (!woke && !woke.error().is_timeout())
                    return woke;
            }
        }
    }
}

} // namespace detail
} // namespace rdmaxx
