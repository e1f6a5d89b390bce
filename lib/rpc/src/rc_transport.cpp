#include "rc_transport.hpp"

#include "inline_sends.hpp"

#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx::rpc::detail {
Result<std::unique_ptr<RcTransport>> RcTransport::create(asio::io_context& io, const Context& context,
                                                         const ProtectionDomain& pd, Sizes sizes,
                                                         async::DriveOptions drive, Done done, void* done_context,
                                                         std::source_location where) {
    require(sizes.depth > 0 && sizes.receives > 0 && sizes.receives % receive_batch == 0 &&
                sizes.whole_receives > 0 && sizes.whole_bytes > 0 &&
                std::uint64_t{sizes.receives} + sizes.whole_receives < sizes.depth,
            where, "an RC transport of {} CQ entries, {} and {} receives of {} bytes", sizes.depth, sizes.receives,
            sizes.whole_receives, sizes.whole_bytes);
    require(done != nullptr, where, "an RC transport without a Done function");
    std::unique_ptr<RcTransport> t(new RcTransport(pd, sizes, done, done_context));
    auto cq = async::CompletionQueue::create(io, context, async::CompletionSink{t.get(), &RcTransport::take},
                                             {.depth = sizes.depth}, drive, where);
    if (!cq)
        return std::unexpected(std::move(cq.error()));
    t->cq_.emplace(std::move(*cq));
    auto srq = SharedReceiveQueue::create(pd, {.max_wr = sizes.receives, .max_sge = 1});
    if (!srq)
        return std::unexpected(std::move(srq.error()));
    t->srq_.emplace(std::move(*srq));
    // receives for immediates: no memory, all alike; built once, posted again and again
    t->receives_.emplace(*t->srq_);
    for (std::size_t i = 0; i < receive_batch; ++i)
        t->receives_->add(Gather(std::span<const LocalSlice>{}), receive_id);
    for (std::uint32_t i = 0; i < sizes.receives; i += receive_batch)
        if (auto posted = t->receives_->post(); !posted)
            return std::unexpected(std::move(posted.error()));
    return t;
}

Result<void> RcTransport::post_whole_receive(std::uint32_t index) {
    const LocalSlice buffer = whole_buffers_->slice(std::size_t{index} * sizes_.whole_bytes, sizes_.whole_bytes);
    return post_recv(*whole_srq_, buffer, whole_receive_bit | index);
}

Result<QueuePair> RcTransport::create_qp(RcRole role, std::uint32_t depth, std::uint8_t port,
                                         std::optional<std::uint32_t> gid_index) {
    if (role == RcRole::server && !whole_srq_) {
        auto buffers = MemoryRegion::allocate(*pd_, std::size_t{sizes_.whole_receives} * sizes_.whole_bytes,
                                              Access::local_write);
        if (!buffers)
            return std::unexpected(std::move(buffers.error()));
        auto srq = SharedReceiveQueue::create(*pd_, {.max_wr = sizes_.whole_receives, .max_sge = 1});
        if (!srq)
            return std::unexpected(std::move(srq.error()));
        whole_buffers_.emplace(std::move(*buffers));
        whole_srq_.emplace(std::move(*srq));
        for (std::uint32_t i = 0; i < sizes_.whole_receives; ++i)
            if (auto posted = post_whole_receive(i); !posted) {
                whole_srq_.reset(); // its posted receives go with it; the next server QP tries again
                return std::unexpected(std::move(posted.error()));
            }
    }
    const bool target = role != RcRole::server;
    auto qp = create_inlined(
        [&](std::uint32_t inline_bytes) {
            return QueuePair::create(*pd_,
                                     {.type = QpType::rc,
                                      .send_cq = &cq_->get(),
                                      .recv_cq = &cq_->get(),
                                      .srq = target ? &*srq_ : &*whole_srq_,
                                      .caps = {.max_send_wr = depth, .max_recv_wr = 1, .max_inline_data = inline_bytes},
                                      // a client's window binds and revocations go
                                      // two to a doorbell, the last signaled; every
                                      // other WR is signaled (PostOptions' default)
                                      .signal_all = false,
                                      .port = port,
                                      .gid_index = gid_index,
                                      .remote_access =
                                          target ? Access::remote_read | Access::remote_write : Access::none});
        },
        inline_limit_);
    if (qp)
        inline_limit_ = qp->caps().max_inline_data; // the next QP tries no more
    return qp;
}

Result<void> RcTransport::post(QueuePair& qp, Op op, const LocalSlice& local, const RemoteMemory& remote,
                               std::uint64_t wr_id, std::uint32_t imm) {
    SendBatch<1> batch(qp);
    if (op == Op::read)
        batch.read(local, remote, {.wr_id = wr_id});
    else
        batch.write_with_imm(local, remote, imm,
                             {.wr_id = wr_id, .inline_data = local.size() <= qp.caps().max_inline_data});
    return batch.post();
}

Result<void> RcTransport::send(QueuePair& qp, const LocalSlice& local, std::uint64_t wr_id) {
    return post_send(qp, local, {.wr_id = wr_id, .inline_data = local.size() <= qp.caps().max_inline_data});
}

std::span<const std::byte> RcTransport::received(const WorkCompletion& wc) const noexcept {
    const std::uint64_t index = wc.wr_id() & ~whole_receive_bit;
    return whole_buffers_->bytes().subspan(index * sizes_.whole_bytes, std::min(wc.byte_len(), sizes_.whole_bytes));
}

void RcTransport::take(void* self, std::span<const WorkCompletion> completions) {
    auto* t = static_cast<RcTransport*>(self);
    for (const WorkCompletion& wc : completions) {
        // A receive's completion gives its place back at once, a whole request's buffer
        // once Done has read it: failed ones too. A receive fails when its QP breaks
        // while it is consumed (a peer's SEND larger than the buffer, a peer's SEND
        // into a zero-byte receive); the SRQ's other receives stay posted, and without
        // this one a peer that reconnects and does it again would drain the SRQ.
        if (wc.wr_id() == receive_id && ++t->receives_taken_ == receive_batch) {
            t->receives_taken_ = 0;
            if (auto posted = t->receives_->post(); !posted)
                logger()->error("rdmaxx rpc: the RC path's SRQ lost {} receives: {}", receive_batch, posted.error());
        }
        t->done_(t->done_context_, wc);
        if ((wc.wr_id() & whole_receive_bit) != 0)
            if (auto posted = t->post_whole_receive(static_cast<std::uint32_t>(wc.wr_id() & ~whole_receive_bit));
                !posted)
                logger()->error("rdmaxx rpc: the RC path's whole-request SRQ lost a receive: {}", posted.error());
    }
}

} // namespace rdmaxx::rpc::detail
