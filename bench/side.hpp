// One side of an rdmaxx-perf run: its device, QPs, memory and the control stream to
// the peer, built on rdmaxx's own layers (wrap, data, ctrl).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <asio/io_context.hpp>

#include <rdmaxx/async/queue_pair.hpp>

#include <rdmaxx/ctrl/cm.hpp>
#include <rdmaxx/ctrl/tcp.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap.hpp>

#include "options.hpp"
#include "protocol.hpp"
#include "report.hpp"

namespace rdmaxx::perf {

// Who fills a buffer: the data each side sends is its own pattern, so each side can
// check what arrived.
enum class Role : std::uint8_t { client, server };
std::byte pattern(Role role, std::size_t offset, std::uint32_t size) noexcept;

class Side {
public:
    // The client: connects to the server, sends its parameters, builds its side and
    // connects the QPs.
    static Result<Side> connect(const Options& options);
    // The server: waits for one client, takes its parameters, builds its side
    // (refusing the client, with the reason, when it cannot) and connects the QPs.
    static Result<Side> accept(const Options& options);

    const Options& options() const noexcept { return options_; }
    const Setup& setup() const noexcept { return setup_; }
    Role role() const noexcept { return role_; }
    std::size_t qp_count() const noexcept { return qps_.size() + async_qps_.size(); }
    QueuePair& qp(std::size_t i) noexcept { return async_qps_.empty() ? qps_[i] : async_qps_[i].get(); }
    CompletionQueue& send_cq(std::size_t i) noexcept { return send_cqs_[i]; }
    CompletionQueue& recv_cq(std::size_t i) noexcept { return recv_cqs_[i]; }
    // --async (client): the io_context its loop runs on, and QP i attached to it.
    asio::io_context& io() noexcept { return *io_; }
    async::QueuePair& async_qp(std::size_t i) noexcept { return async_qps_[i]; }
    // QP i's buffers: what it sends or reads from (out), what the peer writes or sends
    // into, and where READ and atomic results land (in); each `slot` bytes.
    LocalSlice out(std::size_t i, std::uint32_t size) const { return mr_->slice(2 * i * slot_, size); }
    LocalSlice in(std::size_t i, std::uint32_t size) const { return mr_->slice((2 * i + 1) * slot_, size); }
    RemoteMemory peer_out(std::size_t i, std::uint32_t size) const { return peer_.slice(2 * i * slot_, size); }
    RemoteMemory peer_in(std::size_t i, std::uint32_t size) const { return peer_.slice((2 * i + 1) * slot_, size); }
    // The inline limit this side posts with.
    std::uint32_t inline_size() const noexcept { return setup_.inline_size; }
    // Posts a receive into QP i's inbox (SEND and WRITE_WITH_IMM tests).
    Result<void> post_receive(std::size_t i) { return receives_[i].post(); }

    // The control stream.
    Result<void> send(std::span<const std::byte> message);
    Result<void> receive(std::span<std::byte> message, Clock::time_point deadline);
    Result<protocol::Reply> receive_reply(Clock::time_point deadline);
    Result<void> reply(const protocol::Reply& reply) { return send(protocol::encode_reply(reply)); }

private:
    Side(Options options, Role role, TcpStream stream) : options_(std::move(options)), role_(role), stream_(std::move(stream)) {}
    // Device, CQs, QPs (inline limit resolved) and memory for options_.
    Result<void> build();
    // build() on the device and port RDMA CM resolved to.
    Result<void> build_on(const std::string& device, std::uint8_t ib_port);
    // RDMA CM: QP i connected through one CM connection each.
    Result<void> connect_cm(std::size_t i, CmConnection connection);
    Result<void> accept_cm(std::size_t i, CmRequest request);
    // Connects the QPs over the TCP exchange (unless RDMA CM did), exchanges the MR
    // descriptors, posts the receives and confirms both sides are ready.
    Result<void> link();

    Options options_;
    Role role_;
    TcpStream stream_;
    std::optional<Context> context_;
    std::optional<ProtectionDomain> pd_;
    std::vector<CompletionQueue> send_cqs_, recv_cqs_;
    std::vector<QueuePair> qps_;
    // --async: the QPs on CQs driven by io_ (created before them: destroyed after)
    std::unique_ptr<asio::io_context> io_;
    std::vector<async::CompletionQueue> async_cqs_; // QP i's send CQ at 2i, receive CQ at 2i + 1
    std::vector<async::QueuePair> async_qps_;
    std::vector<CmConnection> cm_;   // RDMA CM: one per QP
    Mtu peer_mtu_ = Mtu::unknown;
    std::optional<MemoryRegion> mr_;
    std::vector<RecvBatch<1>> receives_; // each QP's receive of its whole inbox, built once
    RemoteMemory peer_;
    std::size_t slot_ = 0;
    Setup setup_;
};

} // namespace rdmaxx::perf
