// A client written with librdmacm by hand: what a foreign, broken or hostile peer
// sends to an rdmaxx CM listener. Checks with CHECK only: usable off the main thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <span>
#include <string>

#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <doctest/doctest.h>

namespace rdmaxx::test {

class RawCmClient {
public:
    // Resolves address and route to host:port (IPv4), from `source` (an address of this
    // machine) when it is not empty.
    RawCmClient(const std::string& host, std::uint16_t port, const std::string& source = {})
        : channel_(rdma_create_event_channel()) {
        CHECK(rdma_create_id(channel_, &id_, nullptr, RDMA_PS_TCP) == 0);
        sockaddr_in to{}, from{};
        to.sin_family = from.sin_family = AF_INET;
        to.sin_port = htons(port);
        CHECK(inet_pton(AF_INET, host.c_str(), &to.sin_addr) == 1);
        if (!source.empty())
            CHECK(inet_pton(AF_INET, source.c_str(), &from.sin_addr) == 1);
        CHECK(rdma_resolve_addr(id_, source.empty() ? nullptr : reinterpret_cast<sockaddr*>(&from),
                                reinterpret_cast<sockaddr*>(&to), 2000) == 0);
        CHECK(next_event() == RDMA_CM_EVENT_ADDR_RESOLVED);
        CHECK(rdma_resolve_route(id_, 2000) == 0);
        CHECK(next_event() == RDMA_CM_EVENT_ROUTE_RESOLVED);
    }
    RawCmClient(const RawCmClient&) = delete;
    RawCmClient& operator=(const RawCmClient&) = delete;
    ~RawCmClient() {
        rdma_destroy_id(id_);
        rdma_destroy_event_channel(channel_);
    }

    // Sends a connect request carrying `private_data` and a made-up QP number, another
    // per request: the kernel's CM itself rejects a QP number already connecting (stale
    // connection), and the listener would never see the request. Made up above every
    // QP number rxe hands out (below 2^20; it counts up per device, across processes,
    // so from 0x1000 a made-up number met a real QP's now and then in a long run).
    void connect(std::span<const std::byte> private_data) {
        static std::atomic<std::uint32_t> next_qpn{0xf00000};
        rdma_conn_param param{};
        param.private_data = private_data.data();
        param.private_data_len = static_cast<std::uint8_t>(private_data.size());
        param.qp_num = next_qpn++ & 0xffffff;
        CHECK(rdma_connect(id_, &param) == 0);
    }

    // The next event's type (RDMA_CM_EVENT_UNREACHABLE when none came within `timeout`).
    rdma_cm_event_type next_event(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
        pollfd pfd{.fd = channel_->fd, .events = POLLIN, .revents = 0};
        if (::poll(&pfd, 1, static_cast<int>(timeout.count())) != 1)
            return RDMA_CM_EVENT_UNREACHABLE;
        rdma_cm_event* event = nullptr;
        CHECK(rdma_get_cm_event(channel_, &event) == 0);
        const rdma_cm_event_type type = event ? event->event : RDMA_CM_EVENT_UNREACHABLE;
        if (event)
            rdma_ack_cm_event(event);
        return type;
    }

private:
    rdma_event_channel* channel_;
    rdma_cm_id* id_ = nullptr;
};

} // namespace rdmaxx::test
