#include "rc_transport.hpp"

#include <rdmaxx/data/post.hpp>

namespace rdmaxx::rpc::detail {

Result<std::unique_ptr<RcTransport>> RcTransport::create(asio::io_context& io, const Context& context,
                                                         const ProtectionDomain& pd, std::uint32_t depth,
                                                         async::DriveOptions drive, Done done, void* done_context,
                                                         std::source_location where) {
    require(depth > 0, where, "an RC transport of 0 CQ entries");
    require(done != nullptr, where, "an RC transport without a Done function");
    std::unique_ptr<RcTransport> t(new RcTransport(pd, done, done_context));
    auto cq = async::CompletionQueue::create(io, context, async::CompletionSink{t.get(), &RcTransport::take},
                                             {.depth = depth}, drive, where);
    if (!cq)
        return std::unexpected(std::move(cq.error()));
    t->cq_.emplace(std::move(*cq));
    return t;
}

Result<QueuePair> RcTransport::create_qp(RcRole role, std::uint32_t depth, std::uint8_t port,
                                         std::optional<std::uint32_t> gid_index) const {
    const bool initiates = role != RcRole::client, target = role != RcRole::server;
    return QueuePair::create(*pd_, {.type = QpType::rc,
                                    .send_cq = &cq_->get(),
                                    .recv_cq = &cq_->get(),
                                    .caps = {.max_send_wr = initiates ? depth : 1, .max_recv_wr = 1},
                                    .signal_all = true,
                                    .port = port,
                                    .gid_index = gid_index,
                                    .remote_access = target ? Access::remote_read | Access::remote_write : Access::none});
}

Result<void> RcTransport::post(QueuePair& qp, Op op, const LocalSlice& local, const RemoteMemory& remote,
                               std::uint64_t wr_id) {
    SendBatch<1> batch(qp);
    if (op == Op::read)
        batch.read(local, remote, {.wr_id = wr_id});
    else
        batch.write(local, remote, {.wr_id = wr_id});
    return batch.post();
}

void RcTransport::take(void* self, std::span<const WorkCompletion> completions) {
    auto* t = static_cast<RcTransport*>(self);
    for (const WorkCompletion& wc : completions)
        t->done_(t->done_context_, wc);
}

} // namespace rdmaxx::rpc::detail
