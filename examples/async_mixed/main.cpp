// async_mixed: one thread, one io_context, three kinds of work at once.
//  * RDMA: 8 QPs (4 connected pairs on this machine's device), each running a coroutine
//    of WRITE then READ-back rounds, 64 operations in flight per QP, every byte checked;
//  * a plain TCP socket: an echo server and its client exchanging lines;
//  * a timer printing progress every 100 ms.
// None of them waits for the others: the RDMA completions are taken by lib/async's
// handlers inside the same run() that serves the socket and the timer.
//
//   async_mixed [--mode event|busy|hybrid] [--rounds N]
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/streambuf.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <fmt/format.h>

#include <rdmaxx/async/queue_pair.hpp>
#include <rdmaxx/wrap.hpp>

#include "../tutorial.hpp"

using namespace rdmaxx;
using asio::ip::tcp;

namespace {

constexpr std::size_t pairs = 4, in_flight = 64, bytes = 256;

struct Progress {
    std::size_t rdma_ops = 0, lines = 0, ticks = 0, failures = 0, running = 0;
};

// QP `qp` writes its slot of `mine` into `theirs` and reads it back, `rounds` times,
// `in_flight` operations at once (this coroutine is one of `in_flight` workers).
asio::awaitable<void> rdma_worker(async::QueuePair& qp, const MemoryRegion& mine, RemoteMemory theirs,
                                  std::size_t slot, std::size_t rounds, Progress& progress) {
    const LocalSlice out = mine.slice(slot * 2 * bytes, bytes), back = mine.slice(slot * 2 * bytes + bytes, bytes);
    const RemoteMemory target = theirs.slice(slot * bytes, bytes);
    for (std::size_t r = 0; r < rounds; ++r) {
        std::memset(out.data(), static_cast<int>((slot + r) & 0xff), bytes);
        auto wrote = co_await qp.write(out, target);
        auto read = wrote ? co_await qp.read(back, target) : std::move(wrote);
        if (!read || std::memcmp(out.data(), back.data(), bytes) != 0) {
            fmt::print(stderr, "async_mixed: QP {:#x} round {}: {}\n", qp.get().qpn(), r,
                       read ? "the bytes read back differ" : read.error().message());
            ++progress.failures;
            break;
        }
        progress.rdma_ops += 2;
    }
    --progress.running;
}

asio::awaitable<void> echo_server(tcp::acceptor& acceptor) {
    tcp::socket socket = co_await acceptor.async_accept(asio::use_awaitable);
    asio::streambuf buffer;
    std::error_code ec;
    for (;;) {
        const std::size_t n = co_await asio::async_read_until(socket, buffer, '\n', asio::redirect_error(asio::use_awaitable, ec));
        if (ec)
            co_return;
        co_await asio::async_write(socket, buffer.data(), asio::use_awaitable);
        buffer.consume(n);
    }
}

asio::awaitable<void> echo_client(tcp::endpoint server, Progress& progress) {
    tcp::socket socket(co_await asio::this_coro::executor);
    co_await socket.async_connect(server, asio::use_awaitable);
    asio::streambuf buffer;
    // a few lines at least, then as long as the RDMA workers run
    for (int i = 0; i < 3 || progress.running != 0; ++i) {
        const std::string line = fmt::format("{} RDMA operations so far\n", progress.rdma_ops);
        co_await asio::async_write(socket, asio::buffer(line), asio::use_awaitable);
        const std::size_t n = co_await asio::async_read_until(socket, buffer, '\n', asio::use_awaitable);
        const std::string echoed(asio::buffers_begin(buffer.data()), asio::buffers_begin(buffer.data()) + static_cast<std::ptrdiff_t>(n));
        buffer.consume(n);
        if (echoed != line)
            ++progress.failures;
        ++progress.lines;
    }
}

asio::awaitable<void> ticker(Progress& progress) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    while (progress.running != 0) {
        timer.expires_after(std::chrono::milliseconds(100));
        co_await timer.async_wait(asio::use_awaitable);
        ++progress.ticks;
        fmt::print("async_mixed: {} RDMA operations, {} echoed lines, {} workers left\n", progress.rdma_ops,
                   progress.lines, progress.running);
    }
}

