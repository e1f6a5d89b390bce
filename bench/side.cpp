#include "side.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace rdmaxx::perf {
namespace {

// The server waits this long for its client to appear.
constexpr std::chrono::seconds accept_wait{120};
constexpr std::uint32_t probe_inline[] = {1024, 512, 256, 128, 64, 0};

bool is_mlx5(const Context& context) { return context.name().starts_with("mlx5"); }

} // namespace

std::byte pattern(Role role, std::size_t offset, std::uint32_t size) noexcept {
    return static_cast<std::byte>((offset * 7 + size + (role == Role::client ? 0 : 101)) & 0xff);
}

Result<void> Side::send(std::span<const std::byte> message) {
    return stream_.write_all(message, Clock::now() + options_.timeout);
}

Result<void> Side::receive(std::span<std::byte> message, Clock::time_point deadline) {
    return stream_.read_exact(message, deadline);
}

Result<protocol::Reply> Side::receive_reply(Clock::time_point deadline) {
    protocol::ReplyWire wire;
    if (auto ok = receive(wire, deadline); !ok)
        return std::unexpected(std::move(ok.error()));
    return protocol::decode_reply(wire);
}

Result<void> Side::build() {
    const Options& o = options_;
    auto context = Context::open(o.device);
    if (!context)
        return std::unexpected(std::move(context.error()));
    context_.emplace(std::move(*context));
    auto pd = ProtectionDomain::create(*context_);
    if (!pd)
        return std::unexpected(std::move(pd.error()));
    pd_.emplace(std::move(*pd));

    const bool two_sided = o.test.verb == Verb::send || o.test.verb == Verb::write_imm;
    send_cqs_.reserve(o.qps);
    recv_cqs_.reserve(o.qps);
    qps_.reserve(o.qps);
    // An explicit inline size is asked for as it is; the default probes the device's
    // limit (QP creation is the only way libibverbs tells it).
    std::vector<std::uint32_t> inline_tries(std::begin(probe_inline), std::end(probe_inline));
    if (o.inline_size)
        inline_tries = {*o.inline_size};
    else if (default_inline(o.test, is_mlx5(*context_), 1024) == 0)
        inline_tries = {0};
    // A latency SEND or WRITE_WITH_IMM signals one WR in cq_mod (as perftest's send_lat):
    // its send queue holds a whole interval, whatever the TX depth.
    const std::uint32_t send_depth =
        o.test.measure == Measure::latency && two_sided ? std::max(o.tx_depth, o.cq_mod) : o.tx_depth;
    const bool on_async = role_ == Role::client && o.async != AsyncMode::off;
    if (on_async) {
        io_ = std::make_unique<asio::io_context>(1);
        async_cqs_.reserve(2 * o.qps);
    }
    const auto drive = [&]() -> async::DriveOptions {
        switch (o.async) {
        case AsyncMode::busy: return {.mode = async::CompletionMode::busy};
        case AsyncMode::hybrid: return {.mode = async::CompletionMode::hybrid};
        default: return {.mode = async::CompletionMode::event};
        }
    };
    for (std::uint32_t i = 0; i < o.qps; ++i) {
        const CqOptions send_options{.depth = send_depth}, recv_options{.depth = two_sided ? o.rx_depth : 1};
        if (on_async) {
            // room for every completion the QP can have due, whatever the device rounds to
            for (const CqOptions& options : {send_options, recv_options}) {
                auto cq = async::CompletionQueue::create(*io_, *context_, {.depth = 2 * options.depth}, drive());
                if (!cq)
                    return std::unexpected(std::move(cq.error()));
                async_cqs_.push_back(std::move(*cq));
            }
        } else {
            auto send_cq = CompletionQueue::create(*context_, send_options);
            if (!send_cq)
                return std::unexpected(std::move(send_cq.error()));
            auto recv_cq = CompletionQueue::create(*context_, recv_options);
            if (!recv_cq)
                return std::unexpected(std::move(recv_cq.error()));
            send_cqs_.push_back(std::move(*send_cq));
            recv_cqs_.push_back(std::move(*recv_cq));
        }
        const CompletionQueue& send_cq = on_async ? async_cqs_[2 * i].get() : send_cqs_.back();
        const CompletionQueue& recv_cq = on_async ? async_cqs_[2 * i + 1].get() : recv_cqs_.back();
        Result<QueuePair> qp = std::unexpected(Error::unsupported("ibv_create_qp", "no inline size to try"));
        for (const std::uint32_t inline_bytes : inline_tries) {
            qp = QueuePair::create(*pd_, {.send_cq = &send_cq,
                                          .recv_cq = &recv_cq,
                                          .caps = {.max_send_wr = send_depth,
                                                   .max_recv_wr = two_sided ? o.rx_depth : 1,
                                                   .max_inline_data = inline_bytes},
                                          .port = o.ib_port,
                                          .gid_index = o.gid_index});
            if (qp)
                break;
        }
        if (!qp)
            return std::unexpected(std::move(qp.error()));
        inline_tries = {qp->caps().max_inline_data}; // every QP alike
        qps_.push_back(std::move(*qp));
    }
    const std::uint32_t inline_size =
        o.inline_size.value_or(default_inline(o.test, is_mlx5(*context_), qps_.front().caps().max_inline_data));

    // each buffer on pages of its own, as perftest lays them out (BUFF_SIZE: a whole
    // number of pages): what a side spins on never shares a page with what it sends
    const std::size_t page = 4096;
    slot_ = (std::size_t{*std::max_element(o.sizes.begin(), o.sizes.end())} + page - 1) / page * page;
    auto mr = MemoryRegion::allocate(*pd_, 2 * slot_ * o.qps, access_all);
    if (!mr)
        return std::unexpected(std::move(mr.error()));
    mr_.emplace(std::move(*mr));
    for (std::uint32_t i = 0; i < o.qps; ++i)
        receives_.emplace_back(qps_[i]).add(in(i, static_cast<std::uint32_t>(slot_)), i);
    setup_ = {.test = o.test,
              .atomic = o.atomic,
              .device = context_->name(),
              .rdma_cm = o.rdma_cm,
              .qps = o.qps,
              .tx_depth = send_depth,
              .post_list = o.post_list,
              .cq_mod = o.cq_mod,
              .inline_size = inline_size,
              .mtu_bytes = 0,
              .async = on_async ? o.async : AsyncMode::off};
    return {};
}

