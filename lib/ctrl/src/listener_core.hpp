// What a listener is, apart from how it waits: the socket clients knock on (TCP or
// RDMA CM), the group their connections share, the handshakes running and those
// finished. Listener (connection.cpp) waits with poll(); async::Listener (lib/async)
// awaits the same fds on an io_context. Never waits itself.
//
// Not thread-safe: used from one thread at a time, with its group.
#pragma once

#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <source_location>
#include <string_view>
#include <vector>

#include <poll.h>

#include <rdmaxx/ctrl/cm.hpp>
#include <rdmaxx/ctrl/connection.hpp>
#include <rdmaxx/ctrl/tcp.hpp>
#include <rdmaxx/wrap/log.hpp>

#include "handshake.hpp"
#include "host_shares.hpp"
#include "link.hpp"

namespace rdmaxx::detail {

// Programming error: options out of range (ConnectionOptions), naming `where`.
void check_options(const ConnectionOptions& options, std::source_location where);

struct ListenerCore {
    ConnectionOptions options; // with the device RDMA CM resolved to
    std::optional<TcpListener> tcp;
    std::optional<CmListener> cm;
    std::shared_ptr<Group> group;
    // How the handshakes' QPs connect: the blocking Listener's, each on a thread of its
    // own; async::Listener's, on its io_context's helpers at a peer's turn.
    ConnectRunner run_connect = ConnectOnThread::start;
    std::list<ServerHandshake> pending; // oldest first
    HostShares shares;                  // of `pending`, by their hosts
    std::deque<std::unique_ptr<Link>> ready;
    ListenerStats stats;
    LogBudget refusals; // the warnings about clients: a flood of them logs a few a second
    AcceptBackoff backoff;               // TCP: after accepts that failed for want of resources,
    Clock::time_point resting_until{};   // it accepts again from then on (tcp.hpp)

    // Listens on host:port and makes the group. Options checked by the caller.
    Result<void> open(std::string_view host, std::uint16_t port, const ConnectionOptions& options);
    int knock_fd() const { return tcp ? tcp->fd() : cm->fd(); }
    // Whether admit() takes clients now: a resting TCP listener's knock fd stays ready
    // (its client queued), so it is not waited for meanwhile (wanted() gives the end).
    bool accepting() const { return Clock::now() >= resting_until; }
    // Takes every client that knocked (counting those turned away).
    void admit();
    // Whether a client from `host` may be taken in: a slot is free, or one is made by
    // dropping the oldest handshake that can go of the host that yields (HostShares).
    bool make_room(const std::string& host);
    // Moves every handshake on as far as it goes; finished ones queue in `ready`,
    // failed and late ones are counted and dropped.
    void advance();
    // Adds what the running handshakes wait for, and lowers `wake` to the nearest of
    // their deadlines and the end of a rest.
    void wanted(std::vector<pollfd>& fds, Clock::time_point& wake) const;
    // The oldest finished handshake's link (counted as accepted), or null.
    std::unique_ptr<Link> take_ready();
    ListenerStats current_stats() const;
};

} // namespace rdmaxx::detail
