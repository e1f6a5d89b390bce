// What async::Connection and async::Listener stand on: the blocking Connection's engine
// (lib/ctrl's Link, Group and ListenerCore: one protocol, one implementation) driven
// by an io_context instead of blocking waits.
//
// One LinkDriver per Group (a listener's connections, or a client connection and those
// made with connect_another). It watches, through one epoll fd in the io_context's
// reactor, the group's CQ channel, the device's async events, each link's side channel
// and the listener's fds, plus a timer for the nearest lease end or handshake
// deadline. A device event that leaves a link's QP unable to complete work (QP fatal,
// its port down, the CQ in error, the device fatal) ends that link: its waits end with
// the event's Error. On every wake it takes
// the completions (Group::pump: which also answers MR requests, returns credits,
// expires leases), moves handshakes on, and wakes the coroutines whose condition now
// holds. A live Connection or Listener therefore keeps its io_context's run() going:
// it serves the peer whether or not anyone awaits.
//
// A waiting coroutine parks on a steady_timer set to its deadline; waking it is
// cancelling that timer. Asio cancellation of the awaiting coroutine (an `op || timer`,
// a cancellation slot) ends a wait that has not posted anything with Error::cancelled;
// once a work request is posted, until_completed() ends the connection (QP to error)
// and still waits for the flushed completion before the caller's memory is released.
//
// Not thread-safe: the io_context that runs it is run by one thread.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <poll.h>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <rdmaxx/data/events.hpp>
#include <rdmaxx/wrap/deadline.hpp>

#include "../../ctrl/src/link.hpp"
#include "../../ctrl/src/listener_core.hpp"

namespace rdmaxx::async::detail {

using rdmaxx::detail::Group;
using rdmaxx::detail::Link;
using rdmaxx::detail::ListenerCore;

// A coroutine parked on the driver: woken (its timer cancelled) when ready(state) holds.
struct Waiter {
    bool (*ready)(const void*);
    const void* state;
    asio::steady_timer* timer;
};

class LinkDriver : public std::enable_shared_from_this<LinkDriver> {
public:
    // Watches `group`'s CQ (armed here) on `executor`'s io_context.
    static Result<std::shared_ptr<LinkDriver>> create(const asio::any_io_executor& executor,
                                                      std::shared_ptr<Group> group);
    LinkDriver(const LinkDriver&) = delete;
    LinkDriver& operator=(const LinkDriver&) = delete;
    ~LinkDriver();

    const asio::any_io_executor& executor() const noexcept { return executor_; }
    const std::shared_ptr<Group>& group() const noexcept { return group_; }

    // A connected link to serve (its side channel watched) until remove().
    void add(Link& link);
    void remove(Link& link);
    // The listener whose clients this group's connections are (at most one).
    void serve(ListenerCore* listener);

    // Takes completions and serves the peers now, then wakes whom it concerns. For a
    // step that queued something to send (a request, a goodbye) or reposted a buffer.
    void pump();
    // Wakes the waiters whose condition holds (after a step freed something another
    // waiter wants: an operation slot, say).
    void wake();

    // Until ready() holds, or `link` (when given) breaks (its Error), or the deadline
    // passes (a timeout Error naming `what`), or the awaiting coroutine is cancelled
    // (Error::cancelled).
    template <class Ready>
    asio::awaitable<Result<void>> until(Ready ready, const Link* link, const char* what, Clock::time_point deadline);
    // The wait for a posted work request's completion (done()). When the wait fails
    // first (deadline, cancellation, the link broken), the connection ends (QP to
    // error) and the flushed completion is awaited anyway, within options().timeout
    // and not cancellable: then the NIC no longer touches the caller's memory. Returns
    // the wait's failure in that case; done() says whether the completion came.
    template <class Done>
    asio::awaitable<Result<void>> until_completed(Link& link, Done done, const char* what, Clock::time_point deadline);
    // until_completed()'s second half, once its wait failed (`failure`) before done():
    // ends the connection and awaits the flushed completion. Returns `failure`.
    template <class Done>
    asio::awaitable<Result<void>> drain_flushed(Link& link, Done done, Result<void> failure);

    // A Wait's registration: waiters are woken, and served, in the order they came.
    void enlist(Waiter& waiter) { waiters_.push_back(&waiter); }
    void delist(Waiter& waiter) noexcept { std::erase(waiters_, &waiter); }

private:
    LinkDriver(const asio::any_io_executor& executor, std::shared_ptr<Group> group, int epoll_fd);
    void watch();
    void on_ready();
    // Reads the device's events; fails each link one of them concerns.
    void take_device_events();
    // Brings the epoll set and the timer in line with what is to be watched now.
    void refresh();
    // `force`: registered again even where the same events are (the fd may be new).
    void set_interest(int fd, std::uint32_t events, bool force);

