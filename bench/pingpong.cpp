// pingpong: WRITE and SEND ping-pong latency, READ and fetch-and-add latency, and WRITE
// bandwidth on rdmaxx's data layer, measured the way perftest measures them, so the
// figures compare with ib_write_lat, ib_send_lat, ib_read_lat, ib_atomic_lat and
// ib_write_bw run on the same device.
//
//   pingpong [--test write_lat|send_lat|read_lat|atomic_lat|write_bw|all] [--size N | --sweep] [--iters N]
//            [--device NAME] [--json]
//
// Two RC QPs of one process, each side busy-polling in its own thread. Latency: a
// timestamp per iteration on the initiator, samples are the differences of
// consecutive ones halved (a round trip is two one-way trips), the two largest
// dropped; t_typical is the median. Bandwidth: bytes x iterations / (last completion
// - first post), one signaled WR per 100 (every WR above 8 KiB), TX depth 128.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>
#include <rdmaxx/data/signaling.hpp>
#include <rdmaxx/wrap.hpp>

using namespace rdmaxx;
using Clock = std::chrono::steady_clock;

namespace {

template <class T>
T must(Result<T> result, std::string_view what) {
    if (!result) {
        fmt::print(stderr, "pingpong: {}: {}\n", what, result.error());
        std::exit(1);
    }
    if constexpr (!std::is_void_v<T>)
        return std::move(*result);
}

constexpr std::uint32_t tx_depth = 128;

// A side's region: what it sends from [0, size), what the peer writes or sends into
// at [half, half + size).
struct Side {
    CompletionQueue cq;
    QueuePair qp;
    MemoryRegion mr;
    std::uint32_t receives_posted = 0;
    std::size_t half() const { return mr.size() / 2; }
    std::byte* inbox() const { return mr.data() + half(); }
};

// Both ends, connected, with inline data as large as the device grants (up to 220 B,
// perftest's WRITE latency default on mlx5).
struct Bench {
    Context context;
    ProtectionDomain pd;
    Side a, b;

    static Side make_side(const Context& context, const ProtectionDomain& pd, std::size_t bytes) {
        CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 2 * tx_depth + 16}), "create CQ");
        for (const std::uint32_t inline_bytes : {220u, 64u, 0u}) {
            auto qp = QueuePair::create(pd, {.send_cq = &cq,
                                             .recv_cq = &cq,
                                             .caps = {.max_send_wr = tx_depth,
                                                      .max_recv_wr = tx_depth,
                                                      .max_inline_data = inline_bytes}});
            if (qp)
                return {std::move(cq), std::move(*qp), must(MemoryRegion::allocate(pd, bytes, access_all), "allocate"), 0};
        }
        fmt::print(stderr, "pingpong: no QP could be created\n");
        std::exit(1);
    }

    Bench(const std::string& device, std::size_t bytes)
        : context(must(Context::open(device), "open device")), pd(must(ProtectionDomain::create(context), "PD")),
          a(make_side(context, pd, bytes)), b(make_side(context, pd, bytes)) {
        must(a.qp.connect(b.qp.endpoint()), "connect A");
        must(b.qp.connect(a.qp.endpoint()), "connect B");
    }
};

PostOptions post_options(const QueuePair& qp, std::size_t size, std::uint64_t wr_id) {
    return {.wr_id = wr_id, .signaled = true, .inline_data = size <= qp.caps().max_inline_data};
}

// Spins until the last byte of `bytes` holds `tag`.
void spin_for(const std::byte* last, std::byte tag) {
    while (std::atomic_ref(*const_cast<std::byte*>(last)).load(std::memory_order_acquire) != tag) {
    }
}

// Takes completions until one of opcode `wanted` arrives; the others (the side's own
// send completions) are checked and dropped.
void reap(CompletionQueue& cq, WcOpcode wanted) {
    std::array<WorkCompletion, 1> wc;
    for (;;) {
        if (must(poll(cq, wc), "poll") == 1) {
            must(wc[0].check(), "completion");
            if (wc[0].opcode() == wanted)
                return;
        }
    }
}

struct Latency {
    double t_min, t_max, t_typical, t_avg, p99, p999;
};

