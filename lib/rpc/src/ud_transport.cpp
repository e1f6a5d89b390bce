#include "ud_transport.hpp"

#include "inline_sends.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx::rpc::detail {
namespace {

// Every UD receive starts with the 40-byte GRH slot (filled on RoCE and with a GRH).
constexpr std::uint32_t grh_bytes = 40;
// wr_id: a send buffer's index with this bit, a ring buffer's without, and the QP's
// epoch (UdTransport::recover) in bits 32 to 62.
constexpr std::uint64_t send_bit = std::uint64_t{1} << 63;
constexpr std::uint32_t epoch_mask = 0x7fffffff;
constexpr std::uint32_t epoch_of(std::uint64_t wr_id) noexcept {
    return static_cast<std::uint32_t>(wr_id >> 32) & epoch_mask;
}
// Ring buffers posted again per doorbell, at most.
constexpr std::size_t repost_batch = 32;
// Taken ring buffers wait until this many can go back in one post (a post per packet
// cost ~110 instructions per packet on each side on rxe, callgrind). So many less one
// may be out of the ring at a time: the transport posts as many more than its `ring`.
constexpr std::uint32_t repost_threshold = 16;
constexpr std::uint32_t ring_spare = repost_threshold - 1;
// Bytes an inline send gathers from where they lie: the post copies them into the WR,
// and the device reads no local key for them.
LocalSlice unregistered(std::span<const std::byte> bytes) noexcept {
    return {const_cast<std::byte*>(bytes.data()), static_cast<std::uint32_t>(bytes.size()), 0};
}

} // namespace

Result<std::unique_ptr<UdTransport>> UdTransport::create(asio::io_context& io, const UdOptions& options,
                                                         Deliver deliver, void* context_arg,
                                                         std::source_location where) {
    require(options.ring > 0 && options.send_depth > 0, where, "a UD transport of {} receive and {} send buffers",
            options.ring, options.send_depth);
    require(deliver != nullptr, where, "a UD transport without a Deliver function");
    auto context = Context::open(options.device);
    if (!context)
        return std::unexpected(std::move(context.error()));
    auto pd = ProtectionDomain::create(*context);
    if (!pd)
        return std::unexpected(std::move(pd.error()));
    std::unique_ptr<UdTransport> t(new UdTransport(std::move(*context), std::move(*pd), deliver, context_arg));
    const std::uint32_t posted_ring = options.ring + ring_spare;
    auto cq = async::CompletionQueue::create(io, t->context_, async::CompletionSink{t.get(), &UdTransport::take},
                                             {.depth = posted_ring + options.send_depth}, options.drive, where);
    if (!cq)
        return std::unexpected(std::move(cq.error()));
    t->cq_.emplace(std::move(*cq));
    const auto create_qp = [&](std::uint32_t inline_bytes) {
        return QueuePair::create(t->pd_, {.type = QpType::ud,
                                          .send_cq = &t->cq_->get(),
                                          .recv_cq = &t->cq_->get(),
                                          .caps = {.max_send_wr = options.send_depth,
                                                   .max_recv_wr = posted_ring,
                                                   .max_send_sge = 2, // header, gathered payload
                                                   .max_inline_data = inline_bytes},
                                          .signal_all = true,
                                          .port = options.port,
                                          .gid_index = options.gid_index,
                                          .qkey = options.qkey});
    };
    auto qp = create_inlined(create_qp);
    if (!qp)
        return std::unexpected(std::move(qp.error()));
    t->qp_.emplace(std::move(*qp));
    t->inline_limit_ = t->qp_->caps().max_inline_data;
    t->sender_.emplace(*t->qp_);
    t->mtu_ = mtu_bytes(t->qp_->endpoint().mtu);
    t->ring_ = posted_ring;
    auto ring = MemoryRegion::allocate(t->pd_, std::size_t{posted_ring} * (grh_bytes + t->mtu_), Access::local_write);
    if (!ring)
        return std::unexpected(std::move(ring.error()));
    t->ring_mr_.emplace(std::move(*ring));
    auto sends = MemoryRegion::allocate(t->pd_, std::size_t{options.send_depth} * t->mtu_, Access::local_write);
    if (!sends)
        return std::unexpected(std::move(sends.error()));
    t->send_mr_.emplace(std::move(*sends));
    for (std::uint32_t i = options.send_depth; i-- > 0;)
        t->free_sends_.push_back(i);
    t->gathered_.resize(options.send_depth);
    for (std::uint32_t i = 0; i < options.send_depth; ++i)
        t->send_slices_.push_back(t->send_mr_->slice(std::size_t{i} * t->mtu_, t->mtu_));
    for (std::uint32_t i = 0; i < posted_ring; ++i)
        t->ring_slices_.push_back(t->ring_mr_->slice(std::size_t{i} * (grh_bytes + t->mtu_), grh_bytes + t->mtu_));
    if (auto up = t->qp_->activate(where); !up)
        return std::unexpected(std::move(up.error()));
    t->repost_.reserve(posted_ring);
    t->every_buffer_.resize(posted_ring);
    for (std::uint32_t i = 0; i < posted_ring; ++i)
        t->every_buffer_[i] = i;
    if (auto posted = t->post_receives(t->every_buffer_); !posted)
        return std::unexpected(std::move(posted.error()));
    return t;
}

