// rdmaxx-post-cost VARIANT [N]: the instructions of rdmaxx's hot paths against the raw
// verbs they call, each path in an extern "C" function of its own so that callgrind can
// count its instructions alone (bench/post-cost.sh). N single-SGE RDMA WRITEs on the
// default device (a QP connected to a second QP of this process).
//
// Posting, VARIANT raw_classic | raw_extended | rdmaxx_classic | rdmaxx_extended: the
// post alone, through raw ibv_post_send, raw ibv_wr_*, and rdmaxx's SendBatch on a
// classic QP and on an extended one (the *_post functions). Every completion is taken
// outside the count and must be a success.
//
// Awaiting, VARIANT raw | callback | await: a step - take one completion, resume whoever
// waits for it, post the next WR - (the *_step functions) through
//   raw:      ibv_poll_cq for the completion, ibv_post_send for the next WR
//   callback: lib/async with a completion handler (bound to the io_context) that issues
//             the next write; the step is the manual-mode CompletionQueue::poll() inside
//             the io_context, which calls the handler inline (busy mode's path without
//             its spinning)
//   await:    the same with a coroutine awaiting async::QueuePair::write: adds Asio's
//             coroutine machinery (use_awaitable's frame and its resumption)
// Between steps, outside the count, the program blocks on the CQ's completion channel
// until the completion is there, so every step finds exactly one: no empty polls, whose
// number would depend on timing. (Event mode is not counted: its steps are system calls,
// and how many completions one reactor wake finds depends on timing.)
//
// The exit code says whether every WRITE succeeded.
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <utility>

#include <poll.h>

#include <infiniband/verbs.h>

#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <rdmaxx/async/completions.hpp>
#include <rdmaxx/async/queue_pair.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/cq.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pd.hpp>
#include <rdmaxx/wrap/qp.hpp>

using namespace rdmaxx;

extern "C" {
[[gnu::noinline]] int raw_classic_post(ibv_qp* qp, ibv_send_wr* wr, std::uint64_t i) {
    wr->wr_id = i;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, wr, &bad);
}
[[gnu::noinline]] int raw_extended_post(ibv_qp_ex* qpx, const ibv_sge* sge, std::uint32_t rkey,
                                        std::uint64_t remote, std::uint64_t i) {
    ibv_wr_start(qpx);
    qpx->wr_id = i;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(qpx, rkey, remote);
    ibv_wr_set_sge(qpx, sge->lkey, sge->addr, sge->length);
    return ibv_wr_complete(qpx);
}
[[gnu::noinline]] bool rdmaxx_classic_post(SendBatch<1>* batch, std::uint64_t i) {
    return batch->set_wr_id(0, i).post().has_value();
}
[[gnu::noinline]] bool rdmaxx_extended_post(SendBatch<1>* batch, std::uint64_t i) {
    return batch->set_wr_id(0, i).post().has_value();
}
}

extern "C" {
// Takes completion i - 1 and posts WR i. False if the completion is missing or failed.
[[gnu::noinline]] bool raw_step(ibv_cq* cq, ibv_qp* qp, ibv_send_wr* wr, std::uint64_t i) {
    ibv_wc wc{};
    if (ibv_poll_cq(cq, 1, &wc) != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != i - 1)
        return false;
    wr->wr_id = i;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, wr, &bad) == 0;
}
[[gnu::noinline]] std::size_t await_step(async::CompletionQueue* cq) { return cq->poll(); }
[[gnu::noinline]] std::size_t callback_step(async::CompletionQueue* cq) { return cq->poll(); }
}

namespace {

template <class T>
T must(Result<T> r, const char* what) {
    if (!r) {
        std::fprintf(stderr, "%s: %s\n", what, r.error().message().c_str());
        std::exit(2);
    }
    if constexpr (!std::is_void_v<T>)
        return std::move(*r);
}

// Takes the completion of WR `i`: it must be a success.
bool complete(const CompletionQueue& cq, std::uint64_t i) {
    ibv_wc wc{};
    for (long spins = 0; spins < 100'000'000; ++spins) {
        const int n = ibv_poll_cq(cq.get(), 1, &wc);
        if (n < 0)
            return false;
        if (n == 1)
            return wc.status == IBV_WC_SUCCESS && wc.wr_id == i;
    }
    return false;
}

// Blocks until `cq` (with a channel, armed before the post whose completion is awaited)
// holds a completion, takes the channel's event and arms it again for the next post.
// The completion itself stays in the CQ.
void wait_completion(CompletionQueue& cq) {
    pollfd readable{.fd = cq.channel_fd(), .events = POLLIN, .revents = 0};
    while (::poll(&readable, 1, -1) != 1) {
    }
    must(cq.take_events(), "take_events");
    must(cq.arm(), "arm");
}

asio::awaitable<void> writer(async::QueuePair& qp, LocalSlice local, RemoteMemory remote, std::uint64_t n,
                             std::uint64_t& ok) {
    for (std::uint64_t i = 0; i < n; ++i) {
        auto done = co_await qp.write(local, remote);
        if (!done)
            co_return;
        ++ok;
    }
}

// The callback path: each completion issues the next write with this handler again.
struct Writer {
    async::QueuePair* qp;
    LocalSlice local;
    RemoteMemory remote;
    std::uint64_t n;
    std::uint64_t* ok;
    asio::io_context* io;