Latency summarize(std::vector<double> samples) {
    std::sort(samples.begin(), samples.end());
    if (samples.size() > 2)
        samples.resize(samples.size() - 2); // perftest drops the two largest
    const auto at = [&](double q) {
        const auto i = static_cast<std::size_t>(std::ceil(static_cast<double>(samples.size()) * q));
        return samples[std::min(i, samples.size() - 1)];
    };
    double sum = 0;
    for (double s : samples)
        sum += s;
    return {samples.front(), samples.back(), samples[samples.size() / 2], sum / static_cast<double>(samples.size()),
            at(0.99), at(0.999)};
}

// Latency samples (us) from the initiator's per-iteration timestamps: halved for a
// ping-pong (a round trip is two one-way trips), whole for READ and atomics, whose
// one operation is itself the round trip (perftest does the same).
std::vector<double> samples_of(const std::vector<Clock::time_point>& stamps, double divisor = 2) {
    std::vector<double> samples;
    for (std::size_t i = 1; i < stamps.size(); ++i)
        samples.push_back(std::chrono::duration<double, std::micro>(stamps[i] - stamps[i - 1]).count() / divisor);
    return samples;
}

// READ or fetch-and-add latency: one operation at a time, the initiator alone.
Latency one_sided_lat(Bench& bench, std::size_t size, std::size_t iters, bool atomic) {
    Side& a = bench.a;
    Side& b = bench.b;
    for (std::size_t i = 0; i < size; ++i)
        b.mr.data()[i] = static_cast<std::byte>(i * 7 + 3);
    std::uint64_t start_value = 0;
    std::memcpy(&start_value, b.inbox(), 8);
    std::vector<Clock::time_point> stamps(iters + 1);
    for (std::size_t i = 0; i < iters; ++i) {
        stamps[i] = Clock::now();
        if (atomic)
            must(post_fetch_add(a.qp, a.mr.slice(a.half(), 8), b.mr.remote().slice(b.half(), 8), 1, {.wr_id = i}),
                 "post_fetch_add");
        else
            must(post_read(a.qp, a.mr.slice(a.half(), size), b.mr.remote().slice(0, size), {.wr_id = i}), "post_read");
        reap(a.cq, atomic ? WcOpcode::fetch_add : WcOpcode::rdma_read);
    }
    stamps[iters] = Clock::now();
    std::uint64_t end_value = 0, last_old = 0;
    std::memcpy(&end_value, b.inbox(), 8);
    std::memcpy(&last_old, a.inbox(), 8);
    const bool right = atomic ? end_value == start_value + iters && last_old == end_value - 1
                              : std::memcmp(a.inbox(), b.mr.data(), size) == 0;
    if (!right) {
        fmt::print(stderr, "pingpong: {} moved wrong bytes\n", atomic ? "atomic_lat" : "read_lat");
        std::exit(1);
    }
    return summarize(samples_of(stamps, 1));
}

Latency write_lat(Bench& bench, std::size_t size, std::size_t iters) {
    Side& a = bench.a;
    Side& b = bench.b;
    std::fill_n(a.mr.data(), size, std::byte{0x5a});
    std::fill_n(b.mr.data(), size, std::byte{0xa5});
    std::fill_n(a.inbox(), size, std::byte{0});
    std::fill_n(b.inbox(), size, std::byte{0});
    // each side writes its payload into the other's inbox; the last byte is the
    // iteration's tag, which the receiver spins on
    const auto tag = [](std::size_t i) { return static_cast<std::byte>(i % 255 + 1); };
    std::thread responder([&] {
        for (std::size_t i = 0; i < iters; ++i) {
            spin_for(b.inbox() + size - 1, tag(i));
            b.mr.data()[size - 1] = tag(i);
            must(post_write(b.qp, b.mr.slice(0, size), a.mr.remote().slice(a.half(), size), post_options(b.qp, size, i)),
                 "post_write B");
            reap(b.cq, WcOpcode::rdma_write);
        }
    });
    std::vector<Clock::time_point> stamps(iters + 1);
    for (std::size_t i = 0; i < iters; ++i) {
        a.mr.data()[size - 1] = tag(i);
        stamps[i] = Clock::now();
        must(post_write(a.qp, a.mr.slice(0, size), b.mr.remote().slice(b.half(), size), post_options(a.qp, size, i)),
             "post_write A");
        reap(a.cq, WcOpcode::rdma_write);
        spin_for(a.inbox() + size - 1, tag(i));
    }
    stamps[iters] = Clock::now();
    responder.join();
    if (std::memcmp(a.inbox(), b.mr.data(), size) != 0 || std::memcmp(b.inbox(), a.mr.data(), size) != 0) {
        fmt::print(stderr, "pingpong: write_lat moved wrong bytes\n");
        std::exit(1);
    }
    return summarize(samples_of(stamps));
}

