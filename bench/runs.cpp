#include "runs.hpp"

#include <array>
#include <atomic>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/data/signaling.hpp>

namespace rdmaxx::perf {
namespace {

using protocol::Command;
using protocol::CommandKind;
using protocol::Reply;
using protocol::ReplyKind;

// Bounded waiting that stays off the clock in the common case: a wait that ends
// within 1024 spins never reads it; after that the clock is read every 1024 spins
// and the wait ends `timeout` after the first reading.
class Patience {
public:
    explicit Patience(std::chrono::milliseconds timeout) : timeout_(timeout) {}
    bool over() {
        if ((++spins_ & 1023) != 0) [[likely]]
            return false;
        const auto now = Clock::now();
        if (spins_ == 1024)
            deadline_ = now + timeout_;
        return now > deadline_;
    }
    Error error(std::string_view what) const {
        return Error::timeout("peer", fmt::format("no {} within {} ms: is the peer alive?", what, timeout_.count()));
    }

private:
    std::chrono::milliseconds timeout_;
    Clock::time_point deadline_{};
    std::uint64_t spins_ = 0;
};

bool ping_pong(Verb verb) { return verb == Verb::write || verb == Verb::send || verb == Verb::write_imm; }

// Whether `role` ends a run with the peer's data (or the atomics' results) in its inboxes.
bool receives(Role role, Test test) {
    if (test.verb == Verb::atomic)
        return true;
    if (test.measure == Measure::latency && ping_pong(test.verb))
        return true;
    return (role == Role::client) == (test.verb == Verb::read);
}

// WRITE ping-pong: the receiver spins on the last byte, which carries the iteration.
std::byte tag(std::uint32_t i) { return static_cast<std::byte>(i % 255 + 1); }

// One completion of `cq` into `wc` (the data layer's bounded busy wait, inlined into
// the loop as a hand-written one would be); a failed one is its Error.
[[gnu::always_inline]] inline Result<void> next_completion(CompletionQueue& cq, WorkCompletion& wc,
                                                           std::chrono::milliseconds timeout) {
    return wait_n(cq, std::span(&wc, 1), 1, {.timeout = timeout});
}

// QP q's buffers for a run of `size` bytes, sliced once before the timed loop (as
// perftest builds its WRs once): the loop posts, it does not recompute bounds.
struct Buffers {
    LocalSlice out, in, result;          // result: the atomics' 8 bytes
    RemoteMemory peer_out, peer_in, target;

