#include "rc_transport.hpp"

#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx::rpc::detail {
namespace {

// A receive for a WRITE_WITH_IMM's immediate: no memory.
Result<void> post_receive(SharedReceiveQueue& srq) {
    return post_recv(srq, Gather(std::span<const LocalSlice>{}), RcTransport::receive_id);
}

} // namespace

Result<std::unique_ptr<RcTransport>> RcTransport::create(asio::io_context& io, const Context& context,
                                                         const ProtectionDomain& pd, std::uint32_t depth,
                                                         std::uint32_t receives, async::DriveOptions drive, Done done,
                                                         void* done_context, std::source_location where) {
    require(depth > 0 && receives > 0 && receives < depth, where,
            "an RC transport of {} CQ entries and {} receives", depth, receives);
    require(done != nullptr, where, "an RC transport without a Done function");
    std::unique_ptr<RcTransport> t(new RcTransport(pd, done, done_context));
    auto cq = async::CompletionQueue::create(io, context, async::CompletionSink{t.get(), &RcTransport::take},
                                             {.depth = depth}, drive, where);
    if (!cq)
        return std::unexpected(std::move(cq.error()));
    t->cq_.emplace(std::move(*cq));
    auto srq = SharedReceiveQueue::create(pd, {.max_wr = receives, .max_sge = 1});
    if (!srq)
        return std::unexpected(std::move(srq.error()));
    t->srq_.emplace(std::move(*srq));
    for (std::uint32_t i = 0; i < receives; ++i)
        if (auto posted = post_receive(*t->srq_); !posted)
            return std::unexpected(std::move(posted.error()));
    return t;
}

Result<QueuePair> RcTransport::create_qp(RcRole role, std::uint32_t depth, std::uint8_t port,
                                         std::optional<std::uint32_t> gid_index) const {
    const bool initiates = role != RcRole::client, target = role != RcRole::server;
    return QueuePair::create(*pd_, {.type = QpType::rc,
                                    .send_cq = &cq_->get(),
                                    .recv_cq = &cq_->get(),
                                    .srq = target ? &*srq_ : nullptr,
                                    .caps = {.max_send_wr = initiates ? depth : 1, .max_recv_wr = 1},
                                    .signal_all = true,
                                    .port = port,
                                    .gid_index = gid_index,
                                    .remote_access = target ? Access::remote_read | Access::remote_write : Access::none});
}

Result<void> RcTransport::post(QueuePair& qp, Op op, const LocalSlice& local, const RemoteMemory& remote,
                               std::uint64_t wr_id, std::uint32_t imm) {
    SendBatch<1> batch(qp);
    if (op == Op::read)
        batch.read(local, remote, {.wr_id = wr_id});
    else
        batch.write_with_imm(local, remote, imm, {.wr_id = wr_id});
    return batch.post();
}

void RcTransport::take(void* self, std::span<const WorkCompletion> completions) {
    auto* t = static_cast<RcTransport*>(self);
    for (const WorkCompletion& wc : completions) {
        // a receive's completion gives its place back at once (a failed one is the SRQ's
        // end: the transport is being destroyed, or the device failed)
        if (wc.wr_id() == receive_id && wc.ok())
            if (auto posted = post_receive(*t->srq_); !posted)
                logger()->error("rdmaxx rpc: the RC path's SRQ lost a receive: {}", posted.error());
        t->done_(t->done_context_, wc);
    }
}

} // namespace rdmaxx::rpc::detail