UdTransport::~UdTransport() {
    // the QP first: its flushed receives are then never taken (the CQ goes next)
    qp_.reset();
    cq_.reset();
}

std::size_t UdTransport::poll() {
    // a poll takes up to a turn's budget: more may wait while it takes all it may
    const std::size_t capacity = std::size_t{ring_} + gathered_.size();
    std::size_t taken = 0;
    while (taken < capacity) {
        const std::size_t now = cq_->poll();
        taken += now;
        if (now < async::Completions::turn_budget)
            break;
    }
    return taken;
}

[[gnu::always_inline]]
std::span<std::byte> UdTransport::ring_buffer(std::uint32_t i) noexcept {
    return {ring_mr_->data() + std::size_t{i} * (grh_bytes + mtu_), grh_bytes + mtu_};
}

[[gnu::always_inline]]
Result<void> UdTransport::post_receives(std::span<const std::uint32_t> buffers) {
    RecvBatch<repost_batch> batch(*qp_);
    for (std::size_t at = 0; at < buffers.size(); at += repost_batch) {
        batch.clear();
        for (std::size_t k = at; k < std::min(buffers.size(), at + repost_batch); ++k)
            batch.add(ring_slices_[buffers[k]], std::uint64_t{epoch_} << 32 | buffers[k]);
        if (auto posted = batch.post(); !posted)
            return posted;
    }
    return {};
}

Result<AddressHandle> UdTransport::Handles::to(const UdAddress& peer) const {
    return AddressHandle::create(pd, peer.endpoint, local, port, layer);
}

PeerSource UdTransport::source_of(const UdAddress& peer) const noexcept {
    PeerSource source;
    source.qpn_ = peer.endpoint.qpn;
    source.lid_ = peer.endpoint.lid;
    // the AH routes by LID on InfiniBand (wrap's address_vector): no GRH comes there
    source.global_ = qp_->link_layer() != LinkLayer::infiniband;
    source.ipv4_mapped_ = peer.endpoint.gid.is_ipv4_mapped();
    std::memcpy(source.gid_.data(), peer.endpoint.gid.bytes.data(), source.gid_.size());
    return source;
}

Result<bool> UdTransport::send(const AddressHandle& to, const UdAddress& peer, std::span<const std::byte> header,
                               std::span<const std::byte> payload, std::source_location where) {
    const std::size_t bytes = header.size() + payload.size();
    require(bytes <= mtu_, where, "a {}-byte UD packet on a path MTU of {}", bytes, mtu_);
    if (free_sends_.empty())
        return false;
    if (!payload.empty())
        ++copies_; // into the send buffer, or into the WR by the post (inline)
    if (bytes <= inline_limit_) {
        const std::array<LocalSlice, 2> gather{unregistered(header), unregistered(payload)};
        return post_send(to, peer, std::span(gather).first(payload.empty() ? 1 : 2), true, where);
    }
    std::byte* at = send_mr_->data() + std::size_t{free_sends_.back()} * mtu_;
    std::memcpy(at, header.data(), header.size());
    if (!payload.empty())
        std::memcpy(at + header.size(), payload.data(), payload.size());
    const LocalSlice whole = send_slices_[free_sends_.back()].slice(0, bytes);
    return post_send(to, peer, {&whole, 1}, false, where);
}

Result<bool> UdTransport::send_gather(const AddressHandle& to, const UdAddress& peer,
                                      std::span<const std::byte> header, const LocalSlice& payload,
                                      const BufferHold& memory, std::source_location where) {
    const std::size_t bytes = header.size() + payload.size();
    require(bytes <= mtu_, where, "a {}-byte UD packet on a path MTU of {}", bytes, mtu_);
    if (free_sends_.empty())
        return false;
    if (bytes <= inline_limit_) // the post copies the payload: nothing to hold
        return post_send(to, peer, std::array{unregistered(header), payload}, true, where);
    const std::uint32_t buffer = free_sends_.back();
    std::memcpy(send_mr_->data() + std::size_t{buffer} * mtu_, header.data(), header.size());
    const std::array<LocalSlice, 2> gather{send_slices_[buffer].slice(0, header.size()), payload};
    auto posted = post_send(to, peer, gather, false, where);
    if (posted && *posted)
        gathered_[buffer] = memory;
    return posted;
}

