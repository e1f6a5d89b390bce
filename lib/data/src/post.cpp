#include <rdmaxx/data/post.hpp>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace rdmaxx::detail {

namespace {

// Inline data of several SGEs, joined into one buffer when it fits: rxe's
// ibv_wr_set_inline_data_list (rdma-core 44, Debian 12's) copies the buffers but leaves
// the WQE's length 0, so the peer receives an empty message. Inline data beyond the
// buffer goes as a list, as before: rxe takes at most 512 inline bytes (400 in older
// kernels), so no rxe QP posts that much.
void set_inline_list(ibv_qp_ex* qpx, const ibv_send_wr& wr) {
    constexpr std::size_t joined_capacity = 1024;
    std::size_t total = 0;
    for (int i = 0; i < wr.num_sge; ++i)
        total += wr.sg_list[i].length;
    if (total <= joined_capacity) {
        std::array<std::byte, joined_capacity> joined;
        std::size_t at = 0;
        for (int i = 0; i < wr.num_sge; ++i) {
            std::memcpy(joined.data() + at, reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
            at += wr.sg_list[i].length;
        }
        ibv_wr_set_inline_data(qpx, joined.data(), total);
        return;
    }
    std::array<ibv_data_buf, max_sge> buffers;
    for (int i = 0; i < wr.num_sge; ++i)
        buffers[static_cast<std::size_t>(i)] = {.addr = reinterpret_cast<void*>(wr.sg_list[i].addr),
                                                .length = wr.sg_list[i].length};
    ibv_wr_set_inline_data_list(qpx, static_cast<std::size_t>(wr.num_sge), buffers.data());
}

} // namespace

int post_extended(ibv_qp_ex* qpx, const ibv_send_wr* wr) {
    ibv_wr_start(qpx);
    for (; wr; wr = wr->next) {
        qpx->wr_id = wr->wr_id;
        qpx->wr_flags = wr->send_flags;
        switch (wr->opcode) {
        case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(qpx, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr); break;
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            ibv_wr_rdma_write_imm(qpx, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, wr->imm_data);
            break;
        case IBV_WR_RDMA_READ: ibv_wr_rdma_read(qpx, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr); break;
        case IBV_WR_SEND: ibv_wr_send(qpx); break;
        case IBV_WR_SEND_WITH_IMM: ibv_wr_send_imm(qpx, wr->imm_data); break;
        case IBV_WR_ATOMIC_CMP_AND_SWP:
            ibv_wr_atomic_cmp_swp(qpx, wr->wr.atomic.rkey, wr->wr.atomic.remote_addr, wr->wr.atomic.compare_add,
                                  wr->wr.atomic.swap);
            break;
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
            ibv_wr_atomic_fetch_add(qpx, wr->wr.atomic.rkey, wr->wr.atomic.remote_addr, wr->wr.atomic.compare_add);
            break;
        case IBV_WR_BIND_MW: // no SGEs, no UD address
            ibv_wr_bind_mw(qpx, wr->bind_mw.mw, wr->bind_mw.rkey, &wr->bind_mw.bind_info);
            continue;
        case IBV_WR_LOCAL_INV: ibv_wr_local_inv(qpx, wr->invalidate_rkey); continue;
        default: // rdmaxx builds no other opcode
            ibv_wr_abort(qpx);
            return EINVAL;
        }
        if (qpx->qp_base.qp_type == IBV_QPT_UD)
            ibv_wr_set_ud_addr(qpx, wr->wr.ud.ah, wr->wr.ud.remote_qpn, wr->wr.ud.remote_qkey);
        if ((wr->send_flags & IBV_SEND_INLINE) && wr->num_sge == 1) {
            ibv_wr_set_inline_data(qpx, reinterpret_cast<void*>(wr->sg_list[0].addr), wr->sg_list[0].length);
        } else if (wr->send_flags & IBV_SEND_INLINE) {
            set_inline_list(qpx, *wr);
        } else {
            ibv_wr_set_sge_list(qpx, static_cast<std::size_t>(wr->num_sge), wr->sg_list);
        }
    }
    return ibv_wr_complete(qpx);
}

// EACCES has one known cause on a post: providers whose posts are commands written to the
// device file (Soft-RoCE, siw) are refused by the kernel once the process's credentials
// are not those it opened the device with (ib_safe_file_access: capset, setuid and the
// like make new ones, even unchanged). It stays so for that device context.
constexpr std::string_view credentials_changed =
    "; EACCES on a post: the process's credentials changed since it opened the device (a user or capability "
    "change), and the kernel takes no command from it on that device: open devices after dropping privileges";

Error post_error(bool extended, int rc, const ibv_send_wr& first, const ibv_send_wr* bad, std::size_t count,
                 std::size_t& accepted) {
    rc = std::abs(rc); // rxe's provider returns -ENOMEM, -EINVAL
    accepted = 0;
    const std::string_view why = rc == EACCES ? credentials_changed : std::string_view();
    if (extended)
        return Error::from_errno("ibv_wr_complete", rc, fmt::format("{} WR(s), none posted{}", count, why));
    for (const ibv_send_wr* wr = &first; wr && wr != bad; wr = wr->next)
        ++accepted;
    if (!bad)
        return Error::from_errno(
            "ibv_post_send", rc,
            fmt::format("{} WR(s); the provider did not say which failed: all counted as posted{}", count, why));
    return Error::from_errno("ibv_post_send", rc,
                             fmt::format("WR {} of {} (wr_id {}) failed; the WRs before it were posted{}", accepted,
                                         count, bad->wr_id, why));
}

Error post_recv_error(const char* call, int rc, const ibv_recv_wr& first, const ibv_recv_wr* bad,
                      std::size_t count) {
    rc = std::abs(rc);
    if (!bad)
        return Error::from_errno(call, rc,
                                 fmt::format("{} WR(s); the provider did not say which failed", count));
    std::size_t posted = 0;
    for (const ibv_recv_wr* wr = &first; wr != bad; wr = wr->next)
        ++posted;
    return Error::from_errno(call, rc,
                             fmt::format("WR {} of {} (wr_id {}) failed; the WRs before it were posted", posted, count,
                                         bad->wr_id));
}

} // namespace rdmaxx::detail