int run(async::CompletionMode mode, std::size_t rounds) {
    std::error_code ignored;
    if (std::filesystem::directory_iterator("/sys/class/infiniband", ignored) == std::filesystem::directory_iterator()) {
        fmt::print("async_mixed: no RDMA device here: skipped (run it with scripts/vm/run.sh)\n");
        return 77; // what a test runner reads as skipped
    }
    asio::io_context io(1);
    auto context = Context::open();
    if (!context) {
        fmt::print(stderr, "async_mixed: {}\n", context.error().message());
        return 1;
    }
    auto pd = ProtectionDomain::create(*context);
    auto cq = async::CompletionQueue::create(io, *context, {.depth = 2 * pairs * 2 * (in_flight + 1)}, {.mode = mode});
    // per worker: what it writes and what it reads back; from local_bytes on, the
    // targets its QP writes into (through the peer QP, in this same region)
    const std::size_t workers = 2 * pairs * in_flight, local_bytes = workers * 2 * bytes;
    auto memory = MemoryRegion::allocate(*pd, local_bytes + workers * bytes, access_all);
    if (!pd || !cq || !memory) {
        fmt::print(stderr, "async_mixed: setting up the device failed\n");
        return 1;
    }
    std::vector<async::QueuePair> qps;
    for (std::size_t i = 0; i < 2 * pairs; ++i) {
        auto qp = QueuePair::create(*pd, {.send_cq = &cq->get(), .recv_cq = &cq->get(),
                                          .caps = {.max_send_wr = in_flight, .max_recv_wr = 1}});
        if (!qp) {
            fmt::print(stderr, "async_mixed: {}\n", qp.error().message());
            return 1;
        }
        qps.push_back(async::QueuePair::attach(std::move(*qp), *cq, *cq));
    }
    for (std::size_t i = 0; i < 2 * pairs; i += 2)
        if (auto a = qps[i].get().connect(qps[i + 1].get().endpoint()),
            b = qps[i + 1].get().connect(qps[i].get().endpoint());
            !a || !b) {
            fmt::print(stderr, "async_mixed: connecting a pair failed\n");
            return 1;
        }
    Progress progress;
    const RemoteMemory remote = memory->remote();
    for (std::size_t q = 0; q < qps.size(); ++q)
        for (std::size_t w = 0; w < in_flight; ++w) {
            const std::size_t slot = q * in_flight + w;
            ++progress.running;
            asio::co_spawn(io, rdma_worker(qps[q], *memory, remote.slice(local_bytes, workers * bytes), slot, rounds,
                                           progress),
                           tutorial::rethrow);
        }
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    asio::co_spawn(io, echo_server(acceptor), tutorial::rethrow);
    asio::co_spawn(io, echo_client(acceptor.local_endpoint(), progress), tutorial::rethrow);
    asio::co_spawn(io, ticker(progress), tutorial::rethrow);
    io.run();
    // the socket and the timer made progress while the RDMA workers ran (the client
    // sends 3 lines after they ended): a CQ that never runs dry did not starve them
    const bool ok = progress.failures == 0 && progress.rdma_ops == 2 * rounds * qps.size() * in_flight &&
                    progress.lines > 3 && progress.ticks > 1;
    fmt::print("async_mixed: {}: {} RDMA operations on {} QPs, {} lines echoed over TCP, {} timer ticks, one "
               "thread ({} completions)\n",
               ok ? "ok" : "FAILED", progress.rdma_ops, qps.size(), progress.lines, progress.ticks,
               mode == async::CompletionMode::busy ? "busy" : mode == async::CompletionMode::hybrid ? "hybrid" : "event");
    return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
    async::CompletionMode mode = async::CompletionMode::event;
    std::size_t rounds = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i], value = argv[i + 1];
        if (flag == "--mode" && value == "busy")
            mode = async::CompletionMode::busy;
        else if (flag == "--mode" && value == "hybrid")
            mode = async::CompletionMode::hybrid;
        else if (flag == "--mode" && value == "event")
            mode = async::CompletionMode::event;
        else if (flag == "--rounds" && std::from_chars(value.data(), value.data() + value.size(), rounds).ec == std::errc{})
            continue;
        else {
            fmt::print(stderr, "usage: async_mixed [--mode event|busy|hybrid] [--rounds N]\n");
            return 2;
        }
    }
    return run(mode, rounds);
}
