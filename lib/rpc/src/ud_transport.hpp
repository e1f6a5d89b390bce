// An endpoint's UD QP and its buffers: moves packets, judges none. What a packet says
// is for packet.hpp's decode() and the windows to check; the transport only bounds it
// to the bytes that arrived.
//
//  * The receive ring: `ring` buffers of 40 (the GRH every UD receive starts with) +
//    the port's active MTU, in one registered region, all posted at creation. Each
//    packet is handed to the Deliver function inside the completion's batch; its
//    buffer goes back in a post of 16 (one doorbell per 16 packets), and 15 more
//    buffers than `ring` are posted, so that `ring` are always there.
//  * The send buffers: one per send queue entry, in one registered region; send()
//    copies the header and the payload into a free one (counted: copies(), when there
//    is a payload), posts it signaled, and the buffer is free again at its
//    completion. send_gather() copies the header only and gathers the payload from
//    registered memory it holds until the completion (a MessageBuffer's). A packet of
//    up to the QP's max_inline_data bytes goes inline instead: gathered from where its
//    header and payload lie, copied into the WR by the post (the payload's copy is
//    counted still), so nothing is copied into the send buffer and nothing is held;
//    it takes a send buffer's place in the queue all the same. No buffer free: both
//    answer false and the caller tries again after a completion (a credit stall).
//  * Completions go to a lib/async sink CQ on the endpoint's io_context, in its drive
//    mode: the transport keeps run() going while it lives.
//  * A receive that fails (a packet longer than a ring buffer, from no honest peer)
//    has its buffer posted again. Where a failed work request or post left the QP in
//    error (Soft-RoCE breaks it for one packet too long), the transport resets it and
//    sets it up again, same QPN, at once: one hostile packet costs the packets in
//    flight (go-back-N sends them again), never the endpoint.
//
// Thread safety: as the io_context (one thread).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include <asio/io_context.hpp>

#include <rdmaxx/async/completions.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/ah.hpp>
#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/log.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pd.hpp>
#include <rdmaxx/wrap/qp.hpp>

#include <rdmaxx/rpc/message_buffer.hpp>

#include "session_codec.hpp"

namespace rdmaxx::rpc::detail {

struct UdOptions {
    std::string device = {};                // empty: the first
    std::uint8_t port = 1;
    std::optional<std::uint32_t> gid_index = {}; // default: Context::choose_gid
    std::uint32_t ring = 1024;              // receive buffers
    std::uint32_t send_depth = 256;         // send buffers (and send queue entries)
    std::uint32_t qkey = 0x52580001;
    async::DriveOptions drive{};
};

// Where a packet came from, as its receive completion shows it.
struct UdSource {
    std::uint32_t qpn = 0;
    const std::byte* grh = nullptr; // the 40 bytes before the packet; null: the completion had no GRH
    std::uint16_t lid = 0;          // without a GRH (InfiniBand inside a subnet)
};

// What every packet from one peer carries (UdTransport::source_of): its QPN, and its
// address where the receive shows it. A host that picks the peer's QPN (24 bits, easy
// to guess) is not the peer, so the address is compared too:
//  * RoCE v2 from an IPv4 GID: the GRH slot holds the IPv4 header in its last 20
//    bytes, the source address at byte 32, as ibv_init_ah_from_wc reads it;
//  * any other GRH (RoCE v2 over IPv6, RoCE v1, InfiniBand across subnets): the source
//    GID at byte 8;
//  * no GRH (InfiniBand inside a subnet, where the AH routes by LID): the source LID.
// An IPv4-mapped GID may come either way (RoCE v2, or v1 from a peer whose GID entry
// is v1), so both forms are tried for it: the IPv4 header's first (its version is 4),
// the GID's next. Spoofed IP source addresses are beyond any check here.
class PeerSource {
public:
    [[gnu::always_inline]] bool sent(const UdSource& from) const noexcept {
        if (from.qpn != qpn_)
            return false;
        if (from.grh == nullptr || !global_)
            return from.grh == nullptr && !global_ && from.lid == lid_;
        if (ipv4_mapped_ && (std::to_integer<unsigned>(from.grh[ipv4_header_at]) >> 4) == 4 &&
            std::memcmp(from.grh + ipv4_source_at, gid_.data() + 12, 4) == 0)
            return true;
        return std::memcmp(from.grh + gid_source_at, gid_.data(), gid_.size()) == 0;
    }

private:
    friend class UdTransport;
    static constexpr std::uint8_t ipv4_header_at = 20, ipv4_source_at = 32, gid_source_at = 8;
    std::uint32_t qpn_ = 0;
    std::uint16_t lid_ = 0;
    bool global_ = false;      // its packets come with a GRH (RoCE), else it is known by its LID
    bool ipv4_mapped_ = false; // its GID is ::ffff:a.b.c.d
    std::array<std::byte, 16> gid_{};
};

class UdTransport {
public:
    // Called for each packet received, with the bytes after the GRH (any length,
    // from 0 to the MTU: untrusted). The bytes are valid during the call only.
    using Deliver = void (*)(void* context, UdSource from, std::span<const std::byte> packet);