[[gnu::always_inline]]
Result<bool> UdTransport::post_send(const AddressHandle& to, const UdAddress& peer,
                                    std::span<const LocalSlice> gather, bool inline_data,
                                    std::source_location where) {
    const std::uint32_t buffer = free_sends_.back();
    const std::uint64_t wr_id = send_bit | std::uint64_t{epoch_} << 32 | buffer;
    const UdDestination destination{.ah = &to, .qpn = peer.endpoint.qpn, .qkey = peer.qkey};
    if (sender_->size() == 0) // the first packet builds the WR, the next ones change it
        sender_->send(gather, destination, {.wr_id = wr_id, .inline_data = inline_data}, where);
    else
        sender_->set_wr_id(0, wr_id, where)
            .set_local(0, gather, inline_data, where)
            .set_destination(0, destination, where);
    auto posted = sender_->post(where);
    if (!posted) {
        recover_if_broken("a send's post failed");
        return std::unexpected(std::move(posted.error()));
    }
    free_sends_.pop_back();
    return true;
}

void UdTransport::take(void* self, std::span<const WorkCompletion> completions) {
    static_cast<UdTransport*>(self)->take(completions);
}

void UdTransport::take(std::span<const WorkCompletion> completions) {
    taking_ = true;
    for (const WorkCompletion& wc : completions) {
        if (epoch_of(wc.wr_id()) != epoch_)
            continue; // a work request of the QP before its recovery: its buffer is free or posted anew
        const auto buffer = static_cast<std::uint32_t>(wc.wr_id());
        if (wc.wr_id() & send_bit) {
            gathered_[buffer] = BufferHold{};
            free_sends_.push_back(buffer);
            if (!wc.ok()) {
                ++failed_sends_;
                recover_if_broken(ibv_wc_status_str(wc.status()));
            }
            continue;
        }
        if (!wc.ok()) {
            // a packet the device refused (longer than a ring buffer: no honest peer's),
            // or a flush: the buffer goes back, or a stream of such packets would empty
            // the ring; where the QP broke (Soft-RoCE breaks it for a packet too long),
            // it is set up again
            failed_receives_ += wc.status() == IBV_WC_WR_FLUSH_ERR ? 0 : 1; // a flush is no packet
            repost_.push_back(buffer);
            recover_if_broken(ibv_wc_status_str(wc.status()));
            continue;
        }
        const std::uint32_t length = std::min(wc.byte_len(), grh_bytes + mtu_);
        if (length >= grh_bytes)
            deliver_(context_arg_,
                     UdSource{.qpn = wc.src_qp(),
                              .grh = wc.has_grh() ? ring_buffer(buffer).data() : nullptr,
                              .lid = wc.slid()},
                     ring_buffer(buffer).subspan(grh_bytes, length - grh_bytes));
        repost_.push_back(buffer);
    }
    taking_ = false;
    if (recovery_due_) // after the batch: a buffer being delivered is posted again only now
        return recover();
    if (repost_.size() < repost_threshold)
        return;
    if (auto posted = post_receives(repost_); !posted) {
        // some of them may be posted: only a reset knows which are not
        logger()->error("rdmaxx rpc: posting receives again: {}", posted.error());
        recovery_why_ = "posting receives failed";
        return recover();
    }
    repost_.clear();
}

void UdTransport::recover_if_broken(const char* why) {
    if (recovery_due_)
        return; // known broken: the rest of the batch's flushes ask no more
    // a UD QP works in RTS only; a failed query says nothing good either
    if (const auto state = qp_->query_state(); state && *state == QpState::rts)
        return; // a failed work request that left the QP working
    recovery_why_ = why;
    if (taking_) {
        recovery_due_ = true; // a handler may be reading a ring buffer this would post
        return;
    }
    recover();
}

void UdTransport::recover() {
    // Reset takes back every work request outstanding; their completions still in the
    // CQ name the old epoch and are passed over. The QPN stays: peers' addresses hold.
    recovery_due_ = false;
    epoch_ = (epoch_ + 1) & epoch_mask;
    ++recoveries_;
    repost_.clear();
    Result<void> up = qp_->reset();
    // the device reads no send buffer now: all of them are free, their holds let go
    free_sends_.clear();
    for (std::uint32_t i = static_cast<std::uint32_t>(gathered_.size()); i-- > 0;)
        free_sends_.push_back(i);
    for (BufferHold& held : gathered_)
        held = BufferHold{};
    if (up)
        up = qp_->activate();
    if (up)
        up = post_receives(every_buffer_);
    if (!up) { // the QP stays out of RTS: the next failed post or completion tries again
        logger()->error("rdmaxx rpc: the UD QP broke ({}) and could not be set up again: {}", recovery_why_,
                        up.error());
        return;
    }
    // a host that sends packets too long can break it for each: said once a second
    told_.warn(std::chrono::steady_clock::now(),
               "rdmaxx rpc: the UD QP broke ({}) and was set up again, {} times in all; packets in flight were lost",
               recovery_why_, recoveries_);
}

} // namespace rdmaxx::rpc::detail