Latency send_lat(Bench& bench, std::size_t size, std::size_t iters) {
    Side& a = bench.a;
    Side& b = bench.b;
    std::fill_n(a.mr.data(), size, std::byte{0x11});
    std::fill_n(b.mr.data(), size, std::byte{0x22});
    // receives posted ahead, into the inbox (as large as the largest message): each
    // side always has some waiting, and reposts one per message
    const auto repost = [](Side& s) { must(post_recv(s.qp, s.mr.slice(s.half(), s.half()), 0), "post_recv"); };
    for (Side* s : {&a, &b})
        for (; s->receives_posted < 16; ++s->receives_posted)
            repost(*s);
    std::thread responder([&] {
        for (std::size_t i = 0; i < iters; ++i) {
            reap(b.cq, WcOpcode::recv);
            repost(b);
            must(post_send(b.qp, b.mr.slice(0, size), post_options(b.qp, size, i)), "post_send B");
        }
        reap(b.cq, WcOpcode::send); // the last send's completion
    });
    std::vector<Clock::time_point> stamps(iters + 1);
    for (std::size_t i = 0; i < iters; ++i) {
        stamps[i] = Clock::now();
        must(post_send(a.qp, a.mr.slice(0, size), post_options(a.qp, size, i)), "post_send A");
        reap(a.cq, WcOpcode::recv);
        repost(a);
    }
    stamps[iters] = Clock::now();
    responder.join();
    if (std::memcmp(a.inbox(), b.mr.data(), size) != 0 || std::memcmp(b.inbox(), a.mr.data(), size) != 0) {
        fmt::print(stderr, "pingpong: send_lat moved wrong bytes\n");
        std::exit(1);
    }
    return summarize(samples_of(stamps));
}

struct Bandwidth {
    double mb_per_s, gbit_per_s, mpps;
};

Bandwidth write_bw(Bench& bench, std::size_t size, std::size_t iters) {
    Side& a = bench.a;
    for (std::size_t i = 0; i < size; ++i)
        a.mr.data()[i] = static_cast<std::byte>(i * 13 + 1);
    SignaledSendQueue sq(a.qp, a.cq, size > 8192 ? 1 : 100);
    const auto start = Clock::now();
    for (std::size_t i = 0; i < iters; ++i) {
        const PostOptions options = must(sq.next({.wr_id = i, .inline_data = size <= a.qp.caps().max_inline_data},
                                                 i + 1 == iters),
                                         "send queue");
        must(post_write(a.qp, a.mr.slice(0, size), bench.b.mr.remote().slice(0, size), options), "post_write");
    }
    must(sq.drain(), "drain");
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (std::memcmp(a.mr.data(), bench.b.mr.data(), size) != 0) {
        fmt::print(stderr, "pingpong: write_bw moved wrong bytes\n");
        std::exit(1);
    }
    const double bytes = static_cast<double>(size) * static_cast<double>(iters);
    return {bytes / seconds / (1 << 20), bytes * 8 / seconds / 1e9, static_cast<double>(iters) / seconds / 1e6};
}

} // namespace

