/// @file
/// Registered message buffers for lib/rpc calls: the zero-copy way to call.
///
/// @code
/// auto request = (*endpoint)->alloc_buffer(1 << 20, rdmaxx::rpc::BufferUse::request);
/// auto response = (*endpoint)->alloc_buffer(1 << 20, rdmaxx::rpc::BufferUse::response);
/// fill(request->bytes());                       // bytes(): the first size() of capacity()
/// auto got = co_await session->call(kPut, *request, *response);   // response->size() = *got
/// @endcode
///
/// A call made with MessageBuffers does not copy its request: the UD packets gather
/// each header (from the endpoint's send buffers) and their share of the buffer; a
/// request the server takes whole (up to 16 KiB, on the RC path: endpoint.hpp) is SENT
/// from the buffer itself, its packet header and descriptor written into the room a
/// request buffer has in front of its bytes (eRPC's header room); a larger request
/// above the endpoint's rdma_threshold is READ by the server straight from the buffer.
/// A response above the threshold is WRITTEN by the server straight into the response
/// buffer; a smaller one is copied out of the session's window into it, as for a call
/// with spans.
///
/// Rights: each buffer is registered with what its use needs and no more: a request
/// buffer for local access, plus remote READ if its capacity is above rdma_threshold
/// (the server may READ it); a response buffer for local WRITE, plus remote WRITE if its
/// capacity is above the threshold. Such a buffer's remote key is the registration's:
/// a call that lends it tells the session's peer the buffer's address and key, and the
/// key stays valid, for the whole capacity, while the memory is registered, and from
/// every RC QP of the endpoint (they share its protection domain). An honest server
/// touches only the call's bytes, while the call is in flight (or, abandoned, until the
/// buffer has new memory: below); a hostile server could READ a request buffer or WRITE
/// a response buffer later, also while it is lent to another session's call. The
/// staging memory of large calls with spans is as reachable.
///
/// EndpointOptions::lend_through_windows makes the access exact. Buffers above the
/// threshold (and staging memory) are then registered for binding memory windows only
/// (plus local WRITE for a response buffer): the registration's key reaches nothing
/// remotely. A call that lends memory hands the server the key of a window of its slot,
/// bound through the session's RC QP to exactly the call's bytes (the request, READ;
/// the response's capacity, WRITTEN) before the descriptor goes, and revoked before the
/// call ends: the key works from that QP only, and only while the call is in flight. A
/// call abandoned (timed out, cancelled) keeps its windows bound until the server is
/// heard from in the slot, as its memory stays where its late transfer lands (below).
/// Where the device enforces a window's bounds (Soft-RoCE in Linux 6.1 checks the
/// region's only: window_bounds_enforced() tells), nothing outside the call's bytes is
/// reachable either. Without it, an endpoint that calls a server it does not trust
/// keeps every call on UD (rdma_threshold = UINT32_MAX).
///
/// Safety: the NIC may still reach a buffer's memory after its call ended: a UD send
/// of its packets or a SEND of its whole request (a resend's too) not yet complete, or
/// the server's READ or WRITE for a call that was abandoned (timed out, cancelled, its
/// session reset); a packet small enough to go inline is copied at its post and holds
/// nothing. (A resend that reads bytes the caller has written since its call was
/// answered does no harm: the server has served that request, and a duplicate's bytes
/// are never handled.) The memory is therefore shared
/// between the MessageBuffer and each transfer that may still touch it, and freed with
/// the last: destroying a MessageBuffer is always safe. When a call ends without its
/// response while such a transfer may still come, its buffers get new memory (a
/// request's bytes are copied over, so the caller may call again with it;
/// Counters::buffers_renewed): the late transfer meets the old memory only, never the
/// caller's next bytes. Where no new memory can be had (allocation or registration
/// fails), the session's RC QP is put in error at once, so that no late READ or WRITE
/// reaches the buffer, and the session ends (Counters::renewals_failed). So a span
/// from bytes() is valid until the buffer is next given to a call, or destroyed. A
/// buffer that something else may touch as its call begins (a send of its previous
/// call not yet complete, another call in flight with the same request) is copied, as
/// spans are (Counters::message_copies).
///
/// @threadsafety As its Endpoint (the io_context's one thread); a MessageBuffer may
/// outlive its Endpoint (its memory keeps the device open).
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>
#include <utility>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/mr.hpp>