    // Runtime errors: the device's (no such device, caps beyond its limits, memory).
    // Programming error: ring or send_depth 0, a null deliver.
    static Result<std::unique_ptr<UdTransport>> create(asio::io_context& io, const UdOptions& options,
                                                       Deliver deliver, void* context,
                                                       std::source_location where = std::source_location::current());
    UdTransport(const UdTransport&) = delete;
    UdTransport& operator=(const UdTransport&) = delete;
    ~UdTransport();

    // What peers need to send here, and the largest packet (header included) they may.
    UdAddress address() const noexcept { return {qp_->endpoint(), qp_->qkey()}; }
    std::uint32_t mtu() const noexcept { return mtu_; }
    // What makes the handles towards peers' addresses, for send(): a copy, apart from
    // the transport (the PD it keeps alive), for a helper thread. On RoCE a handle waits
    // for the peer's MAC (blocking.hpp: up to a second), so the endpoint makes it with
    // run_blocking, and the endpoint may be destroyed meanwhile.
    struct Handles {
        std::shared_ptr<ibv_pd> pd;
        GidEntry local;
        std::uint8_t port;
        LinkLayer layer;
        Result<AddressHandle> to(const UdAddress& peer) const;
    };
    Handles handles() const { return {qp_->pd(), qp_->gid(), qp_->port(), qp_->link_layer()}; }
    // The call run_blocking runs to make the handle towards `peer`: name it (a local
    // variable), run_blocking takes an lvalue.
    auto handle_maker(const UdAddress& peer) const {
        return [handles = handles(), peer] { return handles.to(peer); };
    }
    // What the peer's packets carry, to check each one by.
    PeerSource source_of(const UdAddress& peer) const noexcept;

    // Sends `header` then `payload` (together at most mtu() bytes) to `to`. False: no
    // send buffer is free. Runtime error: the post failed (the QP is dead).
    // Programming error: more than mtu() bytes.
    Result<bool> send(const AddressHandle& to, const UdAddress& peer, std::span<const std::byte> header,
                      std::span<const std::byte> payload,
                      std::source_location where = std::source_location::current());

    // The same with the payload gathered from `payload`, in `memory`'s region: held
    // (not freed) until the send completes.
    Result<bool> send_gather(const AddressHandle& to, const UdAddress& peer, std::span<const std::byte> header,
                             const LocalSlice& payload, const BufferHold& memory,
                             std::source_location where = std::source_location::current());

    // The device and protection domain, for the endpoint's RC path and its memory.
    const Context& context() const noexcept { return context_; }
    const ProtectionDomain& pd() const noexcept { return pd_; }
    // The port and GID index of the UD QP, for RC QPs on the same port.
    std::uint8_t port() const noexcept { return qp_->port(); }
    std::uint32_t gid_index() const noexcept { return qp_->gid().index; }

