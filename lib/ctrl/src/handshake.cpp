#include "handshake.hpp"

#include <algorithm>
#include <cerrno>
#include <new>
#include <system_error>

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx::detail {
namespace {

std::chrono::milliseconds remaining(Clock::time_point deadline) {
    return std::max(std::chrono::milliseconds(0), std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
}

// A Connection's offer, whole: one QP and the limits, nothing else.
constexpr std::size_t offer_bytes = endpoint_codec::header_size + 4 + endpoint_codec::qp_size + 4 + limits_bytes;

Result<std::shared_ptr<Group>> group_on(std::shared_ptr<Group> group, const ConnectionOptions& options) {
    if (!group)
        return Group::create(options);
    if (!options.device.empty() && options.device != group->context.name())
        return std::unexpected(Error::from_errno(
            "Connection::connect", EXDEV,
            fmt::format("the address is reached through {}, the shared connection is on {}", options.device,
                        group->context.name())));
    return group;
}

// What a non-blocking socket call's failure means: nothing to do yet (EAGAIN), or an Error.
Result<void> would_block_or(const char* call, const std::string& peer) {
    const int error = errno;
    if (error == EAGAIN || error == EWOULDBLOCK || error == EINTR)
        return {};
    return std::unexpected(Error::from_errno(call, error, peer));
}

} // namespace

// --- client side ---------------------------------------------------------------------------

Result<std::unique_ptr<Link>> connect_tcp(std::shared_ptr<Group> group, std::string_view host, std::uint16_t port,
                                          const ConnectionOptions& options, Clock::time_point deadline) {
    auto on = group_on(std::move(group), options);
    if (!on)
        return std::unexpected(std::move(on.error()));
    auto link = Link::create(std::move(*on), options);
    if (!link)
        return link;
    Link& l = **link;
    auto stream = TcpStream::connect(host, port, remaining(deadline));
    if (!stream)
        return std::unexpected(std::move(stream.error()));
    QueuePair* qps[] = {&l.qp()};
    auto peer = connect_over_tcp(*stream, qps, l.describe().metadata, options.qp, remaining(deadline));
    if (!peer)
        return std::unexpected(std::move(peer.error()));
    if (auto ok = l.start(*peer); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto ok = stream->confirm_ready(remaining(deadline)); !ok)
        return std::unexpected(std::move(ok.error()));
    l.watch(std::move(*stream));
    return link;
}

CmAttempts::CmAttempts(std::shared_ptr<Group> group, std::string host, std::uint16_t port, ConnectionOptions options,
                       Clock::time_point deadline)
    : group_(std::move(group)), host_(std::move(host)), port_(port), options_(std::move(options)),
      deadline_(deadline),
      attempt_(std::max<std::chrono::milliseconds>(std::chrono::seconds(1), options_.timeout / 3)) {}

Result<void> CmAttempts::resolve() {
    cm_.reset();
    auto cm = CmConnection::resolve(host_, port_, remaining(deadline_));
    if (!cm)
        return std::unexpected(std::move(cm.error()));
    on_device_ = on_device_of(*cm, options_);
    cm_.emplace(std::move(*cm));
    return {};
}

Result<void> CmAttempts::make_link() {
    link_.reset();
    auto on = group_on(group_, on_device_);
    if (!on)
        return std::unexpected(std::move(on.error()));
    group_ = *on;
    auto link = Link::create(std::move(*on), on_device_);
    if (!link)
        return std::unexpected(std::move(link.error()));
    link_ = std::move(*link);
    return {};
}

Result<bool> CmAttempts::connect() {
    const auto attempt_end = std::min(deadline_, deadline_after(attempt_));
    auto peer = cm_->connect(link_->qp(), link_->describe().metadata, options_.qp, remaining(attempt_end));
    if (!peer) {
        if (peer.error().is_timeout() && Clock::now() < deadline_) {
            logger()->debug("Connection: no answer from {} within {} ms, asking again", cm_->peer(), attempt_.count());
            attempt_ = std::min(attempt_, std::chrono::milliseconds::max() / 2) * 2; // no limit stays none
            return false;
        }
        return std::unexpected(std::move(peer.error()));
    }
    peer_ = std::move(*peer);
    return true;
}

Result<void> CmAttempts::step() {
    require(next_ != Step::offered, std::source_location::current(), "CmAttempts::step() once offered");
    switch (next_) {
    case Step::resolve:
        if (auto ok = resolve(); !ok)
            return ok;
        next_ = Step::make_link;
        return {};
    case Step::make_link:
        if (auto ok = make_link(); !ok)
            return ok;
        next_ = Step::connect;
        return {};
    case Step::connect: {
        auto answered = connect();
        if (!answered)
            return std::unexpected(std::move(answered.error()));
        next_ = *answered ? Step::offered : Step::resolve;
        return {};
    }
    case Step::offered: break;
    }
    return {};
}

CmOffered CmAttempts::offered() && { return CmOffered{std::move(link_), std::move(cm_), std::move(peer_)}; }

Result<std::unique_ptr<Link>> connect_cm(std::shared_ptr<Group> group, std::string_view host, std::uint16_t port,
                                         const ConnectionOptions& options, Clock::time_point deadline) {
    CmAttempts attempts(std::move(group), std::string(host), port, options, deadline);
    while (attempts.next() != CmAttempts::Step::offered)
        if (auto ok = attempts.step(); !ok)
            return std::unexpected(std::move(ok.error()));
    CmOffered offered = std::move(attempts).offered();
    if (auto ok = finish_cm(offered); !ok)
        return std::unexpected(std::move(ok.error()));
    return std::move(offered.link);
}

Result<void> finish_cm(CmOffered& offered) {
    if (auto ok = offered.link->start(offered.peer); !ok)
        return ok;
    if (auto ok = offered.cm->establish(); !ok)
        return ok;
    offered.link->watch(std::move(*offered.cm));
    return {};
}

// --- server side ---------------------------------------------------------------------------

ServerHandshake::ServerHandshake(TcpStream stream, std::string host, Clock::time_point deadline)
    : deadline_(deadline), host_(std::move(host)), stream_(std::move(stream)) {
    in_.reserve(offer_bytes);
}

Result<ServerHandshake> ServerHandshake::answer(std::shared_ptr<Group> group, CmRequest request, std::string host,
                                                const ConnectionOptions& options, const ConnectRunner& run_connect,
                                                Clock::time_point deadline) {
    if (request.device() != group->context.name())
        return std::unexpected(Error::from_errno("rdma_cm", EXDEV,
                                                 fmt::format("{} reached device {}, the listener serves {}",
                                                             request.peer(), request.device(), group->context.name())));
    auto link = Link::create(std::move(group), options);
    if (!link)
        return std::unexpected(std::move(link.error()));
    ServerHandshake handshake(deadline);
    handshake.host_ = std::move(host);
    handshake.request_ = std::make_unique<CmRequest>(std::move(request));
    handshake.link_ = std::move(*link);
    auto connecting = run_connect(
        [request = handshake.request_.get(), qp = &handshake.link_->qp(), qp_options = options.qp] {
            return request->connect(*qp, qp_options);
        },
        handshake.request_->peer(), deadline);
    if (!connecting)
        return std::unexpected(std::move(connecting.error()));
    handshake.connecting_ = std::move(*connecting);
    handshake.state_ = State::connecting;
    return handshake;
}

Result<void> ServerHandshake::answer_request() {
    if (auto ok = link_->start(request_->offer()); !ok)
        return ok;
    auto cm = std::move(*request_).answer(link_->qp(), link_->describe().metadata);
    request_.reset();
    if (!cm)
        return std::unexpected(std::move(cm.error()));
    cm_.emplace(std::move(*cm));
    state_ = State::cm_establish;
    return {};
}

const std::string& ServerHandshake::peer() const {
    return stream_ ? stream_->peer() : cm_ ? cm_->peer() : request_->peer();
}

pollfd ServerHandshake::wanted() const {
    if (cm_)
        return {.fd = cm_->fd(), .events = POLLIN, .revents = 0};
    if (connecting_)
        return {.fd = connecting_->fd(), .events = POLLIN, .revents = 0};
    return {.fd = stream_->fd(), .events = static_cast<short>(state_ == State::write_answer ? POLLOUT : POLLIN),
            .revents = 0};
}

BackgroundConnect::~BackgroundConnect() {
    if (event_ >= 0)
        ::close(event_);
}

Result<void> BackgroundConnect::open() {
    event_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (event_ < 0)
        return std::unexpected(Error::from_last_errno("eventfd", "connecting a client's QP"));
    return {};
}

void BackgroundConnect::done(Result<void> result) {
    {
        const std::lock_guard lock(mutex_);
        result_.emplace(std::move(result));
        reported_ = true;
    }
    const std::uint64_t one = 1;
    (void)!::write(event_, &one, sizeof one); // cannot fail: a counter far from its limit
}

bool BackgroundConnect::reported() const {
    const std::lock_guard lock(mutex_);
    return reported_;
}

std::optional<Result<void>> BackgroundConnect::finished() {
    std::uint64_t count = 0;
    if (::read(event_, &count, sizeof count) != sizeof count)
        return std::nullopt;
    const std::lock_guard lock(mutex_);
    return std::exchange(result_, std::nullopt);
}

Result<std::unique_ptr<BackgroundConnect>> ConnectOnThread::start(std::function<Result<void>()> connect,
                                                                  const std::string& /*peer*/,
                                                                  Clock::time_point /*deadline*/) {
    std::unique_ptr<ConnectOnThread> on(new ConnectOnThread);
    if (auto ok = on->open(); !ok)
        return std::unexpected(std::move(ok.error()));
    try {
        on->thread_ = std::thread([self = on.get(), connect = std::move(connect)] { self->done(connect()); });
    } catch (const std::system_error& e) { // EAGAIN: out of threads
        return std::unexpected(Error::from_errno("std::thread", e.code().value(), "connecting a client's QP"));
    } catch (const std::bad_alloc&) {
        return std::unexpected(Error::from_errno("std::thread", ENOMEM, "connecting a client's QP"));
    }
    return on;
}

ConnectOnThread::~ConnectOnThread() {
    if (thread_.joinable())
        thread_.join();
}

// The client's offer is complete: a link for it, its QP connecting (off the listener's thread).
Result<void> ServerHandshake::take_offer(const std::shared_ptr<Group>& group, const ConnectionOptions& options,
                                         const ConnectRunner& run_connect) {
    auto offer = endpoint_codec::decode(in_);
    if (!offer)
        return std::unexpected(std::move(offer.error()));
    if (offer->qps.size() != 1 || offer->qps[0].type != QpType::rc)
        return std::unexpected(Error::protocol("Connection", fmt::format("{} offers no single RC QP", peer())));
    // the limits first: a lying client costs no QP
    if (auto limits = decode_limits(offer->metadata); !limits)
        return std::unexpected(std::move(limits.error()));
    auto link = Link::create(group, options);
    if (!link)
        return std::unexpected(std::move(link.error()));
    auto connecting = run_connect(
        [qp = &(*link)->qp(), peer = offer->qps[0].endpoint, qp_options = options.qp] {
            return qp->connect(peer, qp_options);
        },
        peer(), deadline_);
    if (!connecting)
        return std::unexpected(std::move(connecting.error()));
    link_ = std::move(*link);
    connecting_ = std::move(*connecting);
    offer_ = std::move(*offer);
    return {};
}

Result<void> ServerHandshake::answer_offer() {
    if (auto ok = link_->start(*offer_); !ok)
        return ok;
    offer_.reset();
    out_ = endpoint_codec::encode(link_->describe());
    out_.push_back(TcpStream::ready_byte);
    state_ = State::write_answer;
    return {};
}

Result<std::unique_ptr<Link>> ServerHandshake::advance(const std::shared_ptr<Group>& group,
                                                       const ConnectionOptions& options,
                                                       const ConnectRunner& run_connect) {
    for (;;) {
        switch (state_) {
        case State::read_offer: {
            const std::size_t had = in_.size();
            in_.resize(offer_bytes);
            const ssize_t n = ::recv(stream_->fd(), in_.data() + had, offer_bytes - had, 0);
            in_.resize(had + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
            if (n == 0)
                return std::unexpected(Error::from_errno(
                    "Listener::accept", ECONNRESET,
                    fmt::format("{} closed the connection after {} bytes of its offer", peer(), had)));
            if (n < 0) {
                if (auto ok = would_block_or("recv", peer()); !ok)
                    return std::unexpected(std::move(ok.error()));
                return nullptr;
            }
            if (had < endpoint_codec::header_size && in_.size() >= endpoint_codec::header_size) {
                auto body = endpoint_codec::body_length(std::span(in_).first<endpoint_codec::header_size>());
                if (!body)
                    return std::unexpected(std::move(body.error()));
                if (*body != offer_bytes - endpoint_codec::header_size)
                    return std::unexpected(Error::protocol(
                        "Connection", fmt::format("{} announces a {}-byte offer, a Connection's is {}", peer(),
                                                  *body + endpoint_codec::header_size, offer_bytes)));
            }
            if (in_.size() < offer_bytes)
                continue; // maybe more is there already
            if (auto ok = take_offer(group, options, run_connect); !ok)
                return std::unexpected(std::move(ok.error()));
            state_ = State::connecting;
            continue;
        }
        case State::connecting: {
            auto connected = connecting_->finished();
            if (!connected)
                return nullptr;
            connecting_.reset();
            if (!*connected)
                return std::unexpected(std::move(connected->error()));
            if (auto ok = request_ ? answer_request() : answer_offer(); !ok)
                return std::unexpected(std::move(ok.error()));
            continue;
        }
        case State::write_answer: {
            const ssize_t n = ::send(stream_->fd(), out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
            if (n < 0) {
                if (auto ok = would_block_or("send", peer()); !ok)
                    return std::unexpected(std::move(ok.error()));
                return nullptr;
            }
            sent_ += static_cast<std::size_t>(n);
            if (sent_ == out_.size())
                state_ = State::read_ready;
            continue;
        }
        case State::read_ready: {
            std::byte ready{};
            const ssize_t n = ::recv(stream_->fd(), &ready, 1, 0);
            if (n == 0)
                return std::unexpected(Error::from_errno(
                    "Listener::accept", ECONNRESET, fmt::format("{} closed the connection before it was ready", peer())));
            if (n < 0) {
                if (auto ok = would_block_or("recv", peer()); !ok)
                    return std::unexpected(std::move(ok.error()));
                return nullptr;
            }
            if (ready != TcpStream::ready_byte)
                return std::unexpected(Error::protocol(
                    "Connection", fmt::format("{} sent {:#x}, not the ready byte", peer(), static_cast<unsigned>(ready))));
            link_->watch(std::move(*stream_));
            return std::move(link_);
        }
        case State::cm_establish: {
            auto established = cm_->established();
            if (!established)
                return std::unexpected(std::move(established.error()));
            if (!*established)
                return nullptr;
            link_->watch(std::move(*cm_));
            return std::move(link_);
        }
        }
    }
}

} // namespace rdmaxx::detail
