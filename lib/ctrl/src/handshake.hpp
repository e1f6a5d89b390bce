// How a Link gets connected. The client side runs one handshake and may wait; the
// server side runs many at once: each ServerHandshake is a non-blocking state machine
// with a deadline of its own, advanced by the Listener when its fd is ready, so no
// silent or slow client holds up another.
//
//   TCP client: endpoint message out, the server's in, QP connected, receives posted,
//               ready byte out, ready byte in.
//   TCP server: the client's endpoint message in (exactly one RC QP and the 8 bytes of
//               limits: anything else is refused before a QP exists), QP created and
//               connected (off the listener's thread: BackgroundConnect), receives
//               posted, our message and ready byte out, the client's ready byte in.
//   RDMA CM:    connect request with the client's endpoint as private data, QP created
//               and connected (off the listener's thread), the server's endpoint in the
//               answer, then establish (connection.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <poll.h>

#include <rdmaxx/ctrl/cm.hpp>
#include <rdmaxx/ctrl/connection.hpp>
#include <rdmaxx/ctrl/tcp.hpp>

#include "link.hpp"

namespace rdmaxx::detail {

// Client side. `group` may be shared with other connections (TCP: any; RDMA CM: it
// must be on the device the address resolves to); null makes a new one.
Result<std::unique_ptr<Link>> connect_tcp(std::shared_ptr<Group> group, std::string_view host, std::uint16_t port,
                                          const ConnectionOptions& options, Clock::time_point deadline);
// A connect request that gets no answer (the server's backlog dropped it) is sent
// again, with a new CM id, until the deadline.
Result<std::unique_ptr<Link>> connect_cm(std::shared_ptr<Group> group, std::string_view host, std::uint16_t port,
                                         const ConnectionOptions& options, Clock::time_point deadline);

// connect_cm step by step, so that its waits may run on a thread of their own while
// the group's thread goes on with the group's other links (lib/async):
//   do { resolve [waits]; make_link [the group's thread]; } until connect [waits];
//   std::move(attempts).offered(), then finish_cm() [the group's thread].
// The waits touch nothing of the group: make_link and the destructor (an attempt's
// link holds CQ entries of the group, whose CQ may grow or be polled for them) do.
// The loop, either way:
//   while (attempts.next() != CmAttempts::Step::offered)
//       run attempts.step(): here, or on a thread when next() waits()
struct CmOffered {
    std::unique_ptr<Link> link; // connected QP, not started
    std::optional<CmConnection> cm;
    EndpointMessage peer;
};
class CmAttempts {
public:
    enum class Step : std::uint8_t {
        resolve,   // waits: a new CM id, its address and route resolved (an attempt's)
        make_link, // the attempt's link, a new QP (the server's CM may still hold the
                   // last one's request: ib_cm refuses a QP number it is already
                   // connecting); the last attempt's goes
        connect,   // waits: the connect request's answer; none within the attempt's
                   // time (the server's backlog may have dropped it): resolve again,
                   // each attempt waiting twice as long as the one before, until the
                   // deadline
        offered,   // connected: offered() is next
    };

    // `group` null: a new one, on the device the address resolves to.
    CmAttempts(std::shared_ptr<Group> group, std::string host, std::uint16_t port, ConnectionOptions options,
               Clock::time_point deadline);
    Step next() const noexcept { return next_; }
    // Whether next() blocks (resolve, connect): it may run on another thread.
    bool waits() const noexcept { return next_ == Step::resolve || next_ == Step::connect; }
    // Runs next() and moves on; an Error ends the attempts.
    Result<void> step();
    // Once next() is offered.
    CmOffered offered() &&;

private:
    Result<void> resolve();
    Result<void> make_link();
    Result<bool> connect(); // false: no answer in time, ask again

    std::shared_ptr<Group> group_;
    std::string host_;
    std::uint16_t port_;
    ConnectionOptions options_;
    ConnectionOptions on_device_; // options_, on the device resolve() found
    Clock::time_point deadline_;
    std::chrono::milliseconds attempt_;
    Step next_ = Step::resolve;
    std::optional<CmConnection> cm_;
    std::unique_ptr<Link> link_;
    EndpointMessage peer_;
};
Result<void> finish_cm(CmOffered& offered);

// The options with the device and port RDMA CM resolved to, when it names one.
template <class Cm>
ConnectionOptions on_device_of(const Cm& cm, ConnectionOptions options) {
    if (!cm.device().empty()) {
        options.device = cm.device();
        options.port = cm.ib_port();
    }
    return options;
}

// A server handshake's QP connect, run off the listener's thread. Towards a RoCE GID
// the client announced (in its TCP offer or its CM request's private data), RTR
// resolves the GID's MAC and waits for it: up to a second when nobody answers (rxe:
// 1.02 s, then ETIMEDOUT), as often as a client likes to make it. Meanwhile the
// listener's thread serves its other clients: fd() becomes readable when the connect is
// done. The connect touches its handshake's QP (and CM request): the destructor of the
// runner's kind waits for a connect under way (at most that second).
class BackgroundConnect {
public:
    BackgroundConnect(const BackgroundConnect&) = delete;
    BackgroundConnect& operator=(const BackgroundConnect&) = delete;
    virtual ~BackgroundConnect();

