#include "link_driver.hpp"

#include <algorithm>
#include <array>
#include <cerrno>

#include <sys/epoll.h>
#include <unistd.h>

#include <asio/post.hpp>

#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx::async::detail {

Result<std::shared_ptr<LinkDriver>> LinkDriver::create(const asio::any_io_executor& executor,
                                                       std::shared_ptr<Group> group) {
    const int fd = ::epoll_create1(EPOLL_CLOEXEC);
    if (fd < 0)
        return std::unexpected(Error::from_last_errno("epoll_create1", "async::Connection"));
    if (auto armed = group->cq.arm(); !armed)
        return std::unexpected(std::move(armed.error()));
    std::shared_ptr<LinkDriver> driver(new LinkDriver(executor, std::move(group), fd));
    if (auto events = AsyncEvents::open(driver->group_->context); events)
        driver->events_.emplace(std::move(*events));
    else
        logger()->warn("async::Connection: the device's events will not be watched: {}", events.error());
    driver->refresh();
    driver->watch();
    return driver;
}

LinkDriver::LinkDriver(const asio::any_io_executor& executor, std::shared_ptr<Group> group, int epoll_fd)
    : executor_(executor), group_(std::move(group)), epoll_(executor, epoll_fd), timer_(executor) {}

LinkDriver::~LinkDriver() = default; // the descriptor closes the epoll fd; pending waits end aborted

void LinkDriver::add(Link& link) {
    links_.push_back(&link);
    refresh();
}

void LinkDriver::remove(Link& link) {
    std::erase(links_, &link);
    if (const int fd = link.watch_fd(); fd >= 0 && interest_.erase(fd) != 0)
        (void)::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_DEL, fd, nullptr); // before the link closes it
    refresh();
}

void LinkDriver::serve(ListenerCore* listener) {
    listener_ = listener;
    refresh();
}

void LinkDriver::set_interest(int fd, std::uint32_t events, bool force) {
    const auto it = interest_.find(fd);
    if (!force && it != interest_.end() && it->second == events)
        return;
    epoll_event event{.events = events, .data = {.fd = fd}};
    const int epoll_fd = epoll_.native_handle();
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &event) != 0 && errno == ENOENT)
        (void)::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
    interest_[fd] = events;
}

void LinkDriver::refresh() {
    // rebuilt per wake into members that keep their capacity: a steady connection's
    // calls allocate nothing here
    wanted_.clear();
    wanted_.push_back({group_->cq.channel_fd(), EPOLLIN});
    if (events_)
        wanted_.push_back({events_->fd(), EPOLLIN});
    auto wake = Clock::time_point::max();
    for (const Link* link : links_) {
        if (link->watch_fd() >= 0 && !link->broken())
            wanted_.push_back({link->watch_fd(), EPOLLIN});
        if (const auto expiry = link->next_expiry())
            wake = std::min(wake, *expiry);
    }
    if (listener_) {
        if (listener_->accepting())
            wanted_.push_back({listener_->knock_fd(), EPOLLIN});
        handshake_fds_.clear();
        listener_->wanted(handshake_fds_, wake);
        // a handshake's fd closes with it when it fails, and its number may come back
        // as the next client's: registered again every time (handshakes are few and short)
        for (const pollfd& p : handshake_fds_)
            wanted_.push_back({p.fd, (p.events & POLLOUT) ? std::uint32_t{EPOLLOUT} : std::uint32_t{EPOLLIN}, true});
    }
    const auto by_fd = [](const Wanted& a, const Wanted& b) { return a.fd < b.fd; };
    std::sort(wanted_.begin(), wanted_.end(), by_fd); // distinct fds (std::stable_sort would allocate)
    const auto wants = [&](int fd) { return std::binary_search(wanted_.begin(), wanted_.end(), Wanted{fd, 0}, by_fd); };
    for (auto it = interest_.begin(); it != interest_.end();) {
        if (!wants(it->first)) {
            (void)::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_DEL, it->first, nullptr); // may be closed already
            it = interest_.erase(it);
        } else {
            ++it;
        }
    }
    for (const Wanted& w : wanted_)
        set_interest(w.fd, w.events, w.handshake);
    if (wake != Clock::time_point::max() && wake != timer_.expiry()) {
        timer_.expires_at(wake);
        timer_.async_wait([weak = weak_from_this()](std::error_code ec) {
            if (auto self = weak.lock(); self && !ec)
                self->on_ready();
        });
    }
}

void LinkDriver::watch() {
    if (watching_)
        return;
    watching_ = true;
    // The reactor sees the epoll fd edge-triggered: an fd still ready in it (level-
    // triggered) would make no new edge, so look before sleeping.
    epoll_event probe;
    if (::epoll_wait(epoll_.native_handle(), &probe, 1, 0) > 0) {
        asio::post(executor_, [weak = weak_from_this()] {
            if (auto self = weak.lock()) {
                self->watching_ = false;
                self->on_ready();
            }
        });
        return;
    }
    epoll_.async_wait(asio::posix::stream_descriptor::wait_read, [weak = weak_from_this()](std::error_code ec) {
        auto self = weak.lock();
        if (!self || ec == asio::error::operation_aborted)
            return;
        self->watching_ = false;
        self->on_ready();
    });
}

void LinkDriver::on_ready() {
    std::array<epoll_event, 64> events;
    for (;;) {
        const int n = ::epoll_wait(epoll_.native_handle(), events.data(), static_cast<int>(events.size()), 0);
        if (n <= 0)
            break;
        for (int i = 0; i < n; ++i) {
            const int fd = events[static_cast<std::size_t>(i)].data.fd;
            if (fd == group_->cq.channel_fd()) {
                if (auto taken = group_->cq.take_events(); !taken)
                    logger()->error("async::Connection: the CQ's events: {}", taken.error());
                if (auto armed = group_->cq.arm(); !armed)
                    logger()->error("async::Connection: arming the CQ: {}", armed.error());
                continue;
            }
            if (events_ && fd == events_->fd()) {
                take_device_events();
                continue;
            }
            for (Link* link : links_)
                if (link->watch_fd() == fd)
                    link->check_peer_alive();
        }
        if (n < static_cast<int>(events.size()))
            break;
    }
    pump();
    if (listener_) {
        listener_->admit();
        listener_->advance();
        wake();
    }
    refresh();
    watch();
}

void LinkDriver::take_device_events() {
    for (Link* link : links_)
        if (auto ok = events_->check(&link->qp(), &group_->cq); !ok && !link->broken()) {
            logger()->warn("async::Connection: peer {}: {}", link->peer(), ok.error());
            link->fail(ok.error());
        }
    // check() read them all (and keeps them for next()); nobody else takes them here
    for (auto event = events_->next(); event && *event; event = events_->next()) {
    }
}

void LinkDriver::pump() {
    if (auto ok = group_->pump(); !ok)
        for (Link* link : links_) // a CQ that cannot be polled ends every connection on it
            link->fail(ok.error());
    wake();
}

void LinkDriver::wake() {
    for (Waiter* waiter : waiters_)
        if (waiter->ready(waiter->state))
            waiter->timer->cancel();
}

} // namespace rdmaxx::async::detail