namespace rdmaxx::rpc {

class Endpoint;
class Session;

/// What a MessageBuffer is for, which decides its rights (message_buffer.hpp).
enum class BufferUse : std::uint8_t {
    request,  ///< what a call sends
    response, ///< where a call's response lands
};

namespace detail {

struct EndpointCore;

// A message buffer's registered memory, shared by the MessageBuffer and the transfers
// that may still touch it (a count, not atomic: one thread), freed with the last. The
// region begins with `room` bytes in front of the message (a request buffer's: a
// packet header and a descriptor, for a request SENT whole from there).
struct BufferBlock {
    BufferBlock(MemoryRegion registered, std::uint32_t room_in_front)
        : region(std::move(registered)), lkey(region.lkey()), room(room_in_front), pd(region.get()->pd),
          message_(region.bytes().subspan(room)) {}

    const MemoryRegion region; // const: message_ points into it
    std::uint32_t holders = 1;
    std::uint32_t lkey; // region's, for the packets gathered from it
    std::uint32_t room;
    const void* pd; // region's ibv_pd: a call takes only its endpoint's buffers
    // The bytes past the room: the message's capacity (kept: every call reads it).
    std::span<std::byte> message() const noexcept { return message_; }

private:
    std::span<std::byte> message_;
};

// One holder of a BufferBlock.
class BufferHold {
public:
    BufferHold() = default;
    explicit BufferHold(BufferBlock* block) noexcept : block_(block) {}
    BufferHold(const BufferHold& other) noexcept : block_(other.block_) {
        if (block_ != nullptr)
            ++block_->holders;
    }
    BufferHold(BufferHold&& other) noexcept : block_(std::exchange(other.block_, nullptr)) {}
    BufferHold& operator=(BufferHold other) noexcept {
        std::swap(block_, other.block_);
        return *this;
    }
    ~BufferHold() {
        if (block_ != nullptr && --block_->holders == 0)
            delete block_;
    }
    BufferBlock* get() const noexcept { return block_; }
    // Whether this is the only holder (nothing else may touch the memory).
    bool sole() const noexcept { return block_ != nullptr && block_->holders == 1; }

private:
    BufferBlock* block_ = nullptr;
};

} // namespace detail

/// A registered buffer of `capacity()` bytes, of which the first size() are the
/// message (a new buffer's size is its capacity, its bytes zero). Move-only. Made by
/// Endpoint::alloc_buffer.
/// @threadsafety As its Endpoint (the io_context's one thread), unchecked; it may
/// outlive its Endpoint (its memory keeps the device open).
class MessageBuffer {
public:
    /// Takes over `other`'s memory; `other` is left moved-from.
    MessageBuffer(MessageBuffer&&) noexcept = default;
    /// Lets go of this one's memory (as the destructor does), then takes over `other`'s.
    MessageBuffer& operator=(MessageBuffer&&) noexcept = default;
    MessageBuffer(const MessageBuffer&) = delete;
    MessageBuffer& operator=(const MessageBuffer&) = delete;
    /// Always safe: its memory is freed with the last transfer that may still touch it.
    ~MessageBuffer() = default;

    /// The message: valid until the buffer is next given to a call (message_buffer.hpp).
    /// @misuse A moved-from buffer.
    std::span<std::byte> bytes(std::source_location where = std::source_location::current());
    /// The message, read-only; as bytes().
    /// @misuse A moved-from buffer.
    std::span<const std::byte> bytes(std::source_location where = std::source_location::current()) const;
    /// The message's size: bytes() is its first size() bytes.
    std::size_t size() const noexcept { return size_; }
    /// The registered bytes (0 for a moved-from buffer).
    std::size_t capacity() const noexcept { return hold_.get() != nullptr ? hold_.get()->message().size() : 0; }
    /// What it was allocated for.
    BufferUse use() const noexcept { return use_; }
    /// Sets the message's size; the bytes stay as they are.
    /// @misuse Above capacity(); a moved-from buffer.
    void resize(std::size_t size, std::source_location where = std::source_location::current());

private:
    friend class Endpoint;
    friend class Session;
    friend struct detail::EndpointCore;
    MessageBuffer(detail::BufferHold hold, BufferUse use) noexcept
        : hold_(std::move(hold)), size_(hold_.get()->message().size()), use_(use) {}

    detail::BufferHold hold_;
    std::size_t size_ = 0;
    BufferUse use_ = BufferUse::request;
};

} // namespace rdmaxx::rpc