    asio::any_io_executor executor_;
    std::shared_ptr<Group> group_;
    asio::posix::stream_descriptor epoll_;   // owns the epoll fd
    asio::steady_timer timer_;
    std::optional<AsyncEvents> events_; // the group's context's reader (none: not watched)
    bool watching_ = false;
    std::vector<Link*> links_;
    ListenerCore* listener_ = nullptr;
    std::map<int, std::uint32_t> interest_;  // fd -> epoll events registered
    // refresh()'s scratch, kept for its capacity
    struct Wanted {
        int fd;
        std::uint32_t events;   // epoll's
        bool handshake = false; // registered again every time (see refresh())
    };
    std::vector<Wanted> wanted_;
    std::vector<pollfd> handshake_fds_;
    std::vector<Waiter*> waiters_;
};

// One coroutine's wait on the driver, until ready() holds, `link` (when given) breaks,
// the deadline passes or the coroutine is cancelled. until() is a coroutine looping on
// one; a call on the hot path (a one-sided operation) loops on one itself, in its own
// frame: Asio recycles two coroutine frames per thread, and a call whose wait is a
// coroutine nested two deep allocated frames every time. The loop:
//
//     Wait wait(driver, ready, link, what, deadline);
//     for (;;) {
//         const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
//         if (wait.over(state.cancelled()))
//             break;
//         co_await wait.park();
//     }
//     ... wait.outcome() ...
//
// (with asio::this_coro::throw_if_cancelled(false): a cancelled wait is an Error, not an
// exception). Registered while it lives, so that waiters woken together and not all
// served keep their places (credits and slots go to waiters in the order they came);
// delisted however the frame ends (destroyed while suspended, with its io_context too).
template <class Ready>
class Wait {
public:
    Wait(LinkDriver& driver, Ready& ready, const Link* link, const char* what, Clock::time_point deadline)
        : driver_(driver), ready_(ready), link_(link), what_(what), deadline_(deadline), timer_(driver.executor()),
          waiter_{&wanted, this, &timer_} {
        driver_.enlist(waiter_);
    }
    Wait(const Wait&) = delete;
    Wait& operator=(const Wait&) = delete;
    ~Wait() { driver_.delist(waiter_); }

    // Whether the wait is over (outcome() says how), `cancelled` being the awaiting
    // coroutine's cancellation state.
    bool over(asio::cancellation_type_t cancelled) {
        if (ready_())
            return true;
        if (link_ && link_->broken()) {
            outcome_ = std::unexpected(*link_->broken());
            return true;
        }
        if (Clock::now() >= deadline_) {
            outcome_ = std::unexpected(Error::timeout(
                "async::Connection", link_ ? fmt::format("{}: nothing from peer {} in time", what_, link_->peer())
                                           : fmt::format("{}: not in time", what_)));
            return true;
        }
        if (cancelled != asio::cancellation_type::none) {
            outcome_ = std::unexpected(Error::cancelled("async::Connection", what_));
            return true;
        }
        return false;
    }
    // Until woken or the deadline.
    auto park() {
        timer_.expires_at(deadline_);
        return timer_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }
    Result<void>& outcome() noexcept { return outcome_; }

private:
    static bool wanted(const void* self) {
        const auto& w = *static_cast<const Wait*>(self);
        return w.ready_() || (w.link_ && w.link_->broken());
    }

    LinkDriver& driver_;
    Ready& ready_;
    const Link* link_;
    const char* what_;
    Clock::time_point deadline_;
    asio::steady_timer timer_;
    Waiter waiter_;
    Result<void> outcome_{};
};

template <class Ready>
asio::awaitable<Result<void>> LinkDriver::until(Ready ready, const Link* link, const char* what,
                                                Clock::time_point deadline) {
    // a cancelled wait reports Error::cancelled; Asio's default would throw into the caller
    const bool throws = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    Wait<Ready> wait(*this, ready, link, what, deadline);
    for (;;) {
        const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
        if (wait.over(state.cancelled()))
            break;
        (void)co_await wait.park();
    }
    co_await asio::this_coro::throw_if_cancelled(throws);
    co_return std::move(wait.outcome());
}

template <class Done>
asio::awaitable<Result<void>> LinkDriver::until_completed(Link& link, Done done, const char* what,
                                                          Clock::time_point deadline) {
    auto waited = co_await until(done, &link, what, deadline);
    if (waited || done())
        co_return waited;
    co_return co_await drain_flushed(link, done, std::move(waited));
}

template <class Done>
asio::awaitable<Result<void>> LinkDriver::drain_flushed(Link& link, Done done, Result<void> failure) {
    link.abandon(failure.error());
    // the drain below is not cancellable: a second cancellation (reset's default filter
    // lets a terminal one through) would resume the caller while the NIC may still
    // write into its memory
    co_await asio::this_coro::reset_cancellation_state(asio::disable_cancellation());
    auto drained = co_await until(done, nullptr, "draining a flushed work request",
                                  deadline_after(link.options().timeout));
    // the caller's coroutine (the state is its own, awaited inline) may be cancelled again
    co_await asio::this_coro::reset_cancellation_state();
    if (!drained)
        logger()->error("async::Connection: peer {}: a flushed work request did not complete within {} ms: {}",
                        link.peer(), link.options().timeout.count(), drained.error());
    co_return failure;
}

} // namespace rdmaxx::async::detail
