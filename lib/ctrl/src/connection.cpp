// Connection and Listener: facades. The protocol lives in link.cpp (the conversation),
// control_codec.cpp (its bytes) and handshake.cpp (getting connected).
#include <rdmaxx/ctrl/connection.hpp>

#include <algorithm>
#include <deque>
#include <list>
#include <vector>

#include <poll.h>

#include <fmt/format.h>

#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>

#include "handshake.hpp"
#include "link.hpp"
#include "listener_core.hpp"

namespace rdmaxx {
namespace detail {

void check_options(const ConnectionOptions& o, std::source_location where) {
    require(o.max_message >= 1 && o.max_message <= detail::max_message_limit, where,
            "ConnectionOptions::max_message {} outside 1..{}", o.max_message, detail::max_message_limit);
    require(o.receive_depth >= detail::CreditWindow::min_depth && o.receive_depth <= detail::CreditWindow::max_depth,
            where, "ConnectionOptions::receive_depth {} outside {}..{}", o.receive_depth,
            detail::CreditWindow::min_depth, detail::CreditWindow::max_depth);
    require(o.max_send_wr >= 2, where, "ConnectionOptions::max_send_wr {} below 2", o.max_send_wr);
    require(o.timeout.count() > 0 && o.timeout_per_mib.count() >= 0, where,
            "ConnectionOptions::timeout {} ms (timeout_per_mib {} ms): the timeout must be positive", o.timeout.count(),
            o.timeout_per_mib.count());
    require(o.backlog >= 1 && o.max_pending_handshakes >= 1, where,
            "ConnectionOptions::backlog {} and max_pending_handshakes {} must be at least 1", o.backlog,
            o.max_pending_handshakes);
    require(o.max_lease.count() >= 0 && o.max_lease.count() <= control::max_lease_ms, where,
            "ConnectionOptions::max_lease {} ms outside 0..{}", o.max_lease.count(), control::max_lease_ms);
    require(o.pool.arena_bytes >= MemoryPool::max_block, where,
            "ConnectionOptions::pool.arena_bytes {} below MemoryPool::max_block ({})", o.pool.arena_bytes,
            MemoryPool::max_block);
}

} // namespace detail

namespace {
void validate(const ConnectionOptions& options, std::source_location where) { detail::check_options(options, where); }
} // namespace

// --- Connection ----------------------------------------------------------------

Connection::Connection(std::unique_ptr<detail::Link> link) : link_(std::move(link)) {}
Connection::Connection(Connection&&) noexcept = default;
Connection& Connection::operator=(Connection&&) noexcept = default;
Connection::~Connection() = default; // the Link closes itself

detail::Link& Connection::link(std::source_location where) const { return *detail::live(link_, "Connection", where); }

Result<Connection> Connection::connect(std::string_view host, std::uint16_t port, const ConnectionOptions& options,
                                       std::source_location where) {
    validate(options, where);
    const auto deadline = deadline_after(options.timeout);
    auto link = options.transport == Transport::rdma_cm ? detail::connect_cm(nullptr, host, port, options, deadline)
                                                        : detail::connect_tcp(nullptr, host, port, options, deadline);
    if (!link)
        return std::unexpected(std::move(link.error()));
    return Connection(std::move(*link));
}

Result<Connection> Connection::connect_another(std::string_view host, std::uint16_t port, std::source_location where) {
    detail::Link& l = link(where);
    const ConnectionOptions& options = l.options();
    const auto deadline = deadline_after(options.timeout);
    auto group = l.shared_group();
    auto another = options.transport == Transport::rdma_cm
                       ? detail::connect_cm(std::move(group), host, port, options, deadline)
                       : detail::connect_tcp(std::move(group), host, port, options, deadline);
    if (!another)
        return std::unexpected(std::move(another.error()));
    return Connection(std::move(*another));
}

Result<void> Connection::close(Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.close(l.deadline(timeout));
}

const QueuePair& Connection::queue_pair(std::source_location where) const { return link(where).qp(); }
const ConnectionOptions& Connection::options(std::source_location where) const { return link(where).options(); }
Lending Connection::lending(std::source_location where) const { return link(where).group().lending; }
const std::string& Connection::peer_address(std::source_location where) const { return link(where).peer(); }

std::uint64_t Connection::pinned_for_peer(std::source_location where) const { return link(where).pinned_for_peer(); }

Result<void> Connection::progress(std::source_location where) { return link(where).progress(); }

Result<MemoryRegion> Connection::alloc_local_mr(std::size_t size, Access access, AllocateOptions allocate,
                                                std::source_location where) {
    detail::Group& group = link(where).group();
    if (allocate.alignment > 4096 || allocate.huge_pages == HugePages::require) // more than a pool block promises
        return MemoryRegion::allocate(group.pd, size, access, allocate, where);
    return group.pool.allocate(size, access, allocate.zeroed, where);
}

Result<MemoryRegion> Connection::register_local_mr(std::span<std::byte> memory, Access access,
                                                   std::source_location where) {
    return MemoryRegion::register_memory(link(where).group().pd, memory, access, where);
}

Result<void> Connection::send_local_mr(MemoryRegion mr, std::chrono::milliseconds lease, std::source_location where) {
    detail::Link& l = link(where);
    detail::check_lend(mr, l.group().pd, lease, where);
    return l.send_local_mr(std::move(mr), lease);
}

Result<RemoteMr> Connection::receive_remote_mr(Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.receive_remote_mr(l.deadline(timeout));
}

Result<RemoteMr> Connection::request_remote_mr(std::size_t size, Access access, std::chrono::milliseconds lease,
                                               Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.request_remote_mr(size, access, lease, l.deadline(timeout), where);
}

Result<void> Connection::send_remote_mr(const RemoteMr& mr, Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.send_remote_mr(mr, l.deadline(timeout));
}

Result<MemoryRegion> Connection::receive_local_mr(Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.receive_local_mr(l.deadline(timeout));
}

Result<void> Connection::read(const LocalSlice& local, const RemoteMemory& remote, Timeout timeout,
                              std::source_location where) {
    detail::Link& l = link(where);
    return l.one_sided([&](const PostOptions& o) { return post_read(l.qp(), local, remote, o, where); },
                       l.deadline(timeout, local.size()));
}

Result<void> Connection::write(const LocalSlice& local, const RemoteMemory& remote, Timeout timeout,
                               std::source_location where) {
    detail::Link& l = link(where);
    return l.one_sided([&](const PostOptions& o) { return post_write(l.qp(), local, remote, o, where); },
                       l.deadline(timeout, local.size()));
}

Result<void> Connection::write_with_imm(const LocalSlice& local, const RemoteMemory& remote, std::uint32_t imm,
                                        Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    const auto deadline = l.deadline(timeout, local.size());
    if (auto ok = l.wait_user_credit(deadline); !ok)
        return ok;
    bool posted = false;
    auto done = l.one_sided(
        [&](const PostOptions& o) {
            auto ok = post_write_with_imm(l.qp(), local, remote, imm, o, where);
            posted = ok.has_value();
            return ok;
        },
        deadline);
    if (!posted)
        l.give_back_user_credit(); // nothing reached the peer
    return done;
}

Result<void> Connection::compare_swap(const LocalSlice& result, const RemoteMemory& target, std::uint64_t compare,
                                      std::uint64_t swap, Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.one_sided(
        [&](const PostOptions& o) { return post_compare_swap(l.qp(), result, target, compare, swap, o, where); },
        l.deadline(timeout));
}

Result<void> Connection::fetch_add(const LocalSlice& result, const RemoteMemory& target, std::uint64_t add,
                                   Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.one_sided([&](const PostOptions& o) { return post_fetch_add(l.qp(), result, target, add, o, where); },
                       l.deadline(timeout));
}

Result<void> Connection::send(const LocalSlice& message, Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.send(message, std::nullopt, l.deadline(timeout, message.size()));
}

Result<void> Connection::send_with_imm(const LocalSlice& message, std::uint32_t imm, Timeout timeout,
                                       std::source_location where) {
    detail::Link& l = link(where);
    return l.send(message, imm, l.deadline(timeout, message.size()));
}

Result<Received> Connection::receive(std::span<std::byte> into, Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.receive(into, l.deadline(timeout));
}

Result<std::uint32_t> Connection::receive_write_imm(Timeout timeout, std::source_location where) {
    detail::Link& l = link(where);
    return l.receive_write_imm(l.deadline(timeout));
}

// --- Listener ------------------------------------------------------------------

struct Listener::State : detail::ListenerCore {
    Result<void> sleep(Clock::time_point deadline);
};

// Takes every client that knocked, without waiting.
void detail::ListenerCore::admit() {
    for (;;) {
        const auto deadline = deadline_after(options.timeout);
        std::optional<detail::ServerHandshake> handshake;
        if (tcp) {
            if (!accepting())
                return;
            auto stream = tcp->accept(std::chrono::milliseconds(0));
            if (!stream) {
                if (!stream.error().is_timeout()) {
                    logger()->warn("Listener: accept: {}", stream.error());
                    resting_until = Clock::now() + backoff.failed(stream.error().code());
                }
                return;
            }
            backoff.succeeded();
            std::string host = peer_host(stream->peer());
            if (!make_room(host)) {
                ++stats.turned_away; // dropping it closes it
                continue;
            }
            handshake.emplace(std::move(*stream), std::move(host), deadline);
        } else {
            auto request = cm->next(std::chrono::milliseconds(0));
            if (!request) {
                if (request.error().is_timeout())
                    return;
                ++stats.failed;
                refusals.warn(Clock::now(), "Listener: a client's connect request: {}", request.error());
                continue;
            }
            std::string host = peer_host(request->peer());
            if (!make_room(host)) {
                ++stats.turned_away; // dropping it rejects it
                continue;
            }
            auto answered = detail::ServerHandshake::answer(group, std::move(*request), std::move(host), options,
                                                            run_connect, deadline);
            if (!answered) {
                ++stats.failed;
                refusals.warn(Clock::now(), "Listener: a client's handshake failed: {}", answered.error());
                continue;
            }
            handshake.emplace(std::move(*answered));
        }
        shares.add(handshake->host());
        pending.push_back(std::move(*handshake));
    }
}

bool detail::ListenerCore::make_room(const std::string& host) {
    if (pending.size() + ready.size() < options.max_pending_handshakes)
        return true;
    const auto yielding = shares.yielding_to(host);
    if (!yielding)
        return false;
    for (auto it = pending.begin(); it != pending.end(); ++it)
        if (it->host() == *yielding && it->can_go()) {
            ++stats.evicted;
            shares.remove(it->host());
            pending.erase(it); // closes it (TCP) or rejects it (CM); a turn awaited ends
            return true;
        }
    return false; // each of its handshakes is connecting its QP: a second at most
}

// Moves every handshake on as far as it goes; finished ones queue for accept().
void detail::ListenerCore::advance() {
    const auto now = Clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
        auto step = it->advance(group, options, run_connect);
        if (step && *step) {
            ready.push_back(std::move(*step));
        } else if (!step) {
            ++stats.failed;
            refusals.warn(now, "Listener: a client's handshake failed: {}", step.error());
        } else if (now >= it->deadline()) {
            ++stats.timed_out;
            refusals.warn(now, "Listener: {} did not finish its handshake within {} ms", it->peer(),
                          options.timeout.count());
        } else {
            ++it;
            continue;
        }
        shares.remove(it->host());
        it = pending.erase(it);
    }
}