    Buffers(const Side& side, std::size_t q, std::uint32_t size)
        : out(side.out(q, size)), in(side.in(q, size)), result(side.in(q, atomic_size)),
          peer_out(side.peer_out(q, size)), peer_in(side.peer_in(q, size)), target(side.peer_in(q, atomic_size)) {}
};

// Adds the run's WR to `batch`, numbered 0: renumber() makes it another.
template <std::size_t N>
void add(SendBatch<N>& batch, const Options& o, const Buffers& b, const PostOptions& options) {
    switch (o.test.verb) {
    case Verb::write: batch.write(b.out, b.peer_in, options); break;
    case Verb::read: batch.read(b.in, b.peer_out, options); break;
    case Verb::send: batch.send(b.out, options); break;
    case Verb::write_imm: batch.write_with_imm(b.out, b.peer_in, 0, options); break;
    case Verb::atomic:
        if (o.atomic == AtomicOp::fetch_add)
            batch.fetch_add(b.result, b.target, 1, options);
        else
            batch.compare_swap(b.result, b.target, 0, 1, options);
        break;
    case Verb::rpc: break; // not a verb: the RPC tests run in rpc.cpp
    }
}

// Makes WR k of a prebuilt `batch` the run's WR number n (its wr_id; its immediate or
// CAS operands where the peer checks them) and sets its signaling.
template <std::size_t N>
void renumber(SendBatch<N>& batch, std::size_t k, const Options& o, std::uint32_t n, bool signaled) {
    batch.set_wr_id(k, n).set_signaled(k, signaled);
    if (o.test.verb == Verb::write_imm)
        batch.set_imm(k, n);
    else if (o.test.verb == Verb::atomic && o.atomic == AtomicOp::compare_swap)
        batch.set_atomic(k, n, n + 1);
}

std::uint64_t load_u64(const LocalSlice& slice) {
    std::uint64_t value = 0;
    std::memcpy(&value, slice.data(), sizeof value);
    return value;
}

// Before a run: this side's data in its outboxes, its inboxes cleared.
void prepare(Side& side, std::uint32_t size) {
    for (std::size_t q = 0; q < side.qp_count(); ++q) {
        const LocalSlice out = side.out(q, size);
        for (std::uint32_t k = 0; k < size; ++k)
            out.data()[k] = pattern(side.role(), k, size);
        std::memset(side.in(q, size).data(), 0, size);
    }
}

// After a run: whether this side's inboxes hold what the peer's run left there, or why not.
std::optional<std::string> check_inboxes(const Side& side, std::uint32_t size, std::uint32_t iters) {
    const Test test = side.options().test;
    if (!receives(side.role(), test))
        return std::nullopt;
    const Role peer = side.role() == Role::client ? Role::server : Role::client;
    for (std::size_t q = 0; q < side.qp_count(); ++q) {
        const LocalSlice in = side.in(q, size);
        if (test.verb == Verb::atomic) {
            // the target counts to iters; the initiator's last result is the value before the last
            const std::uint64_t wanted = side.role() == Role::server ? iters : iters - 1;
            if (const std::uint64_t got = load_u64(in); got != wanted)
                return fmt::format("QP {}: the atomic's 8 bytes hold {}, expected {}", q, got, wanted);
            continue;
        }
        for (std::uint32_t k = 0; k < size; ++k) {
            const bool tagged = k + 1 == size && test.verb == Verb::write && test.measure == Measure::latency;
            const std::byte wanted = tagged ? tag(iters - 1) : pattern(peer, k, size);
            if (in.data()[k] != wanted)
                return fmt::format("QP {}: byte {} of {} is {:#04x}, expected {:#04x}", q, k, size,
                                   static_cast<unsigned>(in.data()[k]), static_cast<unsigned>(wanted));
        }
    }
    return std::nullopt;
}

// The message of a two-sided ping-pong or stream: its completion, checked, and the
// receive it used posted again.
[[gnu::always_inline]] inline Result<void> take_message(Side& side, std::size_t q, std::uint32_t size, std::uint32_t n,
                                                        const WorkCompletion& wc) {
    const Verb verb = side.options().test.verb;
    if (verb == Verb::send && wc.byte_len() != size)
        return std::unexpected(Error::protocol(
            "peer", fmt::format("QP {}: message {} has {} bytes, expected {}", q, n, wc.byte_len(), size)));
    if (verb == Verb::write_imm && wc.imm() != n)
        return std::unexpected(Error::protocol(
            "peer", fmt::format("QP {}: write {} carries immediate {}, expected {}", q, n,
                                       wc.imm() ? fmt::format("{}", *wc.imm()) : "none", n)));
    return side.post_receive(q);
}

// One side of a latency run, one WR at a time on QP 0. In a ping-pong the client posts
// then waits for the server's answer, the server waits then answers; READ and atomics
// are the client's alone. The client stamps each post (and the end) into `stamps`.
Result<void> latency_loop(Side& side, std::uint32_t size, std::uint32_t iters, std::span<Clock::time_point> stamps) {
    const Options& o = side.options();
    const Verb verb = o.test.verb;
    const bool client = side.role() == Role::client;
    const bool answered = ping_pong(verb);
    const Buffers buffers(side, 0, size);
    std::byte* const last_out = buffers.out.data() + size - 1;
    const std::byte* const last_in = buffers.in.data() + size - 1;
    const bool inline_data = size <= side.inline_size();
    // SEND and WRITE_WITH_IMM signal one WR in cq_mod, as perftest's send_lat does (the
    // peer's answer already says the message arrived); WRITE, READ and atomics signal
    // every WR and take its completion before going on, as perftest's other tests do.
    std::optional<SignaledSendQueue> selective;
    if (verb == Verb::send || verb == Verb::write_imm)
        selective.emplace(side.qp(0), side.send_cq(0), std::min(o.cq_mod, side.qp(0).caps().max_send_wr));
    const auto answer = [&](std::uint32_t i) __attribute__((always_inline)) -> Result<void> {
        if (verb == Verb::write) {
            for (Patience patience(o.timeout);
                 std::atomic_ref(*const_cast<std::byte*>(last_in)).load(std::memory_order_acquire) != tag(i);)
                if (patience.over())
                    return std::unexpected(patience.error("WRITE from the peer"));
            return {};
        }
        WorkCompletion wc;
        if (auto ok = next_completion(side.recv_cq(0), wc, o.timeout); !ok)
            return ok;
        return take_message(side, 0, size, i, wc);
    };
    // the WR is built once, as perftest builds its WRs: each iteration sets what varies
    SendBatch<1> batch(side.qp(0));
    add(batch, o, buffers, {.inline_data = inline_data});
    for (std::uint32_t i = 0; i < iters; ++i) {
        if (answered && !client)
            if (auto ok = answer(i); !ok)
                return ok;
        if (verb == Verb::write)
            *last_out = tag(i);
        if (client)
            stamps[i] = Clock::now();
        bool signaled = true;
        if (selective) {
            auto next = selective->next({}, i + 1 == iters, o.timeout);
            if (!next)
                return std::unexpected(std::move(next.error()));
            signaled = next->signaled;
        }
        renumber(batch, 0, o, i, signaled);
        if (auto ok = batch.post(); !ok)
            return ok;
        if (!selective) {
            // perftest's order: our own completion first, then the peer's answer
            WorkCompletion wc;
            if (auto ok = next_completion(side.send_cq(0), wc, o.timeout); !ok)
                return ok;
            if (verb == Verb::atomic && load_u64(buffers.result) != i)
                return std::unexpected(Error::protocol(
                    "peer", fmt::format("atomic {} returned {}, expected {}", i, load_u64(buffers.result), i)));
        }
        if (answered && client)
            if (auto ok = answer(i); !ok)
                return ok;
    }
    if (client)
        stamps[iters] = Clock::now();
    if (selective)
        return selective->drain(o.timeout);
    return {};
}

// The client's side of a bandwidth run: every QP streams `iters` WRs, post_list per
// doorbell, round robin, one WR in signal_interval() signaled (and each QP's last);
// timed from the first post to the last completion.
Result<Bandwidth> stream(Side& side, std::uint32_t size, std::uint32_t iters) {
    const Options& o = side.options();
    const std::uint32_t interval = signal_interval(o, size);
    const bool inline_data = size <= side.inline_size();
    std::vector<SignaledSendQueue> queues;
    std::vector<SendBatch<max_post_list>> batches; // each QP's post list, built once
    const auto build = [&](std::size_t q, std::uint32_t count) {
        SendBatch<max_post_list>& batch = batches[q];
        batch.clear();
        const Buffers buffers(side, q, size);
        for (std::uint32_t k = 0; k < count; ++k)
            add(batch, o, buffers, {.inline_data = inline_data});
    };
    for (std::size_t q = 0; q < side.qp_count(); ++q) {
        queues.emplace_back(side.qp(q), side.send_cq(q), interval);
        batches.emplace_back(side.qp(q));
        build(q, o.post_list);
    }
    std::vector<std::uint32_t> posted(side.qp_count(), 0);
    const auto start = Clock::now();
    for (bool more = true; more;) {
        more = false;
        for (std::size_t q = 0; q < side.qp_count(); ++q) {
            if (posted[q] == iters)
                continue;
            const std::uint32_t count = std::min(o.post_list, iters - posted[q]);
            if (count < batches[q].size()) // the last post list of a run that does not divide evenly
                build(q, count);
            SendBatch<max_post_list>& batch = batches[q];
            for (std::uint32_t k = 0; k < count; ++k) {
                const std::uint32_t n = posted[q] + k;
                auto options = queues[q].next({}, n + 1 == iters, o.timeout);
                if (!options)
                    return std::unexpected(std::move(options.error()));
                renumber(batch, k, o, n, options->signaled);
            }
            if (auto ok = batch.post(); !ok)
                return std::unexpected(std::move(ok.error()));
            posted[q] += count;
            more = more || posted[q] < iters;
        }
    }
    for (SignaledSendQueue& queue : queues)
        if (auto ok = queue.drain(o.timeout); !ok)
            return std::unexpected(std::move(ok.error()));
    return bandwidth(size, std::uint64_t{iters} * side.qp_count(), Clock::now() - start);
}

// The server's side of a SEND or WRITE_WITH_IMM bandwidth run: every QP's `iters`
// messages taken, checked and their receives posted again.
Result<void> absorb(Side& side, std::uint32_t size, std::uint32_t iters) {
    std::vector<std::uint32_t> received(side.qp_count(), 0);
    std::array<WorkCompletion, 16> batch;
    std::size_t done = 0;
    Patience patience(side.options().timeout);
    while (done < side.qp_count()) {
        for (std::size_t q = 0; q < side.qp_count(); ++q) {
            auto n = poll(side.recv_cq(q), batch);
            if (!n)
                return std::unexpected(std::move(n.error()));
            if (*n != 0)
                patience = Patience(side.options().timeout);
            for (std::size_t k = 0; k < *n; ++k) {
                if (auto ok = batch[k].check(); !ok)
                    return ok;
                if (auto ok = take_message(side, q, size, received[q]++, batch[k]); !ok)
                    return ok;
                done += received[q] == iters;
            }
        }
        if (patience.over())
            return std::unexpected(patience.error("message from the client"));
    }
    return {};
}

// --- the client's loops through lib/async (--async) ------------------------------

// The run's WR number n on QP q's buffers, as one awaited operation (the verb, the
// immediate and the CAS operands that add() and renumber() give a batch's WR).
asio::awaitable<async::detail::OpResult> issue(async::QueuePair& qp, const Options& o, const Buffers& b,
                                               std::uint32_t n, const PostOptions& options = {}) {
    constexpr auto token = asio::use_awaitable;
    switch (o.test.verb) {
    case Verb::read: return qp.read(b.in, b.peer_out, token, options);
    case Verb::send: return qp.send(b.out, token, options);
    case Verb::write_imm: return qp.write_with_imm(b.out, b.peer_in, n, token, options);
    case Verb::atomic:
        return o.atomic == AtomicOp::fetch_add ? qp.fetch_add(b.result, b.target, 1, token, options)
                                               : qp.compare_swap(b.result, b.target, n, n + 1, token, options);
    default: return qp.write(b.out, b.peer_in, token, options);
    }
}

// READ and atomic latency: one operation awaited at a time, stamped as latency_loop
// stamps its posts.
asio::awaitable<void> async_latency(Side& side, std::uint32_t size, std::uint32_t iters,
                                    std::span<Clock::time_point> stamps, Result<void>& out) {
    const Options& o = side.options();
    const Buffers buffers(side, 0, size);
    async::QueuePair& qp = side.async_qp(0);
    for (std::uint32_t i = 0; i < iters; ++i) {
        stamps[i] = Clock::now();
        auto done = co_await issue(qp, o, buffers, i);
        if (!done) {
            out = std::unexpected(std::move(done.error()));
            co_return;
        }
        if (o.test.verb == Verb::atomic && load_u64(buffers.result) != i) {
            out = std::unexpected(Error::protocol(
                "peer", fmt::format("atomic {} returned {}, expected {}", i, load_u64(buffers.result), i)));
            co_return;
        }
    }
    stamps[iters] = Clock::now();
}

// Bandwidth: tx_depth / post_list of these per QP keep that many post lists in flight.
// Each awaits one post list at a time as one operation (one doorbell, its last WR
// signaled: the verbs the data layer's loop issues with --cq-mod equal to the post
// list), and takes the QP's next WR numbers in order (a CAS compares with the number
// before it). The list is built once; each post renumbers it. A list of one is one
// operation (qp.write() and the like, not a SendBatch): what an application that
// awaits every WR writes, and what lib/async holds for its poll's doorbell.
asio::awaitable<void> async_stream_worker(Side& side, std::size_t q, std::uint32_t size, std::uint32_t iters,
                                          std::uint32_t& next, Result<void>& out) {
    const Options& o = side.options();
    const Buffers buffers(side, q, size);
    const bool inline_data = size <= side.inline_size();
    async::QueuePair& qp = side.async_qp(q);
    if (o.post_list == 1) {
        const bool carries_data = o.test.verb != Verb::read && o.test.verb != Verb::atomic;
        while (next < iters && out) {
            auto done = co_await issue(qp, o, buffers, next++, {.inline_data = inline_data && carries_data});
            if (!done && out)
                out = std::unexpected(std::move(done.error()));
        }
        co_return;
    }
    SendBatch<max_post_list> batch(qp.get());
    for (std::uint32_t k = 0; k < o.post_list; ++k)
        add(batch, o, buffers, {.inline_data = inline_data});
    while (next < iters && out) {
        const std::uint32_t count = std::min(o.post_list, iters - next);
        if (count < batch.size()) { // the last list of a run that does not divide evenly
            batch.clear();
            for (std::uint32_t k = 0; k < count; ++k)
                add(batch, o, buffers, {.inline_data = inline_data});
        }
        for (std::uint32_t k = 0; k < count; ++k)
            renumber(batch, k, o, next++, false); // post() signals the last
        auto done = co_await qp.post(batch);
        if (!done && out)
            out = std::unexpected(std::move(done.error()));
    }
}

Result<Latency> async_latency_run(Side& side, std::uint32_t size, std::uint32_t iters) {
    std::vector<Clock::time_point> stamps(std::size_t{iters} + 1);
    Result<void> out;
    asio::co_spawn(side.io(), async_latency(side, size, iters, stamps, out), asio::detached);
    const auto cpu = cpu_time();
    side.io().restart();
    side.io().run();
    const auto used = cpu_time() - cpu;
    if (!out)
        return std::unexpected(std::move(out.error()));
    Latency latency = summarize_latency(stamps, 1);
    latency.cpu_us_per_op = std::chrono::duration<double, std::micro>(used).count() / iters;
    return latency;
}

Result<Bandwidth> async_stream(Side& side, std::uint32_t size, std::uint32_t iters) {
    const Options& o = side.options();
    const std::uint32_t window = std::min(o.tx_depth / o.post_list, (iters + o.post_list - 1) / o.post_list);
    std::vector<std::uint32_t> next(side.qp_count(), 0);
    Result<void> out;
    for (std::size_t q = 0; q < side.qp_count(); ++q)
        for (std::uint32_t w = 0; w < window; ++w)
            asio::co_spawn(side.io(), async_stream_worker(side, q, size, iters, next[q], out), asio::detached);
    const auto cpu = cpu_time();
    const auto start = Clock::now();
    side.io().restart();
    side.io().run();
    const auto elapsed = Clock::now() - start;
    const auto used = cpu_time() - cpu;
    if (!out)
        return std::unexpected(std::move(out.error()));
    const std::uint64_t messages = std::uint64_t{iters} * side.qp_count();
    Bandwidth figures = bandwidth(size, messages, elapsed);
    figures.cpu_us_per_op = std::chrono::duration<double, std::micro>(used).count() / static_cast<double>(messages);
    return figures;
}

Result<Command> receive_command(Side& side, Clock::time_point deadline) {
    protocol::CommandWire wire;
    if (auto ok = side.receive(wire, deadline); !ok)
        return std::unexpected(std::move(ok.error()));
    return protocol::decode_command(wire, side.options().test, side.options().sizes.front()); // {largest} (a server)
}

Result<void> expect_reply(Side& side, ReplyKind wanted) {
    auto reply = side.receive_reply(Clock::now() + side.options().timeout);
    if (!reply)
        return std::unexpected(std::move(reply.error()));
    if (reply->kind == wanted)
        return {};
    if (reply->kind == ReplyKind::mismatch)
        return std::unexpected(
            Error::protocol("peer", fmt::format("the server found wrong bytes: {}", reply->reason)));
    return std::unexpected(Error::protocol("peer", fmt::format("unexpected reply {} from the server",
                                                                      static_cast<int>(reply->kind))));
}

} // namespace

Result<Figures> run_client(Side& side, std::uint32_t size, std::uint32_t iters) {
    const Test test = side.options().test;
    prepare(side, size);
    if (auto ok = side.send(protocol::encode_command({CommandKind::run, size, iters})); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto ok = expect_reply(side, ReplyKind::ready); !ok)
        return std::unexpected(std::move(ok.error()));
    Figures figures;
    if (side.options().async != AsyncMode::off && test.measure == Measure::latency) {
        auto latency = async_latency_run(side, size, iters);
        if (!latency)
            return std::unexpected(std::move(latency.error()));
        figures = *latency;
    } else if (side.options().async != AsyncMode::off) {
        auto bw = async_stream(side, size, iters);
        if (!bw)
            return std::unexpected(std::move(bw.error()));
        figures = *bw;
    } else if (test.measure == Measure::latency) {
        std::vector<Clock::time_point> stamps(std::size_t{iters} + 1);
        if (auto ok = latency_loop(side, size, iters, stamps); !ok)
            return std::unexpected(std::move(ok.error()));
        figures = summarize_latency(stamps, ping_pong(test.verb) ? 2 : 1);
    } else {
        auto bw = stream(side, size, iters);
        if (!bw)
            return std::unexpected(std::move(bw.error()));
        figures = *bw;
    }
    if (auto ok = side.send(protocol::encode_command({CommandKind::done, size, iters})); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto ok = expect_reply(side, ReplyKind::verified); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto wrong = check_inboxes(side, size, iters))
        return std::unexpected(Error::protocol("peer", fmt::format("wrong bytes arrived: {}", *wrong)));
    return figures;
}

Result<void> finish_client(Side& side) { return side.send(protocol::encode_command({CommandKind::finish, 0, 0})); }

Result<std::uint32_t> serve(Side& side) {
    const Options& o = side.options();
    for (std::uint32_t runs = 0;; ++runs) {
        // between runs the client prints and moves on: it has the usual silence
        auto command = receive_command(side, Clock::now() + o.timeout);
        if (!command)
            return std::unexpected(std::move(command.error()));
        if (command->kind == CommandKind::finish)
            return runs;
        if (command->kind != CommandKind::run)
            return std::unexpected(Error::protocol("peer", "the client ended a run it never started"));
        const std::uint32_t size = command->size, iters = command->iters;
        prepare(side, size);
        if (auto ok = side.reply({ReplyKind::ready, {}}); !ok)
            return std::unexpected(std::move(ok.error()));
        Result<void> served;
        if (o.test.measure == Measure::latency && ping_pong(o.test.verb))
            served = latency_loop(side, size, iters, {});
        else if (o.test.measure == Measure::bandwidth && (o.test.verb == Verb::send || o.test.verb == Verb::write_imm))
            served = absorb(side, size, iters);
        if (!served)
            return std::unexpected(std::move(served.error()));
        // One-sided runs leave the server nothing to watch: allow them 1 ms per WR and
        // 1 us per KiB on top of the usual silence (a dead client closes the stream sooner).
        const auto budget = o.timeout + std::uint64_t{iters} * side.qp_count() *
                                            (std::chrono::milliseconds(1) + std::chrono::microseconds(size / 1024));
        auto done = receive_command(side, Clock::now() + budget);
        if (!done)
            return std::unexpected(std::move(done.error()));
        if (done->kind != CommandKind::done)
            return std::unexpected(Error::protocol("peer", "the client started a run before ending the last"));
        const auto wrong = check_inboxes(side, size, iters);
        if (auto ok = side.reply({wrong ? ReplyKind::mismatch : ReplyKind::verified, wrong.value_or("")}); !ok)
            return std::unexpected(std::move(ok.error()));
        if (wrong)
            return std::unexpected(Error::protocol("peer", fmt::format("wrong bytes arrived: {}", *wrong)));
    }
}

} // namespace rdmaxx::perf