    void operator()(Result<WorkCompletion> done) const {
        if (done && ++*ok < n)
            issue();
    }
    void issue() const { qp->write(local, remote, asio::bind_executor(*io, *this)); }
};

struct Device {
    Context context = must(Context::open(), "open");
    ProtectionDomain pd = must(ProtectionDomain::create(context), "pd");
    MemoryRegion mr = must(MemoryRegion::allocate(pd, 4096, access_all), "mr");
    LocalSlice local = mr.slice(0, 64);
    RemoteMemory remote = mr.remote().slice(1024, 64);

    // Two QPs on `cq`, connected to each other: the first posts, the second answers.
    std::pair<QueuePair, QueuePair> pair(CompletionQueue& cq, PostApi api = PostApi::classic) {
        QueuePair a = must(QueuePair::create(pd, {.send_cq = &cq, .recv_cq = &cq, .post_api = api}), "qp");
        QueuePair b = must(QueuePair::create(pd, {.send_cq = &cq, .recv_cq = &cq, .post_api = api}), "qp");
        must(a.connect(b.endpoint()), "connect");
        must(b.connect(a.endpoint()), "connect");
        return {std::move(a), std::move(b)};
    }
    // The raw verbs' WR: a signaled WRITE of `sge` (local) to remote.
    ibv_send_wr raw_write(ibv_sge& sge) const {
        ibv_send_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = remote.addr;
        wr.wr.rdma.rkey = remote.rkey;
        return wr;
    }
};

std::uint64_t run_raw(Device& d, std::uint64_t n) {
    CompletionQueue cq = must(CompletionQueue::create(d.context, {.depth = 256, .channel = true}), "cq");
    auto [a, b] = d.pair(cq);
    ibv_sge sge = d.local.sge();
    ibv_send_wr wr = d.raw_write(sge);
    ibv_send_wr* bad = nullptr;
    must(cq.arm(), "arm");
    if (ibv_post_send(a.get(), &wr, &bad) != 0)
        return 0;
    std::uint64_t ok = 0;
    for (std::uint64_t i = 1; i <= n; ++i) { // step i takes WR i - 1's completion; the last posts one more
        wait_completion(cq);
        ok += raw_step(cq.get(), a.get(), &wr, i) ? 1 : 0;
    }
    wait_completion(cq);
    ibv_wc wc{};
    return ibv_poll_cq(cq.get(), 1, &wc) == 1 ? ok : 0;
}

std::uint64_t run_async(Device& d, std::uint64_t n, bool callback) {
    asio::io_context io;
    async::CompletionQueue cq = must(async::CompletionQueue::create(io, d.context, {.depth = 256, .channel = true},
                                                                    {.mode = async::CompletionMode::manual}),
                                     "cq");
    auto [created, b] = d.pair(cq.get());
    async::QueuePair a = async::QueuePair::attach(std::move(created), cq, cq);
    std::uint64_t ok = 0;
    must(cq.get().arm(), "arm");
    if (callback)
        Writer{&a, d.local, d.remote, n, &ok, &io}.issue(); // WR 0 posted
    else
        asio::co_spawn(io, writer(a, d.local, d.remote, n, ok), asio::detached);
    io.poll(); // the coroutine runs to its first co_await: WR 0 posted (callback: posted already)
    while (a.posted() != 0) {
        wait_completion(cq.get());
        // inside the io_context, as a busy turn is: the handler runs inline
        if (callback)
            asio::post(io, [&cq] { callback_step(&cq); });
        else
            asio::post(io, [&cq] { await_step(&cq); });
        io.restart(); // the last poll() ran out of work, which stops an io_context
        io.poll();
    }
    return ok;
}

// The posting variants: N posts, each completion taken outside the count.
std::uint64_t run_posts(Device& d, std::string_view variant, std::uint64_t n) {
    const bool extended_qp = variant == "raw_extended" || variant == "rdmaxx_extended";
    CompletionQueue cq = must(CompletionQueue::create(d.context, {.depth = 256}), "cq");
    auto [a, b] = d.pair(cq, extended_qp ? PostApi::extended : PostApi::classic);
    SendBatch<1> batch(a);
    batch.write(d.local, d.remote);
    ibv_sge sge = d.local.sge();
    ibv_send_wr wr = d.raw_write(sge);

    std::uint64_t ok = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        bool posted = false;
        if (variant == "raw_classic")
            posted = raw_classic_post(a.get(), &wr, i) == 0;
        else if (variant == "raw_extended")
            posted = raw_extended_post(a.extended(), &sge, d.remote.rkey, d.remote.addr, i) == 0;
        else if (variant == "rdmaxx_classic")
            posted = rdmaxx_classic_post(&batch, i);
        else
            posted = rdmaxx_extended_post(&batch, i);
        ok += posted && complete(cq, i) ? 1 : 0;
    }
    return ok;
}

} // namespace

int main(int argc, char** argv) {
    const std::string_view variant = argc > 1 ? argv[1] : "";
    const std::uint64_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 10'000;
    const bool post = variant == "raw_classic" || variant == "raw_extended" || variant == "rdmaxx_classic" ||
                      variant == "rdmaxx_extended";
    if (!post && variant != "raw" && variant != "callback" && variant != "await") {
        std::fprintf(stderr, "usage: %s raw_classic|raw_extended|rdmaxx_classic|rdmaxx_extended|raw|callback|await [N]\n",
                     argv[0]);
        return 2;
    }
    Device device;
    const std::uint64_t ok = post                ? run_posts(device, variant, n)
                             : variant == "raw" ? run_raw(device, n)
                                                : run_async(device, n, variant == "callback");
    std::printf("%.*s: %llu of %llu WRITEs completed\n", static_cast<int>(variant.size()), variant.data(),
                static_cast<unsigned long long>(ok), static_cast<unsigned long long>(n));
    return ok == n ? 0 : 1;
}