// Sleeps until a client knocks, a handshake can move, a completion arrives, a
// handshake's own deadline passes or `deadline`.
Result<void> Listener::State::sleep(Clock::time_point deadline) {
    if (auto ok = group->cq.arm(); !ok)
        return ok;
    if (auto ok = group->pump(); !ok)
        return ok;
    auto wake = deadline;
    std::vector<pollfd> fds{{.fd = accepting() ? knock_fd() : -1, .events = POLLIN, .revents = 0}, // -1: ignored
                            {.fd = group->cq.channel_fd(), .events = POLLIN, .revents = 0}};
    wanted(fds, wake);
    const int n = ::poll(fds.data(), fds.size(), poll_timeout_until(wake));
    if (n < 0 && errno != EINTR)
        return std::unexpected(Error::from_last_errno("poll", "listener"));
    if (n > 0 && fds[1].revents != 0)
        if (auto taken = group->cq.take_events(); !taken)
            return std::unexpected(std::move(taken.error()));
    return {};
}

Listener::Listener(std::unique_ptr<State> state) : state_(std::move(state)) {}
Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

Result<void> detail::ListenerCore::open(std::string_view host, std::uint16_t port, const ConnectionOptions& o) {
    options = o;
    if (o.transport == Transport::rdma_cm) {
        auto listener = CmListener::listen(host, port, o.backlog);
        if (!listener)
            return std::unexpected(std::move(listener.error()));
        options = detail::on_device_of(*listener, o);
        cm.emplace(std::move(*listener));
    } else {
        auto listener = TcpListener::listen(host, port, o.backlog);
        if (!listener)
            return std::unexpected(std::move(listener.error()));
        tcp.emplace(std::move(*listener));
    }
    auto created = detail::Group::create(options);
    if (!created)
        return std::unexpected(std::move(created.error()));
    group = std::move(*created);
    return {};
}