int main(int argc, char** argv) {
    std::string test = "all", device;
    std::vector<std::size_t> sizes{64};
    std::size_t iters = 1000;
    bool sweep = false, json = false;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const auto value = [&] {
            if (i + 1 >= argc) {
                fmt::print(stderr, "pingpong: {} needs a value\n", arg);
                std::exit(2);
            }
            return std::string(argv[++i]);
        };
        if (arg == "--test")
            test = value();
        else if (arg == "--size")
            sizes = {std::stoul(value())};
        else if (arg == "--iters")
            iters = std::stoul(value());
        else if (arg == "--device")
            device = value();
        else if (arg == "--sweep")
            sweep = true;
        else if (arg == "--json")
            json = true;
        else {
            fmt::print(stderr, "usage: pingpong [--test write_lat|send_lat|read_lat|atomic_lat|write_bw|all] [--size N | --sweep] "
                               "[--iters N] [--device NAME] [--json]\n");
            return 2;
        }
    }
    const std::vector<std::string_view> latency_tests{"write_lat", "send_lat", "read_lat", "atomic_lat"};
    if (test != "all" && test != "write_bw" &&
        std::find(latency_tests.begin(), latency_tests.end(), test) == latency_tests.end()) {
        fmt::print(stderr, "pingpong: unknown test '{}'\n", test);
        return 2;
    }
    if (iters < 3 || sizes.front() < 2) {
        fmt::print(stderr, "pingpong: at least 3 iterations of at least 2 bytes\n");
        return 2;
    }
    const std::size_t largest = sweep ? (1u << 20) : sizes.front();
    Bench bench(device, 2 * largest);
    const auto sweep_sizes = [&](std::size_t top) {
        std::vector<std::size_t> s;
        for (std::size_t n = 2; n <= top; n *= 2)
            s.push_back(n);
        return s;
    };
    if (test == "all" || test.ends_with("_lat")) {
        for (const std::string_view name : latency_tests) {
            if (test != "all" && test != name)
                continue;
            if (!json)
                fmt::print("{} on {}: {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  [usec]\n", name, bench.context.name(),
                           "#bytes", "#iters", "t_min", "t_max", "t_typical", "t_avg", "p99", "p99.9");
            // atomics move 8 bytes, whatever the size asked for
            const auto test_sizes = name == "atomic_lat" ? std::vector<std::size_t>{8}
                                    : sweep              ? sweep_sizes(64 << 10)
                                                         : sizes;
            for (const std::size_t size : test_sizes) {
                const Latency l = name == "write_lat"  ? write_lat(bench, size, iters)
                                  : name == "send_lat" ? send_lat(bench, size, iters)
                                                       : one_sided_lat(bench, size, iters, name == "atomic_lat");
                if (json)
                    fmt::print("{{\"test\":\"{}\",\"size\":{},\"iters\":{},\"t_min\":{:.3f},\"t_max\":{:.3f},"
                               "\"t_typical\":{:.3f},\"t_avg\":{:.3f},\"p99\":{:.3f},\"p99_9\":{:.3f}}}\n",
                               name, size, iters, l.t_min, l.t_max, l.t_typical, l.t_avg, l.p99, l.p999);
                else
                    fmt::print("{:>{}} {:>8} {:>8} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f}\n", "",
                               name.size() + 4 + bench.context.name().size(), size, iters, l.t_min, l.t_max,
                               l.t_typical, l.t_avg, l.p99, l.p999);
            }
        }
    }
    if (test == "all" || test == "write_bw") {
        if (!json)
            fmt::print("write_bw on {}: {:>8} {:>8} {:>12} {:>10} {:>10}\n", bench.context.name(), "#bytes", "#iters",
                       "BW[MiB/s]", "BW[Gb/s]", "MsgRate[Mpps]");
        for (const std::size_t size : sweep ? sweep_sizes(1 << 20) : sizes) {
            const Bandwidth bw = write_bw(bench, size, iters);
            if (json)
                fmt::print("{{\"test\":\"write_bw\",\"size\":{},\"iters\":{},\"mib_per_s\":{:.3f},\"gbit_per_s\":{:.4f},"
                           "\"mpps\":{:.5f}}}\n",
                           size, iters, bw.mb_per_s, bw.gbit_per_s, bw.mpps);
            else
                fmt::print("{:>{}} {:>8} {:>8} {:>12.2f} {:>10.4f} {:>10.5f}\n", "", 13 + bench.context.name().size(),
                           size, iters, bw.mb_per_s, bw.gbit_per_s, bw.mpps);
        }
    }
    return 0;
}
