// An endpoint's RC path for large messages: the completion queue its sessions' RC QPs
// share, made when the first session needs one (an endpoint that never moves a large
// message pays nothing), and the READs and WRITEs a server posts on them.
//
//  * A client's RC QP is a target: the server READs requests from, and WRITEs
//    responses into, the client's staging memory or MessageBuffers (rc_codec.hpp),
//    by the keys of regions registered with only the right their role needs, or
//    through the memory windows the client binds and revokes on this QP for each call
//    (EndpointOptions::lend_through_windows; endpoint.cpp, RcPath::SlotWindows). Its
//    QP allows remote READ and WRITE. A response's WRITE carries an immediate, which
//    consumes a receive: the client QPs take theirs from one SRQ of the transport,
//    `receives` zero-byte receives (a multiple of receive_batch) kept posted but for
//    at most receive_batch - 1 taken ones that wait to go back together (one post, not
//    one per response), so a QP never runs out while fewer responses than receives -
//    receive_batch are in flight at the endpoint (beyond, the writer's RNR retries
//    wait for a receive).
//    A client's QP also SENDs its whole requests (packet.hpp), from staging memory.
//  * A server's RC QP initiates, and receives the whole requests its client SENDs: it
//    allows the peer no memory access. Its receives come from a second SRQ of the
//    transport, made with the first server QP: `whole_receives` buffers of
//    `whole_bytes` each in one region (local write only). A buffer's completion goes
//    to the Done function (received() gives its bytes), and the buffer is posted again
//    once Done returns: what Done keeps of it, it copies.
//  * A failed receive (its QP broke while consuming it: a peer's SEND larger than the
//    buffer or into a zero-byte receive) is posted again too, as a taken one: the SRQ
//    keeps its size whatever peers do.
//  * Both SRQs are shared by every session's QP: a peer that takes receives no honest
//    peer takes (a flood of immediates or SENDs) would starve the others. The endpoint
//    ends that peer's session at its first such receive (EndpointCore::misused), so no
//    more than what it had in flight then is taken. Not caught: a client SENDing
//    well-formed whole requests of its own session faster than the server takes them.
//    Resent copies of one call could be bounded (an honest client SENDs one at most
//    RtoConfig::max_timeouts times), but beginning and cancelling calls is honest use
//    and SENDs a new one each time, however busy the slot's handler: only a receive
//    queue per session would bound what a session takes.
//  * On a both-ways session each end calls and serves: its QP is both (a target
//    allowing remote READ and WRITE, and the initiator of its own end's transfers).
//    It takes its receives from the immediates' SRQ, so it takes no whole requests.
//  * Every READ, WRITE and SEND is signaled and named by a wr_id the endpoint chooses
//    (bits 62 and 63 clear), and so is the last of each chain of a client's window
//    binds or revocations (the QPs do not signal every WR); each completion, success or failure, goes to the Done
//    function in the CQ's batch, and so does each receive's (wr_id receive_id, or
//    whole_receive_bit with the buffer's index).
//  * The CQ has `depth` entries: the endpoint keeps the transfers and SENDs in flight
//    across all QPs, plus `receives` and `whole_receives`, well below it (the
//    completions of a QP destroyed with transfers in flight may still come, uncounted).
//
// Thread safety: as the io_context (one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <source_location>
#include <span>

#include <asio/io_context.hpp>

#include <rdmaxx/async/completions.hpp>
#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pd.hpp>
#include <rdmaxx/wrap/qp.hpp>
#include <rdmaxx/wrap/srq.hpp>

namespace rdmaxx::rpc::detail {

enum class RcRole : std::uint8_t { client, server, both };

class RcTransport {
public:
    using Done = void (*)(void* context, const WorkCompletion& completion);
    // The wr_id of every immediate's receive (a transfer's wr_id never has bit 63 set).
    static constexpr std::uint64_t receive_id = std::uint64_t{1} << 63;
    // A whole request's receive: this bit and the buffer's index.
    static constexpr std::uint64_t whole_receive_bit = std::uint64_t{1} << 62;
    // The immediates' receives taken that are posted again together, with one post
    // (callgrind: 75 fewer instructions per response at the client than one each).
    static constexpr std::size_t receive_batch = 16;

    struct Sizes {
        std::uint32_t depth = 0;          // CQ entries
        std::uint32_t receives = 0;       // the immediates' SRQ: a multiple of receive_batch
        std::uint32_t whole_receives = 0; // the whole requests' SRQ
        std::uint32_t whole_bytes = 0;    // each of its buffers
    };
    // Runtime errors: the device's (one without SRQs among them). Programming error:
    // a size 0, receives not a multiple of receive_batch, the receives together not below
    // depth, a null done.
    static Result<std::unique_ptr<RcTransport>> create(asio::io_context& io, const Context& context,
                                                       const ProtectionDomain& pd, Sizes sizes,
                                                       async::DriveOptions drive, Done done, void* done_context,
                                                       std::source_location where = std::source_location::current());
    RcTransport(const RcTransport&) = delete;
    RcTransport& operator=(const RcTransport&) = delete;

    // An RC QP of `role` on the shared CQ, in RESET (connect() it towards the peer's).
    // `depth`: the WRs its send queue holds (a server's transfers, a client's SENDs).
    // Runtime errors: the device's (the first server QP also makes the whole
    // requests' SRQ and buffers).
    Result<QueuePair> create_qp(RcRole role, std::uint32_t depth, std::uint8_t port,
                                std::optional<std::uint32_t> gid_index);

    // The bytes a successful whole receive's completion brought, valid until Done returns.
    std::span<const std::byte> received(const WorkCompletion& completion) const noexcept;

    enum class Op : std::uint8_t { read, write };
    // READs `remote` into `local` (op read) or WRITEs `local` to `remote` with the
    // immediate `imm` (op write), signaled; a WRITE or SEND of up to the QP's
    // max_inline_data bytes inline (inline_sends.hpp). Runtime error: the post failed
    // (the QP is broken).
    static Result<void> post(QueuePair& qp, Op op, const LocalSlice& local, const RemoteMemory& remote,
                             std::uint64_t wr_id, std::uint32_t imm = 0);
    // SENDs `local` (a whole request), signaled. Runtime error: the post failed.
    static Result<void> send(QueuePair& qp, const LocalSlice& local, std::uint64_t wr_id);

    // Takes what the CQ holds now, up to a driver's turn, as the driver's next turn would.
    std::size_t poll() { return cq_->poll(); }

private:
    RcTransport(const ProtectionDomain& pd, Sizes sizes, Done done, void* done_context)
        : pd_(&pd), sizes_(sizes), done_(done), done_context_(done_context) {}
    static void take(void* self, std::span<const WorkCompletion> completions);
    Result<void> post_whole_receive(std::uint32_t index);

    const ProtectionDomain* pd_;
    Sizes sizes_;
    Done done_;
    void* done_context_;
    std::optional<async::CompletionQueue> cq_;
    // destroyed before the CQ their QPs' receives complete in
    std::optional<SharedReceiveQueue> srq_;
    std::optional<RecvBatch<receive_batch>> receives_; // receive_batch receives of srq_
    std::size_t receives_taken_ = 0;                   // since receives_ was last posted
    std::optional<SharedReceiveQueue> whole_srq_; // made with the first server QP
    std::optional<MemoryRegion> whole_buffers_;
    std::uint32_t inline_limit_ = 256; // the largest max_inline_data a QP was created with
};

} // namespace rdmaxx::rpc::detail