    // Takes every completion the CQ holds now (at most what it can hold), as the
    // driver would: for a timer that must not judge a call whose answer has arrived
    // and waits for the driver's next turn. Returns how many.
    std::size_t poll();

    std::uint64_t copies() const noexcept { return copies_; }
    // Sends the device failed, and receives it failed for a packet (longer than a ring
    // buffer: refused, its buffer posted again); flushes, as the QP broke, are neither.
    std::uint64_t failed_sends() const noexcept { return failed_sends_; }
    std::uint64_t failed_receives() const noexcept { return failed_receives_; }
    // Times the QP broke (in error after a failed work request or post) and was reset
    // and set up again: the packets in flight then were lost, its QPN is the same.
    std::uint64_t recoveries() const noexcept { return recoveries_; }
    std::uint32_t free_send_buffers() const noexcept { return static_cast<std::uint32_t>(free_sends_.size()); }

private:
    UdTransport(Context context, ProtectionDomain pd, Deliver deliver, void* context_arg)
        : context_(std::move(context)), pd_(std::move(pd)), deliver_(deliver), context_arg_(context_arg) {}
    static void take(void* self, std::span<const WorkCompletion> completions);
    void take(std::span<const WorkCompletion> completions);
    // These three inline: ud_transport.cpp, their only caller, inlines them into the
    // packet path (as ClientWindow's helpers, slots.hpp).
    inline Result<void> post_receives(std::span<const std::uint32_t> buffers);
    // Posts `gather` in the last free send buffer's name (its wr_id), `inline_data` as
    // the caller judged it (at most inline_limit_ bytes).
    inline Result<bool> post_send(const AddressHandle& to, const UdAddress& peer, std::span<const LocalSlice> gather,
                                  bool inline_data, std::source_location where);
    inline std::span<std::byte> ring_buffer(std::uint32_t i) noexcept;
    // After a failed work request or post: where the QP is out of RTS (in error), it
    // is recovered, at once or, inside take(), once the batch is delivered.
    [[gnu::cold]] void recover_if_broken(const char* why);
    // Resets the QP, sets it up again and posts every buffer anew under the next epoch
    // (wr_id); every send buffer is free again.
    [[gnu::cold]] void recover();

    Context context_;
    ProtectionDomain pd_;
    // made in create(), after this object exists: the sink CQ names it
    std::optional<async::CompletionQueue> cq_;
    std::optional<QueuePair> qp_;
    // every send's WR, built once: a post changes what varies (a WR built per packet
    // was ~100 instructions of each send's ~500, callgrind)
    std::optional<SendBatch<1>> sender_;
    std::optional<MemoryRegion> ring_mr_, send_mr_;
    // each ring and send buffer's slice, made once (a checked slice per packet was a
    // tenth of a call's instructions)
    std::vector<LocalSlice> ring_slices_, send_slices_;
    std::uint32_t mtu_ = 0, ring_ = 0;
    std::uint32_t inline_limit_ = 0; // packets of up to this many bytes go inline
    Deliver deliver_;
    void* context_arg_;
    std::vector<std::uint32_t> free_sends_;
    std::vector<BufferHold> gathered_; // per send buffer: the memory its send gathers from
    std::vector<std::uint32_t> repost_; // ring buffers taken, to post again
    std::uint64_t copies_ = 0, failed_sends_ = 0, failed_receives_ = 0, recoveries_ = 0;
    std::uint32_t epoch_ = 0; // of the work requests posted since the QP was last set up
    std::vector<std::uint32_t> every_buffer_; // 0 .. ring_ - 1: what a recovery posts
    bool taking_ = false, recovery_due_ = false;
    const char* recovery_why_ = "";
    rdmaxx::detail::LogBudget told_{1}; // a recovery's warning: one a second
};

} // namespace rdmaxx::rpc::detail
