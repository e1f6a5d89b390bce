// What the device tests reach inside an endpoint, and no API does: a state of the
// device that no call can bring about (a QP whose send queue is drained, SQD, so that
// the window binds posted on it never run: Soft-RoCE's stall, made on purpose) is made
// on the QP itself, with real verbs.
// Thread safety: the endpoint's thread, as every use of its sessions.
#pragma once

namespace rdmaxx {
class QueuePair;
} // namespace rdmaxx

namespace rdmaxx::rpc {
class Session;
} // namespace rdmaxx::rpc

namespace rdmaxx::rpc::detail {

// The QP of `session`'s RC path at this end, or nullptr while it has none (or the
// session has ended).
QueuePair* rc_qp_of(const Session& session) noexcept;

} // namespace rdmaxx::rpc::detail