    int fd() const noexcept { return event_; }
    // The connect's result once it is done (fd() readable), else nullopt; once only.
    std::optional<Result<void>> finished();
    // Whether the connect may be running now: destroying this may wait for it (up to a
    // second). False at least while it has not begun (a turn still awaited).
    virtual bool under_way() const = 0;

protected:
    BackgroundConnect() = default;
    // Makes the eventfd. Errors: no eventfd (its errno).
    Result<void> open();
    // The connect ended with `result`: fd() becomes readable. Once, from any thread.
    void done(Result<void> result);
    // Whether done() was called.
    bool reported() const;

private:
    int event_ = -1;
    mutable std::mutex mutex_; // for result_ and reported_: written on the connect's thread
    std::optional<Result<void>> result_;
    bool reported_ = false;
};

// How a listener runs its handshakes' connects: `connect` (a QueuePair::connect, or a
// CmRequest's) for the client at `peer` (numeric "host:port"), whose handshake ends at
// `deadline`. What `connect` touches stays untouched by anyone else until finished()
// gave the result or the BackgroundConnect is destroyed.
using ConnectRunner = std::function<Result<std::unique_ptr<BackgroundConnect>>(
    std::function<Result<void>()> connect, const std::string& peer, Clock::time_point deadline)>;

// The blocking Listener's: each connect on a thread of its own.
class ConnectOnThread final : public BackgroundConnect {
public:
    // Errors: no eventfd or no thread (their errno).
    static Result<std::unique_ptr<BackgroundConnect>> start(std::function<Result<void>()> connect,
                                                            const std::string& peer, Clock::time_point deadline);
    ~ConnectOnThread() override;
    // From start() until the connect reports: its thread runs it at once.
    bool under_way() const override { return !reported(); }

private:
    ConnectOnThread() = default;
    std::thread thread_;
};

// Server side: one client's handshake in progress.
class ServerHandshake {
public:
    // A TCP client just accepted; `host`: peer_host() of its peer().
    ServerHandshake(TcpStream stream, std::string host, Clock::time_point deadline);
    ServerHandshake(ServerHandshake&&) noexcept = default;
    // Assigning would destroy link_ and request_ before the old connect ends.
    ServerHandshake& operator=(ServerHandshake&&) = delete;
    // An RDMA CM connect request: a QP for it, connecting (`run_connect`); then
    // receives posted and the request accepted; then the client's establish. `host`:
    // peer_host() of the request's peer().
    static Result<ServerHandshake> answer(std::shared_ptr<Group> group, CmRequest request, std::string host,
                                          const ConnectionOptions& options, const ConnectRunner& run_connect,
                                          Clock::time_point deadline);

    // Goes as far as it can without waiting: the connected link when the handshake is
    // complete, nullptr while it needs more from the client, an Error when the client
    // failed it (then drop this).
    Result<std::unique_ptr<Link>> advance(const std::shared_ptr<Group>& group, const ConnectionOptions& options,
                                          const ConnectRunner& run_connect);
    // What to poll for.
    pollfd wanted() const;
    // None while its QP connects (BackgroundConnect): dropping it would wait for that.
    Clock::time_point deadline() const noexcept { return connecting_ ? Clock::time_point::max() : deadline_; }
    const std::string& peer() const;
    // peer_host() of peer(), as its listener found it: what it shares slots out by
    // (HostShares).
    const std::string& host() const noexcept { return host_; }
    // Whether dropping it now is quick: not while its QP's connect is under way.
    bool can_go() const { return !connecting_ || !connecting_->under_way(); }

private:
    enum class State : std::uint8_t { read_offer, connecting, write_answer, read_ready, cm_establish };
    explicit ServerHandshake(Clock::time_point deadline) : deadline_(deadline) {}
    // The offer read: checked, a link for it, its QP connecting.
    Result<void> take_offer(const std::shared_ptr<Group>& group, const ConnectionOptions& options,
                            const ConnectRunner& run_connect);
    // The QP connected: receives posted, our answer ready to go (TCP) or the request
    // accepted (RDMA CM).
    Result<void> answer_offer();
    Result<void> answer_request();

    State state_ = State::read_offer;
    Clock::time_point deadline_;
    std::string host_;
    std::optional<TcpStream> stream_;
    std::optional<CmConnection> cm_;
    std::unique_ptr<Link> link_;
    std::unique_ptr<CmRequest> request_;            // RDMA CM: the client's, while its QP connects
    std::unique_ptr<BackgroundConnect> connecting_; // after link_ and request_: gone first, its connect with it
    std::optional<EndpointMessage> offer_;          // TCP: the client's, while its QP connects
    std::vector<std::byte> in_;  // the offer, read so far
    std::vector<std::byte> out_; // our answer and ready byte
    std::size_t sent_ = 0;
};

} // namespace rdmaxx::detail