Result<void> Side::build_on(const std::string& device, std::uint8_t ib_port) {
    options_.device = device;
    options_.ib_port = ib_port;
    return build();
}

Result<void> Side::connect_cm(std::size_t i, CmConnection connection) {
    auto peer = connection.connect(qps_[i], {}, {.path_mtu = options_.mtu}, options_.timeout);
    if (!peer)
        return std::unexpected(std::move(peer.error()));
    if (auto ok = connection.establish(); !ok)
        return ok;
    peer_mtu_ = peer->qps.front().endpoint.mtu;
    cm_.push_back(std::move(connection));
    return {};
}

Result<void> Side::accept_cm(std::size_t i, CmRequest request) {
    if (auto ok = request.connect(qps_[i], {.path_mtu = options_.mtu}); !ok)
        return ok;
    peer_mtu_ = request.offer().qps.front().endpoint.mtu;
    auto connection = std::move(request).accept(qps_[i], {}, options_.timeout);
    if (!connection)
        return std::unexpected(std::move(connection.error()));
    cm_.push_back(std::move(*connection));
    return {};
}

Result<void> Side::link() {
    const auto mine = mr_->remote().serialize();
    RemoteMemory::Wire theirs{};
    if (options_.rdma_cm) {
        // CM private data has no room for the descriptor: it takes the control stream
        if (auto ok = send(mine); !ok)
            return ok;
        if (auto ok = receive(theirs, Clock::now() + options_.timeout); !ok)
            return ok;
    } else {
        std::vector<QueuePair*> qps;
        for (QueuePair& qp : qps_)
            qps.push_back(&qp);
        auto peer = connect_over_tcp(stream_, qps, mine, {.path_mtu = options_.mtu}, options_.timeout);
        if (!peer)
            return std::unexpected(std::move(peer.error()));
        if (peer->metadata.size() != theirs.size())
            return std::unexpected(Error::protocol(
                "peer", fmt::format("{} bytes of region descriptor, expected {}", peer->metadata.size(), theirs.size())));
        std::copy(peer->metadata.begin(), peer->metadata.end(), theirs.begin());
        peer_mtu_ = peer->qps.front().endpoint.mtu;
    }
    auto region = RemoteMemory::parse(theirs);
    if (!region)
        return std::unexpected(std::move(region.error()));
    if (region->length != mr_->size())
        return std::unexpected(Error::protocol(
            "peer", fmt::format("the peer's region has {} bytes, this run needs {}", region->length, mr_->size())));
    peer_ = *region;
    setup_.mtu_bytes = mtu_bytes(options_.mtu.value_or(std::min(qps_.front().endpoint().mtu, peer_mtu_)));
    if (options_.test.verb == Verb::send || options_.test.verb == Verb::write_imm)
        for (std::size_t i = 0; i < qps_.size(); ++i)
            for (std::uint32_t n = 0; n < options_.rx_depth; ++n)
                if (auto ok = post_receive(i); !ok)
                    return ok;
    return stream_.confirm_ready(options_.timeout);
}

