// async::Connection and async::Listener: each call is the blocking Connection's steps
// (lib/ctrl's Link) with co_await where that one blocks. The member functions check
// their arguments and copy what the call needs (the shared Peer) before they return
// the coroutine, so a Connection moved or destroyed while a call waits leaves the call
// on its own copy.
#include <rdmaxx/async/connection.hpp>

#include <condition_variable>
#include <functional>
#include <mutex>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <rdmaxx/async/blocking.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>

#include "../../ctrl/src/handshake.hpp"
#include "exchange.hpp"
#include "link_driver.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine that makes a shared_ptr (a false positive:
// the frame's allocator pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::async {
namespace detail {

// One connection: its Link, and the driver of its group. Shared by the Connection and
// the calls in flight on it.
struct Peer {
    std::shared_ptr<LinkDriver> driver;
    std::unique_ptr<Link> link;

    Peer(std::shared_ptr<LinkDriver> d, std::unique_ptr<Link> l) : driver(std::move(d)), link(std::move(l)) {
        driver->add(*link);
    }
    Peer(const Peer&) = delete;
    Peer& operator=(const Peer&) = delete;
    ~Peer() {
        driver->remove(*link);
        link.reset(); // closed already, unless the io_context went first (then it closes blocking)
        driver->wake();
    }
};

// async::Listener's connects (rdmaxx::detail::BackgroundConnect): each on a helper of
// the io_context (run_blocking) at a peer's turn (PeerTurn, in the lane of the client's
// host). However many clients announce addresses nobody answers for, their connects
// take two helper threads at most, shared with every endpoint and listener on the
// io_context, and one host's clients delay another host's by a turn at most.
class ConnectOnHelpers final : public rdmaxx::detail::BackgroundConnect {
public:
    // Errors: no eventfd (its errno).
    static Result<std::unique_ptr<BackgroundConnect>> start(const asio::any_io_executor& executor,
                                                            std::function<Result<void>()> connect,
                                                            const std::string& peer, Clock::time_point deadline);
    // Ends its wait for a turn, or waits for its connect under way on a helper (at most
    // a second: the connect touches the handshake's QP).
    ~ConnectOnHelpers() override;
    // From its turn on (the helper may be about to run it).
    bool under_way() const override { return shared_->turn_taken; }

private:
    // Shared with the coroutine that runs the connect, which may outlive this.
    struct Shared {
        std::function<Result<void>()> connect;
        PeerTurn* waiting = nullptr; // the coroutine's turn, while it waits for it
        bool turn_taken = false;     // set on the io_context's thread, as `waiting`
        std::mutex mutex;            // for owner and running: the helper reads them too
        std::condition_variable returned;
        ConnectOnHelpers* owner = nullptr; // null once destroyed: no connect, no result
        bool running = false;              // the connect is on a helper now
    };
    ConnectOnHelpers() = default;
    static asio::awaitable<void> run(std::shared_ptr<Shared> shared, std::string peer, Clock::time_point deadline);
    std::shared_ptr<Shared> shared_;
};

Result<std::unique_ptr<rdmaxx::detail::BackgroundConnect>>
ConnectOnHelpers::start(const asio::any_io_executor& executor, std::function<Result<void>()> connect,
                        const std::string& peer, Clock::time_point deadline) {
    std::unique_ptr<ConnectOnHelpers> on(new ConnectOnHelpers);
    if (auto ok = on->open(); !ok)
        return std::unexpected(std::move(ok.error()));
    on->shared_ = std::make_shared<Shared>();
    on->shared_->connect = std::move(connect);
    on->shared_->owner = on.get();
    asio::co_spawn(executor, run(on->shared_, peer, deadline), asio::detached);
    return on;
}

ConnectOnHelpers::~ConnectOnHelpers() {
    if (shared_->waiting != nullptr)
        shared_->waiting->cancel();
    std::unique_lock lock(shared_->mutex);
    shared_->owner = nullptr;
    shared_->returned.wait(lock, [this] { return !shared_->running; });
}

asio::awaitable<void> ConnectOnHelpers::run(std::shared_ptr<Shared> shared, std::string peer,
                                            Clock::time_point deadline) {
    {
        const std::lock_guard lock(shared->mutex);
        if (shared->owner == nullptr) // dropped before this began: no turn to wait for
            co_return;
    }
    PeerTurn turn;
    shared->waiting = &turn;
    struct Unlist { // however the wait ends, its frame destroyed with the io_context's too
        Shared& shared;
        ~Unlist() { shared.waiting = nullptr; }
    } unlist{*shared};
    const std::string lane = rdmaxx::peer_host(peer);
    const bool taken = co_await turn.take(deadline, lane);
    shared->waiting = nullptr;
    shared->turn_taken = taken;
    {
        const std::lock_guard lock(shared->mutex);
        if (shared->owner == nullptr)
            co_return;
        if (!taken) {
            shared->owner->done(std::unexpected(Error::timeout(
                "async::Listener", fmt::format("{}: no helper thread was free for its QP's connect before the "
                                               "handshake's deadline",
                                               peer))));
            co_return;
        }
    }
    auto call = [s = shared.get()]() -> Result<void> {
        {
            const std::lock_guard lock(s->mutex);
            if (s->owner == nullptr)
                return {};
            s->running = true;
        }
        Result<void> result = s->connect();
        const std::lock_guard lock(s->mutex);
        if (s->owner != nullptr)
            s->owner->done(std::move(result));
        s->running = false;
        s->returned.notify_all();
        return {};
    };
    // the turn is held until the call returns; the call reports its own result
    auto handed = co_await run_blocking(call, "async::Listener");
    const std::lock_guard lock(shared->mutex);
    if (!handed && shared->owner != nullptr) // the call never ran (no memory to hand it over)
        shared->owner->done(std::move(handed));
}

struct ListenerState {
    ListenerCore core;
    std::shared_ptr<LinkDriver> driver;

