// The state of an async QueuePair, shared by its handle, its operations and the
// service's poll loop. Internal to lib/async.
#pragma once

#include <cstdint>
#include <optional>
#include <source_location>

#include <asio/cancellation_type.hpp>

#include <rdmaxx/async/detail/op.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx::async {
class Completions;
}

namespace rdmaxx::async::detail {

struct CqCore;

struct QpCore {
    Completions* service;
    rdmaxx::QueuePair qp;
    CqCore* send_cq;
    CqCore* recv_cq;
    std::uint32_t send_credits; // free send queue entries
    std::uint32_t recv_credits; // free receive queue entries
    OpQueue send_waiting;       // operations waiting for entries, in order
    OpQueue recv_waiting;
    // Sends started by the handlers of the poll running now, their entries taken: posted
    // together, one doorbell, when those handlers are done (Completions::take).
    OpQueue send_held;
    std::size_t posted = 0;     // operations whose completion is due
    // Set when the QP can complete nothing more (a failed completion, a cancelled
    // operation, the handle destroyed): every later operation fails with it.
    std::optional<Error> dead;
    bool dead_by_event = false; // `dead` is a device event's: every failure reports it
    std::source_location created;
};

// Posts `op` (whose WR and handler are stored), holds it for the running poll's
// doorbell (a send started by its handlers) or queues it for entries; an op that
// cannot be posted completes, deferred, with why.
void start(Op& op);
// Posts `qp`'s held sends as one chain, one doorbell; fails them if the QP is dead or
// the device refuses them.
void ring(QpCore& qp);
// `op`'s completion `wc` was taken: returns its entries and posts the operations that
// now fit (a failure kills the QP).
void retire(Op& op, const WorkCompletion& wc);
// What an op whose completion `wc` failed completes with; judged before retire().
Error failure(const Op& op, const WorkCompletion& wc);
// The QP dead with `why` (unless it died before) and moved to the error state: its
// posted operations then complete with flush errors. Fails nothing itself.
void halt(QpCore& qp, Error why);
// halt(), then fails its waiting and held operations, deferred, with `why`.
void kill(QpCore& qp, Error why);
// kill() for a device event (Completions' watch): unless the QP was already dead, its
// posted operations then complete with `why`, not with their flush status.
void kill_by_event(QpCore& qp, const Error& why);
// An operation's cancellation slot fired.
void cancel(Completions& service, std::uint32_t index, std::uint32_t generation, asio::cancellation_type_t type);

// Installed in an operation's cancellation slot.
struct CancelOp {
    Completions* service;
    std::uint32_t index;
    std::uint32_t generation;
    void operator()(asio::cancellation_type_t type) const { cancel(*service, index, generation, type); }
};

} // namespace rdmaxx::async::detail