Result<Side> Side::connect(const Options& options) {
    auto stream = TcpStream::connect(options.host, options.port, options.timeout);
    if (!stream)
        return std::unexpected(std::move(stream.error()));
    Side side(options, Role::client, std::move(*stream));
    if (auto ok = side.send(protocol::encode_request(options)); !ok)
        return std::unexpected(std::move(ok.error()));
    auto reply = side.receive_reply(Clock::now() + options.timeout);
    if (!reply)
        return std::unexpected(std::move(reply.error()));
    if (reply->kind != protocol::ReplyKind::accepted)
        return std::unexpected(Error::from_errno("peer", ECONNREFUSED,
                                                 fmt::format("the server refused: {}", reply->reason)));
    if (!options.rdma_cm) {
        if (auto ok = side.build(); !ok)
            return std::unexpected(std::move(ok.error()));
    } else {
        // the CM resolves the server's address to the device the QPs must live on
        for (std::uint32_t i = 0; i < options.qps; ++i) {
            auto connection = CmConnection::resolve(options.host, options.port, options.timeout);
            if (!connection)
                return std::unexpected(std::move(connection.error()));
            if (i == 0)
                if (auto ok = side.build_on(connection->device(), connection->ib_port()); !ok)
                    return std::unexpected(std::move(ok.error()));
            if (auto ok = side.connect_cm(i, std::move(*connection)); !ok)
                return std::unexpected(std::move(ok.error()));
        }
    }
    if (auto ok = side.link(); !ok)
        return std::unexpected(std::move(ok.error()));
    if (side.io_) { // connected and ready: from here the QPs are lib/async's
        for (std::size_t i = 0; i < side.qps_.size(); ++i)
            side.async_qps_.push_back(
                async::QueuePair::attach(std::move(side.qps_[i]), side.async_cqs_[2 * i], side.async_cqs_[2 * i + 1]));
        side.qps_.clear();
    }
    return side;
}

Result<Side> Side::accept(const Options& options) {
    auto listener = TcpListener::listen("", options.port);
    if (!listener)
        return std::unexpected(std::move(listener.error()));
    auto stream = listener->accept(accept_wait);
    if (!stream)
        return std::unexpected(std::move(stream.error()));
    Side side(options, Role::server, std::move(*stream));
    protocol::RequestWire request;
    if (auto ok = side.receive(request, Clock::now() + options.timeout); !ok)
        return std::unexpected(std::move(ok.error()));
    // Over TCP the side is built before the client is accepted; over RDMA CM the
    // listener must be up first, and the side is built on the device the client reaches.
    std::optional<CmListener> cm;
    auto ready = protocol::decode_request(request, side.options_);
    if (ready && options.rdma_cm) {
        auto listening = CmListener::listen("", options.port);
        if (listening)
            cm.emplace(std::move(*listening));
        else
            ready = std::unexpected(std::move(listening.error()));
    } else if (ready) {
        ready = side.build();
    }
    if (!ready) {
        // the client learns why; a write failure here changes nothing for the server
        (void)side.reply({protocol::ReplyKind::refused, fmt::format("{}", ready.error())});
        return std::unexpected(std::move(ready.error()));
    }
    if (auto ok = side.reply({protocol::ReplyKind::accepted, {}}); !ok)
        return std::unexpected(std::move(ok.error()));
    for (std::uint32_t i = 0; cm && i < side.options_.qps; ++i) {
        auto connect_request = cm->next(options.timeout);
        if (!connect_request)
            return std::unexpected(std::move(connect_request.error()));
        if (i == 0)
            if (auto ok = side.build_on(connect_request->device(), connect_request->ib_port()); !ok)
                return std::unexpected(std::move(ok.error())); // the request, dropped, rejects the client
        if (auto ok = side.accept_cm(i, std::move(*connect_request)); !ok)
            return std::unexpected(std::move(ok.error()));
    }
    if (auto ok = side.link(); !ok)
        return std::unexpected(std::move(ok.error()));
    return side;
}

} // namespace rdmaxx::perf