    ListenerState() = default;
    ListenerState(const ListenerState&) = delete;
    ListenerState& operator=(const ListenerState&) = delete;
    ~ListenerState() {
        if (driver)
            driver->serve(nullptr);
    }
};

} // namespace detail

namespace {

using detail::Link;
using detail::LinkDriver;
using detail::Wait;
using detail::Peer;
using PeerPtr = std::shared_ptr<Peer>;

asio::awaitable<Result<Connection>> connect_on(std::shared_ptr<LinkDriver> driver, std::string host, std::uint16_t port,
                                               ConnectionOptions options, Connection (*make)(PeerPtr)) {
    const auto deadline = deadline_after(options.timeout);
    auto link = Link::create(driver->group(), options);
    if (!link)
        co_return std::unexpected(std::move(link.error()));
    Link& l = **link;
    const EndpointMessage ours = l.describe();
    std::vector<rdmaxx::QueuePair*> qps(1, &l.qp()); // not a braced list: g++ 12 fails on one in a co_await
    auto exchanged = co_await detail::connect_verbs(driver->executor(), host, port, std::move(qps),
                                                    {.timeout = options.timeout, .connect = options.qp,
                                                     .metadata = ours.metadata});
    if (!exchanged)
        co_return std::unexpected(std::move(exchanged.error()));
    if (auto ok = l.start(exchanged->peer); !ok)
        co_return std::unexpected(std::move(ok.error()));
    const auto left = std::max(std::chrono::milliseconds(1),
                               std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
    if (auto ok = co_await confirm_ready(exchanged->socket, left); !ok)
        co_return std::unexpected(std::move(ok.error()));
    std::string name = detail::peer_name(exchanged->socket);
    std::error_code ec;
    const int fd = exchanged->socket.release(ec);
    if (ec)
        co_return std::unexpected(Error::from_errno("async::Connection::connect", ec.value(), "taking the socket"));
    l.watch(TcpStream::adopt(fd, std::move(name)));
    co_return make(std::make_shared<Peer>(std::move(driver), std::move(*link)));
}

// RDMA CM's active side waits in librdmacm (address and route resolution, the connect
// request's answer, getaddrinfo before them): those waits run on the io_context's
// helper threads (blocking.hpp), never on its own. What touches the group (an
// attempt's link: the CQ entries it holds, the CQ it may grow) runs on the io_context's
// thread, which polls the group's CQ for its other links meanwhile.
//
// `driver` null: a new group, and its driver on `executor`.
asio::awaitable<Result<Connection>> connect_cm_on(asio::any_io_executor executor, std::shared_ptr<LinkDriver> driver,
                                                  std::string host, std::uint16_t port, ConnectionOptions options,
                                                  Connection (*make)(PeerPtr)) {
    const auto deadline = deadline_after(options.timeout);
    std::shared_ptr<detail::Group> group; // not a ?: inside the co_await: g++ 12 miscompiles that
    if (driver)
        group = driver->group();
    rdmaxx::detail::CmAttempts attempts(std::move(group), std::move(host), port, options, deadline);
    auto wait = [&attempts] { return attempts.step(); };
    while (attempts.next() != rdmaxx::detail::CmAttempts::Step::offered) {
        Result<void> ok;
        if (attempts.waits())
            ok = co_await run_blocking(wait, "async::Connection::connect");
        else
            ok = attempts.step(); // make_link: the group's, on its thread
        if (!ok)
            co_return std::unexpected(std::move(ok.error()));
    }
    rdmaxx::detail::CmOffered offered = std::move(attempts).offered();
    if (!driver) {
        auto created = LinkDriver::create(executor, offered.link->shared_group());
        if (!created)
            co_return std::unexpected(std::move(created.error()));
        driver = std::move(*created);
    }
    if (auto ok = rdmaxx::detail::finish_cm(offered); !ok)
        co_return std::unexpected(std::move(ok.error()));
    co_return make(std::make_shared<Peer>(std::move(driver), std::move(offered.link)));
}

asio::awaitable<Result<void>> close_on(PeerPtr p, Timeout timeout) {
    Link& l = *p->link;
    if (l.closed())
        co_return Result<void>{};
    Result<void> done{};
    const auto deadline = l.deadline(timeout);
    if (l.begin_close()) {
        p->driver->pump();
        done = co_await p->driver->until([&] { return l.goodbye_done(); }, &l, "close: sending what is queued",
                                         deadline);
    }
    l.end_close();
    p->driver->wake(); // the calls still waiting see it closed
    co_return done;
}

// A destroyed Connection's goodbye, sent while the io_context runs.
asio::awaitable<void> close_in_background(PeerPtr p) {
    if (auto ok = co_await close_on(p, std::nullopt); !ok && !ok.error().is_cancelled())
        logger()->warn("async::Connection: closing the connection to {}: {}", p->link->peer(), ok.error());
}

// A one-sided operation (or write_with_imm, whose room includes a credit): room
// awaited, posted, its completion awaited, its slot freed. Its own frame is the only
// coroutine of a call that finds room and completes (the waits are loops here, not
// nested coroutines: Asio recycles two frames per thread, and a deeper call allocated
// its frames every time).
template <class Room, class Post>
asio::awaitable<Result<void>> one_sided(PeerPtr p, Room room, Post post, const char* waiting, Clock::time_point deadline) {
    Link& l = *p->link;
    // a cancelled wait reports Error::cancelled; Asio's default would throw into the caller
    co_await asio::this_coro::throw_if_cancelled(false);
    if (!room())
        if (auto ok = co_await p->driver->until(room, &l, waiting, deadline); !ok)
            co_return ok;
    auto op = l.post_op(post);
    if (!op)
        co_return std::unexpected(std::move(op.error()));
    auto done = [&l, slot = *op] { return l.op_done(slot); };
    Result<void> waited;
    {
        Wait<decltype(done)> wait(*p->driver, done, &l, "a one-sided operation", deadline);
        for (;;) {
            const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
            if (wait.over(state.cancelled()))
                break;
            (void)co_await wait.park();
        }
        waited = std::move(wait.outcome());
    }
    if (!waited && !done())
        waited = co_await p->driver->drain_flushed(l, done, std::move(waited));
    if (!done())
        co_return waited; // its slot stays taken: the NIC may still complete it
    auto result = l.take_op(*op);
    p->driver->wake(); // a slot is free
    if (!waited)
        co_return waited;
    co_return result;
}

// one_sided()'s room for a one-sided operation
auto op_room(Link& l) {
    return [&l] { return l.can_post_op(); };
}

asio::awaitable<Result<void>> send_on(PeerPtr p, LocalSlice message, std::optional<std::uint32_t> imm,
                                      Clock::time_point deadline) {
    Link& l = *p->link;
    if (auto ok = l.check_sendable(message); !ok)
        co_return ok;
    if (auto ok = co_await p->driver->until([&] { return l.can_send(); }, &l, "send: waiting for a credit", deadline);
        !ok)
        co_return ok;
    auto slot = l.post_user_message(message, imm);
    if (!slot)
        co_return std::unexpected(std::move(slot.error()));
    auto sent = [&] { return l.sent(*slot); };
    auto waited = co_await p->driver->until_completed(l, sent, "send: waiting for its completion", deadline);
    if (!waited)
        co_return waited;
    co_return l.send_result(*slot);
}

asio::awaitable<Result<Received>> receive_on(PeerPtr p, std::span<std::byte> into, Clock::time_point deadline) {
    Link& l = *p->link;
    if (auto ok = co_await p->driver->until([&] { return l.has_message(); }, &l, "receive", deadline); !ok)
        co_return std::unexpected(std::move(ok.error()));
    co_return l.take_message(into);
}

asio::awaitable<Result<std::uint32_t>> receive_write_imm_on(PeerPtr p, Clock::time_point deadline) {
    Link& l = *p->link;
    if (auto ok = co_await p->driver->until([&] { return l.has_write_imm(); }, &l, "receive_write_imm", deadline); !ok)
        co_return std::unexpected(std::move(ok.error()));
    co_return l.take_write_imm();
}

asio::awaitable<Result<void>> send_local_mr_on(PeerPtr p, MemoryRegion mr, std::chrono::milliseconds lease) {
    Link& l = *p->link;
    if (auto ok = co_await p->driver->until([&] { return l.can_lend(mr); }, &l, "send_local_mr: a window bind",
                                            l.deadline(std::nullopt));
        !ok)
        co_return ok;
    auto lent = l.lend(std::move(mr), lease);
    p->driver->pump();
    co_return lent;
}

asio::awaitable<Result<RemoteMr>> receive_remote_mr_on(PeerPtr p, Clock::time_point deadline) {
    Link& l = *p->link;
    if (auto ok = co_await p->driver->until([&] { return l.has_lent_to_us(); }, &l, "receive_remote_mr", deadline);
        !ok)
        co_return std::unexpected(std::move(ok.error()));
    co_return l.take_lent_to_us();
}

asio::awaitable<Result<RemoteMr>> request_remote_mr_on(PeerPtr p, std::size_t size, Access access,
                                                       std::chrono::milliseconds lease, Clock::time_point deadline,
                                                       std::source_location where) {
    Link& l = *p->link;
    if (l.broken())
        co_return std::unexpected(*l.broken());
    const std::uint64_t request = l.ask_for_region(size, access, lease, where);
    p->driver->pump(); // sends it
    if (auto ok = co_await p->driver->until([&] { return l.answered(request); }, &l, "request_remote_mr", deadline);
        !ok)
        co_return std::unexpected(std::move(ok.error()));
    co_return l.take_answer(request);
}

asio::awaitable<Result<void>> send_remote_mr_on(PeerPtr p, RemoteMr mr, Clock::time_point deadline) {
    Link& l = *p->link;
    if (l.broken())
        co_return std::unexpected(*l.broken());
    l.give_back(mr.token);
    p->driver->pump();
    if (auto ok = co_await p->driver->until([&] { return l.return_answered(mr.token); }, &l, "send_remote_mr",
                                            deadline);
        !ok)
        co_return ok;
    co_return l.take_return_answer(mr.token);
}

asio::awaitable<Result<MemoryRegion>> receive_local_mr_on(PeerPtr p, Clock::time_point deadline) {
    Link& l = *p->link;
    if (auto ok = co_await p->driver->until([&] { return l.has_returned(); }, &l, "receive_local_mr", deadline); !ok)
        co_return std::unexpected(std::move(ok.error()));
    co_return l.take_returned();
}

asio::awaitable<Result<Connection>> accept_on(std::shared_ptr<detail::ListenerState> s, Clock::time_point deadline,
                                              Connection (*make)(PeerPtr)) {
    auto ready = [&] { return !s->core.ready.empty(); };
    if (auto ok = co_await s->driver->until(ready, nullptr, "Listener::accept: no client connected", deadline); !ok)
        co_return std::unexpected(std::move(ok.error()));
    co_return make(std::make_shared<Peer>(s->driver, s->core.take_ready()));
}

} // namespace

// --- Connection ----------------------------------------------------------------------

Connection::Connection(std::shared_ptr<detail::Peer> peer) : peer_(std::move(peer)) {}
Connection::Connection(Connection&&) noexcept = default;
Connection& Connection::operator=(Connection&& other) noexcept {
    Connection gone(std::move(*this)); // ends as the destructor says
    peer_ = std::move(other.peer_);
    return *this;
}

Connection::~Connection() {
    if (!peer_)
        return;
    Link& l = *peer_->link;
    if (peer_.use_count() > 1 && !l.broken()) // calls in flight: they complete with their flushes
        l.abandon(Error::from_errno("async::Connection", ECONNABORTED, "the Connection was destroyed"));
    if (!l.closed()) {
        const auto executor = peer_->driver->executor();
        asio::co_spawn(executor, close_in_background(std::move(peer_)), asio::detached);
    }
}

detail::Peer& Connection::peer(std::source_location where) const {
    return *rdmaxx::detail::live(peer_, "async::Connection", where);
}

asio::awaitable<Result<Connection>> Connection::connect(asio::any_io_executor executor, std::string host,
                                                        std::uint16_t port, ConnectionOptions options,
                                                        std::source_location where) {
    rdmaxx::detail::check_options(options, where);
    if (options.transport == Transport::rdma_cm)
        co_return co_await connect_cm_on(executor, nullptr, std::move(host), port, std::move(options),
                                         [](PeerPtr p) { return Connection(std::move(p)); });
    auto group = detail::Group::create(options);
    if (!group)
        co_return std::unexpected(std::move(group.error()));
    auto driver = LinkDriver::create(executor, std::move(*group));
    if (!driver)
        co_return std::unexpected(std::move(driver.error()));
    co_return co_await connect_on(std::move(*driver), std::move(host), port, std::move(options),
                                  [](PeerPtr p) { return Connection(std::move(p)); });
}

asio::awaitable<Result<Connection>> Connection::connect_another(std::string host, std::uint16_t port,
                                                                Timeout timeout, std::source_location where) {
    detail::Peer& p = peer(where);
    ConnectionOptions options = p.link->options();
    if (timeout)
        options.timeout = *timeout;
    rdmaxx::detail::check_options(options, where);
    if (options.transport == Transport::rdma_cm)
        return connect_cm_on(p.driver->executor(), p.driver, std::move(host), port, std::move(options),
                             [](PeerPtr q) { return Connection(std::move(q)); });
    return connect_on(p.driver, std::move(host), port, std::move(options),
                      [](PeerPtr q) { return Connection(std::move(q)); });
}

asio::awaitable<Result<void>> Connection::close(Timeout timeout, std::source_location where) {
    (void)peer(where);
    return close_on(peer_, timeout);
}

Result<MemoryRegion> Connection::alloc_local_mr(std::size_t size, Access access, AllocateOptions allocate,
                                                std::source_location where) {
    detail::Group& group = *peer(where).driver->group();
    if (allocate.alignment > 4096 || allocate.huge_pages == HugePages::require) // more than a pool block promises
        return MemoryRegion::allocate(group.pd, size, access, allocate, where);
    return group.pool.allocate(size, access, allocate.zeroed, where);
}

Result<MemoryRegion> Connection::register_local_mr(std::span<std::byte> memory, Access access,
                                                   std::source_location where) {
    return MemoryRegion::register_memory(peer(where).driver->group()->pd, memory, access, where);
}

asio::awaitable<Result<void>> Connection::send_local_mr(MemoryRegion mr, std::chrono::milliseconds lease,
                                                        std::source_location where) {
    detail::Peer& p = peer(where);
    rdmaxx::detail::check_lend(mr, p.driver->group()->pd, lease, where);
    return send_local_mr_on(peer_, std::move(mr), lease);
}

asio::awaitable<Result<RemoteMr>> Connection::receive_remote_mr(Timeout timeout, std::source_location where) {
    detail::Peer& p = peer(where);
    return receive_remote_mr_on(peer_, p.link->deadline(timeout));
}

asio::awaitable<Result<RemoteMr>> Connection::request_remote_mr(std::size_t size, Access access,
                                                                std::chrono::milliseconds lease, Timeout timeout,
                                                                std::source_location where) {
    detail::Peer& p = peer(where);
    return request_remote_mr_on(peer_, size, access, lease, p.link->deadline(timeout), where);
}

asio::awaitable<Result<void>> Connection::send_remote_mr(RemoteMr mr, Timeout timeout, std::source_location where) {
    detail::Peer& p = peer(where);
    return send_remote_mr_on(peer_, mr, p.link->deadline(timeout));
}

asio::awaitable<Result<MemoryRegion>> Connection::receive_local_mr(Timeout timeout, std::source_location where) {
    detail::Peer& p = peer(where);
    return receive_local_mr_on(peer_, p.link->deadline(timeout));
}

asio::awaitable<Result<void>> Connection::read(LocalSlice local, RemoteMemory remote, Timeout timeout,
                                               std::source_location where) {
    Link& l = *peer(where).link;
    return one_sided(
        peer_, op_room(l),
        [&l, local, remote, where](const PostOptions& o) { return post_read(l.qp(), local, remote, o, where); },
        "read: waiting for room", l.deadline(timeout, local.size()));
}

asio::awaitable<Result<void>> Connection::write(LocalSlice local, RemoteMemory remote, Timeout timeout,
                                                std::source_location where) {
    Link& l = *peer(where).link;
    return one_sided(
        peer_, op_room(l),
        [&l, local, remote, where](const PostOptions& o) { return post_write(l.qp(), local, remote, o, where); },
        "write: waiting for room", l.deadline(timeout, local.size()));
}

asio::awaitable<Result<void>> Connection::write_with_imm(LocalSlice local, RemoteMemory remote, std::uint32_t imm,
                                                         Timeout timeout, std::source_location where) {
    Link& l = *peer(where).link;
    // the peer's receive it consumes is a credit: taken for the post, given back if it fails
    return one_sided(
        peer_, [&l] { return l.can_take_user_credit() && l.can_post_op(); },
        [&l, local, remote, imm, where](const PostOptions& o) {
            l.take_user_credit();
            auto posted = post_write_with_imm(l.qp(), local, remote, imm, o, where);
            if (!posted)
                l.give_back_user_credit(); // nothing reached the peer
            return posted;
        },
        "write_with_imm: waiting for a credit", l.deadline(timeout, local.size()));
}

asio::awaitable<Result<void>> Connection::compare_swap(LocalSlice result, RemoteMemory target, std::uint64_t compare,
                                                       std::uint64_t swap, Timeout timeout,
                                                       std::source_location where) {
    Link& l = *peer(where).link;
    return one_sided(
        peer_, op_room(l),
        [&l, result, target, compare, swap, where](const PostOptions& o) {
            return post_compare_swap(l.qp(), result, target, compare, swap, o, where);
        },
        "compare_swap: waiting for room", l.deadline(timeout));
}

asio::awaitable<Result<void>> Connection::fetch_add(LocalSlice result, RemoteMemory target, std::uint64_t add,
                                                    Timeout timeout, std::source_location where) {
    Link& l = *peer(where).link;
    return one_sided(
        peer_, op_room(l),
        [&l, result, target, add, where](const PostOptions& o) {
            return post_fetch_add(l.qp(), result, target, add, o, where);
        },
        "fetch_add: waiting for room", l.deadline(timeout));
}

asio::awaitable<Result<void>> Connection::send(LocalSlice message, Timeout timeout, std::source_location where) {
    Link& l = *peer(where).link;
    return send_on(peer_, message, std::nullopt, l.deadline(timeout, message.size()));
}

asio::awaitable<Result<void>> Connection::send_with_imm(LocalSlice message, std::uint32_t imm, Timeout timeout,
                                                        std::source_location where) {
    Link& l = *peer(where).link;
    return send_on(peer_, message, imm, l.deadline(timeout, message.size()));
}

asio::awaitable<Result<Received>> Connection::receive(std::span<std::byte> into, Timeout timeout,
                                                      std::source_location where) {
    Link& l = *peer(where).link;
    return receive_on(peer_, into, l.deadline(timeout));
}

asio::awaitable<Result<std::uint32_t>> Connection::receive_write_imm(Timeout timeout, std::source_location where) {
    Link& l = *peer(where).link;
    return receive_write_imm_on(peer_, l.deadline(timeout));
}

std::uint64_t Connection::pinned_for_peer(
                                          std::source_location where) const { return peer(where).link->pinned_for_peer(); }
Lending Connection::lending(std::source_location where) const { return peer(where).driver->group()->lending; }
const rdmaxx::QueuePair& Connection::queue_pair(std::source_location where) const { return peer(where).link->qp(); }
const ConnectionOptions& Connection::options(std::source_location where) const { return peer(where).link->options(); }
const std::string& Connection::peer_address(std::source_location where) const { return peer(where).link->peer(); }

// --- Listener ------------------------------------------------------------------------

Listener::Listener(std::shared_ptr<detail::ListenerState> state) : state_(std::move(state)) {}
Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

Result<Listener> Listener::listen(asio::any_io_executor executor, std::string_view host, std::uint16_t port,
                                  const ConnectionOptions& options, std::source_location where) {
    rdmaxx::detail::check_options(options, where);
    auto state = std::make_shared<detail::ListenerState>();
    state->core.run_connect = [executor](std::function<Result<void>()> connect, const std::string& peer,
                                         Clock::time_point deadline) {
        return detail::ConnectOnHelpers::start(executor, std::move(connect), peer, deadline);
    };
    if (auto ok = state->core.open(host, port, options); !ok)
        return std::unexpected(std::move(ok.error()));
    auto driver = LinkDriver::create(executor, state->core.group);
    if (!driver)
        return std::unexpected(std::move(driver.error()));
    state->driver = std::move(*driver);
    state->driver->serve(&state->core);
    return Listener(std::move(state));
}

std::uint16_t Listener::port(std::source_location where) const {
    const auto& core = rdmaxx::detail::live(state_, "async::Listener", where)->core;
    return core.tcp ? core.tcp->port() : core.cm->port();
}

ListenerStats Listener::stats(std::source_location where) const {
    return rdmaxx::detail::live(state_, "async::Listener", where)->core.current_stats();
}

asio::awaitable<Result<Connection>> Listener::accept(std::chrono::milliseconds timeout, std::source_location where) {
    (void)rdmaxx::detail::live(state_, "async::Listener", where);
    return accept_on(state_, deadline_after(timeout), [](PeerPtr p) { return Connection(std::move(p)); });
}

} // namespace rdmaxx::async