void detail::ListenerCore::wanted(std::vector<pollfd>& fds, Clock::time_point& wake) const {
    for (const auto& handshake : pending) {
        fds.push_back(handshake.wanted());
        wake = std::min(wake, handshake.deadline());
    }
    if (!accepting())
        wake = std::min(wake, resting_until);
}

std::unique_ptr<detail::Link> detail::ListenerCore::take_ready() {
    if (ready.empty())
        return nullptr;
    auto link = std::move(ready.front());
    ready.pop_front();
    ++stats.accepted;
    return link;
}

ListenerStats detail::ListenerCore::current_stats() const {
    ListenerStats now = stats;
    now.pending = pending.size();
    now.ready = ready.size();
    return now;
}

Result<Listener> Listener::listen(std::string_view host, std::uint16_t port, const ConnectionOptions& options,
                                  std::source_location where) {
    validate(options, where);
    auto state = std::make_unique<State>();
    if (auto ok = state->open(host, port, options); !ok)
        return std::unexpected(std::move(ok.error()));
    return Listener(std::move(state));
}

std::uint16_t Listener::port(std::source_location where) const {
    const State& s = *detail::live(state_, "Listener", where);
    return s.tcp ? s.tcp->port() : s.cm->port();
}

ListenerStats Listener::stats(std::source_location where) const {
    return detail::live(state_, "Listener", where)->current_stats();
}

Result<Connection> Listener::accept(std::chrono::milliseconds timeout, std::source_location where) {
    State& s = *detail::live(state_, "Listener", where);
    const auto deadline = deadline_after(timeout);
    for (;;) {
        // serve the accepted connections, then the clients
        if (auto ok = s.group->pump(); !ok)
            return std::unexpected(std::move(ok.error()));
        s.admit();
        s.advance();
        if (auto link = s.take_ready())
            return Connection(std::move(link));
        if (Clock::now() >= deadline)
            return std::unexpected(Error::timeout("Listener::accept", "no client connected in time"));
        if (auto ok = s.sleep(deadline); !ok)
            return std::unexpected(std::move(ok.error()));
    }
}

} // namespace rdmaxx
