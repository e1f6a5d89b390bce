// RDMA CM plumbing for Connection and Listener: an event channel and a CM id with
// bounded waits. The queue pairs stay rdmaxx's own (created on a Context of the CM
// id's device, moved through their states by rdmaxx); the CM carries the endpoint
// messages as private data and reports the peer's disconnect.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <rdma/rdma_cma.h>

#include <rdmaxx/ctrl/tcp.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::detail {

// What an event said, copied out before the event is acknowledged.
struct CmEvent {
    rdma_cm_event_type type;
    rdma_cm_id* id;                    // the new id of a CONNECT_REQUEST
    int status;
    std::vector<std::byte> private_data;
};

class CmSession {
public:
    // A channel (non-blocking) and an id on it.
    static Result<std::unique_ptr<CmSession>> create();
    // Takes over `id` (a CONNECT_REQUEST's) on a channel of its own.
    static Result<std::unique_ptr<CmSession>> adopt(rdma_cm_id* id);
    ~CmSession();

    rdma_cm_id* id() const noexcept { return id_; }
    int fd() const noexcept { return channel_->fd; }
    const std::string& peer() const noexcept { return peer_; }
    void set_peer(std::string peer) { peer_ = std::move(peer); }

    // The next event within the deadline.
    Result<CmEvent> next(Clock::time_point deadline);
    // The next event, which must be of type `wanted` (else an Error naming both).
    Result<CmEvent> expect(rdma_cm_event_type wanted, Clock::time_point deadline);
    // Without waiting: an Error when the peer disconnected (or the device went away).
    Result<void> check_alive();

private:
    CmSession(rdma_event_channel* channel, rdma_cm_id* id) : channel_(channel), id_(id) {}
    rdma_event_channel* channel_;
    rdma_cm_id* id_;
    std::string peer_;
    bool disconnected_ = false;
};

// host:port's first IPv4 address, for rdma_resolve_addr / rdma_bind_addr, looked up
// within the deadline.
Result<std::vector<std::byte>> cm_address(const std::string& host, std::uint16_t port, bool passive,
                                          Clock::time_point deadline);

} // namespace rdmaxx::detail
