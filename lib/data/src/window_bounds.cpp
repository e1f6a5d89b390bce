#include <rdmaxx/data/window_bounds.hpp>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/cq.hpp>
#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/mw.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx {
namespace {

// The status of the next completion on `cq`, within `deadline`.
Result<ibv_wc_status> next_status(CompletionQueue& cq, std::chrono::steady_clock::time_point deadline) {
    ibv_wc wc{};
    for (;;) {
        const int polled = ibv_poll_cq(cq.get(), 1, &wc);
        if (polled < 0)
            return std::unexpected(detail::poll_error(polled));
        if (polled == 1)
            return wc.status;
        if (std::chrono::steady_clock::now() > deadline)
            return std::unexpected(Error::timeout("window_bounds_enforced", "no completion in time"));
    }
}

} // namespace

Result<bool> window_bounds_enforced(const Context& context, const ProtectionDomain& pd, std::uint8_t port,
                                    std::optional<std::uint32_t> gid_index, std::chrono::milliseconds timeout) {
    const auto deadline = deadline_after(timeout);
    auto cq = CompletionQueue::create(context, {.depth = 8});
    if (!cq)
        return std::unexpected(std::move(cq.error()));
    const QpOptions options{.send_cq = &*cq, .recv_cq = &*cq, .caps = {.max_send_wr = 4, .max_recv_wr = 1},
                            .port = port, .gid_index = gid_index};
    auto a = QueuePair::create(pd, options);
    if (!a)
        return std::unexpected(std::move(a.error()));
    auto b = QueuePair::create(pd, options);
    if (!b)
        return std::unexpected(std::move(b.error()));
    if (auto ok = a->connect(b->endpoint()); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto ok = b->connect(a->endpoint()); !ok)
        return std::unexpected(std::move(ok.error()));
    auto scratch = MemoryRegion::allocate(pd, 3 * 64, Access::local_write | Access::mw_bind);
    if (!scratch)
        return std::unexpected(std::move(scratch.error()));
    auto window = MemoryWindow::allocate(pd); // after `scratch`: destroyed before it
    if (!window)
        return std::unexpected(std::move(window.error()));
    auto bound = post_bind(*b, *window, *scratch, 64, 64, Access::remote_write, {.wr_id = 1});
    if (!bound)
        return std::unexpected(std::move(bound.error()));
    if (auto status = next_status(*cq, deadline); !status || *status != IBV_WC_SUCCESS)
        return std::unexpected(status ? Error::from_errno("window_bounds_enforced", EIO, "the bind failed")
                                      : std::move(status.error()));
    const RemoteMemory past_end{.addr = bound->addr + bound->length, .length = 1, .rkey = bound->rkey};
    if (auto ok = post_write(*a, scratch->slice(0, 1), past_end, {.wr_id = 2}); !ok)
        return std::unexpected(std::move(ok.error()));
    auto status = next_status(*cq, deadline);
    if (!status)
        return std::unexpected(std::move(status.error()));
    if (*status == IBV_WC_SUCCESS || *status == IBV_WC_REM_ACCESS_ERR)
        return *status == IBV_WC_REM_ACCESS_ERR;
    return std::unexpected(Error::from_errno("window_bounds_enforced", EIO,
                                             fmt::format("the probe WRITE ended with {}", ibv_wc_status_str(*status))));
}

} // namespace rdmaxx
