#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <limits>

#include <fmt/format.h>

#include <cli/flag.hpp>

namespace rdmaxx::perf {
namespace {

constexpr std::string_view verb_names[] = {"write", "read", "send", "write_imm", "atomic", "rpc"};

Error invalid(std::string detail) { return Error::from_errno("options", EINVAL, std::move(detail)); }

Result<std::uint64_t> number(std::string_view flag, std::string_view text, std::uint64_t low, std::uint64_t high) {
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size() || text.empty())
        return std::unexpected(invalid(fmt::format("{} takes a number, not '{}'", flag, text)));
    if (value < low || value > high)
        return std::unexpected(invalid(fmt::format("{} {} outside {}..{}", flag, value, low, high)));
    return value;
}

Result<Mtu> mtu_of(std::string_view text) {
    constexpr std::pair<std::string_view, Mtu> mtus[] = {
        {"256", Mtu::b256}, {"512", Mtu::b512}, {"1024", Mtu::b1024}, {"2048", Mtu::b2048}, {"4096", Mtu::b4096}};
    for (const auto& [name, mtu] : mtus)
        if (text == name)
            return mtu;
    return std::unexpected(invalid(fmt::format("--mtu takes 256, 512, 1024, 2048 or 4096, not '{}'", text)));
}

// A checked number into a flag's field: an integer, an optional one, milliseconds.
template <class T>
void store(T& out, std::uint64_t n) {
    out = static_cast<T>(n);
}
template <class T>
void store(std::optional<T>& out, std::uint64_t n) {
    out = static_cast<T>(n);
}
void store(std::chrono::milliseconds& out, std::uint64_t n) { out = std::chrono::milliseconds(n); }

} // namespace

std::string_view verb_name(Verb verb) noexcept { return verb_names[static_cast<int>(verb)]; }

std::string test_name(Test test) {
    return fmt::format("{}_{}", verb_name(test.verb), test.measure == Measure::latency ? "lat" : "bw");
}

std::optional<Test> parse_test(std::string_view name) {
    for (int v = 0; v <= static_cast<int>(Verb::rpc); ++v)
        for (const Measure m : {Measure::latency, Measure::bandwidth})
            if (const Test t{static_cast<Verb>(v), m}; test_name(t) == name)
                return t;
    return std::nullopt;
}

std::vector<std::uint32_t> sweep_sizes(Verb verb) {
    if (verb == Verb::atomic)
        return {atomic_size};
    std::vector<std::uint32_t> sizes;
    for (std::uint32_t s = min_size; s <= (verb == Verb::rpc ? rpc_max_size : max_size); s *= 2)
        sizes.push_back(s);
    return sizes;
}

std::uint32_t signal_interval(const Options& options, std::uint32_t size) {
    const std::uint32_t list = options.post_list;
    const std::uint32_t wanted = size > signal_every_wr_above ? 1 : options.cq_mod;
    const std::uint32_t rounded = (wanted + list - 1) / list * list;
    return std::min(rounded, options.tx_depth / list * list);
}

std::uint32_t default_inline(Test test, bool mlx5, std::uint32_t device_limit) {
    if (test.measure == Measure::bandwidth || test.verb == Verb::read || test.verb == Verb::atomic)
        return 0;
    if (!mlx5)
        return device_limit;
    return std::min(device_limit, test.verb == Verb::send ? 236u : 220u);
}

std::string_view async_mode_name(AsyncMode mode) noexcept {
    switch (mode) {
    case AsyncMode::off: return "off";
    case AsyncMode::busy: return "busy";
    case AsyncMode::event: return "event";
    case AsyncMode::hybrid: return "hybrid";
    }
    return "?";
}

std::string_view call_form_name(CallForm form) noexcept {
    switch (form) {
    case CallForm::awaitable: return "asio::awaitable";
    case CallForm::task: return "async::Task";
    case CallForm::callback: return "callbacks";
    }
    return "?";
}

std::string usage() {
    return "usage: rdmaxx-perf TEST [HOST] [options]\n"
           "  TEST: write_lat write_bw read_lat read_bw send_lat send_bw write_imm_lat write_imm_bw\n"
           "        atomic_lat atomic_bw rpc_lat rpc_bw\n"
           "  without HOST: serve one client (the client's run parameters apply); with HOST: the client\n"
           "  -d, --ib-dev NAME       device (default $RDMAXX_DEVICE, else the first)\n"
           "  -i, --ib-port N         device port (1)\n"
           "  -x, --gid-index N       GID index (default: the RoCE v2 IPv4 entry, or 0 on InfiniBand)\n"
           "  -p, --port N            TCP port of the exchange, or the RDMA CM port (18515)\n"
           "  -R, --rdma_cm           connect the QPs through RDMA CM\n"
           "  -s, --size N            message size in bytes (2..8388608; 65536 for bandwidth, 2 for latency;\n"
           "                          RPC tests: each way, 2..1048576, 32)\n"
           "  -a, --all               sweep 2 B .. 8 MiB (RPC tests: .. 1 MiB)\n"
           "  -n, --iters N           iterations (1000 latency, 5000 bandwidth)\n"
           "  -t, --tx-depth N        send queue depth (1 latency, 128 bandwidth)\n"
           "  -r, --rx-depth N        receives posted (512)\n"
           "  -l, --post_list N       WRs per doorbell, bandwidth (1, at most 64; divides the TX depth)\n"
           "  -Q, --cq-mod N          signal one WR in N (100): bandwidth (every WR above 8 KiB) and,\n"
           "                          as perftest, latency SEND/WRITE_IMM\n"
           "  -I, --inline_size N     inline up to N bytes (latency: 220 WRITE / 236 SEND on mlx5, the\n"
           "                          device's limit elsewhere; 0 for bandwidth)\n"
           "  -m, --mtu N             path MTU 256..4096 (default: both ports' active MTU)\n"
           "  -q, --qp N              QPs, bandwidth (1)\n"
           "  -A, --atomic_type T     FETCH_AND_ADD (default) or CMP_AND_SWAP\n"
           "      --async MODE        the client's loop on lib/async: busy, event or hybrid (read_lat,\n"
           "                          atomic_lat, write_bw, read_bw, atomic_bw): each post list one\n"
           "                          awaited operation, its last WR signaled\n"
           "      --timeout MS        longest the peer may stay silent (10000)\n"
           "      --json              one JSON object per result line\n"
           "  RPC tests (rpc_lat: one call at a time, its round trip; rpc_bw: calls per second), lib/rpc's\n"
           "  calls of SIZE bytes each way to an echo handler; the server serves until its client's\n"
           "  sessions end, the --async mode applies to each side's own endpoint (busy by default):\n"
           "  -w, --window N          calls in flight per session, rpc_bw (32; at most 1024)\n"
           "      --sessions N        sessions, rpc_bw (1; at most 64): N x WINDOW calls in flight\n"
           "      --one-way           calls to a handler that answers empty: SIZE bytes one way\n"
           "      --callbacks         each call completes to a callback that makes the next call (lib/rpc's\n"
           "                          callback form), not to a coroutine that co_awaits it\n"
           "      --task              each call is co_awaited by an rdmaxx::async::Task (use_task), not by\n"
           "                          an asio::awaitable\n"
           "      --rdma-threshold N  bytes above which a message takes the session's RC path (lib/rpc's\n"
           "                          default, 16384); both sides should give the same\n"
           "      --windows           the client lends its memory through memory windows bound per call\n"
           "                          (EndpointOptions::lend_through_windows)\n";
}

Result<Options> parse_options(std::span<const std::string_view> args) {
    Options o;
    std::vector<std::string_view> positional;
    std::optional<std::uint32_t> size, iters, tx_depth, window;
    bool all = false;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const cli::Flag flag = cli::split_flag(args[i]);
        const std::string_view arg = flag.name;
        const auto is = [&](std::string_view shorter, std::string_view longer) { return flag.is(shorter, longer); };
        std::optional<Error> missing;
        const auto value = [&]() -> std::string_view {
            if (const auto v = cli::flag_value(flag, args, i))
                return *v;
            missing = invalid(fmt::format("{} needs a value", arg));
            return {};
        };
        // Each numeric flag: its value in [low, high], stored in `out`.
        const auto take = [&](auto& out, std::uint64_t low, std::uint64_t high) -> Result<void> {
            const std::string_view text = value();
            if (missing)
                return std::unexpected(*missing);
            auto n = number(arg, text, low, high);
            if (!n)
                return std::unexpected(n.error());
            store(out, *n);
            return {};
        };
        Result<void> ok;
        if (is("-h", "--help")) {
            o.help = true;
            return o;
        } else if (is("-a", "--all")) {
            all = true;
        } else if (is("-R", "--rdma_cm")) {
            o.rdma_cm = true;
        } else if (is("", "--json")) {
            o.json = true;
        } else if (is("-d", "--ib-dev")) {
            o.device = value();
        } else if (is("-i", "--ib-port")) {
            ok = take(o.ib_port, 1, 255);
        } else if (is("-x", "--gid-index")) {
            ok = take(o.gid_index, 0, 255); // ibv_ah_attr's sgid_index: 8 bits
        } else if (is("-p", "--port")) {
            ok = take(o.port, 1, 65535);
        } else if (is("-s", "--size")) {
            ok = take(size, min_size, max_size);
        } else if (is("-n", "--iters")) {
            ok = take(iters, 5, 100'000'000);
        } else if (is("-t", "--tx-depth")) {
            ok = take(tx_depth, 1, 16384);
        } else if (is("-r", "--rx-depth")) {
            ok = take(o.rx_depth, 1, 16384);
        } else if (is("-l", "--post_list")) {
            ok = take(o.post_list, 1, max_post_list);
        } else if (is("-Q", "--cq-mod")) {
            ok = take(o.cq_mod, 1, 16384);
        } else if (is("-I", "--inline_size")) {
            ok = take(o.inline_size, 0, 16384);
        } else if (is("-q", "--qp")) {
            ok = take(o.qps, 1, max_qps);
        } else if (is("-w", "--window")) {
            ok = take(window, 1, rpc_max_window);
        } else if (is("", "--sessions")) {
            ok = take(o.sessions, 1, rpc_max_sessions);
        } else if (is("", "--one-way")) {
            o.one_way = true;
        } else if (is("", "--callbacks")) {
            o.form = CallForm::callback;
        } else if (is("", "--task")) {
            o.form = CallForm::task;
        } else if (is("", "--rdma-threshold")) {
            ok = take(o.rdma_threshold, 0, rpc_max_size);
        } else if (is("", "--windows")) {
            o.windows = true;
        } else if (is("", "--timeout")) {
            ok = take(o.timeout, 100, 3'600'000);
        } else if (is("-m", "--mtu")) {
            const std::string_view text = value();
            auto mtu = missing ? Result<Mtu>(std::unexpected(*missing)) : mtu_of(text);
            if (!mtu)
                return std::unexpected(mtu.error());
            o.mtu = *mtu;
        } else if (is("", "--async")) {
            const std::string_view text = value();
            if (text == "busy")
                o.async = AsyncMode::busy;
            else if (text == "event")
                o.async = AsyncMode::event;
            else if (text == "hybrid")
                o.async = AsyncMode::hybrid;
            else
                return std::unexpected(invalid(fmt::format("--async takes busy, event or hybrid, not '{}'", text)));
        } else if (is("-A", "--atomic_type")) {
            const std::string_view text = value();
            if (text == "FETCH_AND_ADD")
                o.atomic = AtomicOp::fetch_add;
            else if (text == "CMP_AND_SWAP")
                o.atomic = AtomicOp::compare_swap;
            else
                return std::unexpected(invalid(
                    fmt::format("--atomic_type takes FETCH_AND_ADD or CMP_AND_SWAP, not '{}'", text)));
        } else if (arg.starts_with("-") && arg.size() > 1) {
            return std::unexpected(invalid(fmt::format("unknown option {}", arg)));
        } else {
            positional.push_back(arg);
        }
        if (missing)
            return std::unexpected(*missing);
        if (!ok)
            return std::unexpected(ok.error());
    }
    if (positional.empty() || positional.size() > 2)
        return std::unexpected(invalid("give a TEST, and HOST for the client"));
    const auto test = parse_test(positional[0]);
    if (!test)
        return std::unexpected(invalid(fmt::format("unknown test '{}'", positional[0])));
    o.test = *test;
    if (positional.size() == 2)
        o.host = positional[1];

    const bool latency = o.test.measure == Measure::latency;
    const bool rpc = o.test.verb == Verb::rpc;
    if (rpc) {
        if (size && *size > rpc_max_size)
            return std::unexpected(invalid(fmt::format("RPC tests move at most {} bytes each way", rpc_max_size)));
        if (o.qps != 1 || o.post_list != 1 || tx_depth || o.rdma_cm || o.inline_size || o.mtu)
            return std::unexpected(invalid("RPC tests take --window and --sessions, not --qp, --post_list, "
                                           "--tx-depth, --rdma_cm, --inline_size or --mtu"));
        if (latency && (o.sessions != 1 || window.value_or(1) != 1))
            return std::unexpected(invalid("rpc_lat makes one call at a time (--window 1, --sessions 1)"));
        o.window = window.value_or(latency ? 1 : 32);
        if (o.async == AsyncMode::off)
            o.async = AsyncMode::busy;
    } else if (window || o.sessions != 1 || o.one_way || o.form != CallForm::awaitable || o.rdma_threshold || o.windows) {
        return std::unexpected(
            invalid("--window, --sessions, --one-way, --callbacks, --task, --rdma-threshold and --windows are the RPC "
                    "tests' (rpc_lat, rpc_bw)"));
    }
    if (o.test.verb == Verb::atomic && size && *size != atomic_size)
        return std::unexpected(invalid("atomics move 8 bytes: --size must be 8 or absent"));
    if (all && size)
        return std::unexpected(invalid("--size and --all exclude each other"));
    if (all)
        o.sizes = sweep_sizes(o.test.verb);
    else
        o.sizes = {o.test.verb == Verb::atomic ? atomic_size
                                                : size.value_or(rpc ? rpc_default_size : latency ? 2 : 65536)};
    o.iters = iters.value_or(latency ? 1000 : 5000);
    o.tx_depth = tx_depth.value_or(latency ? 1 : 128); // perftest's: one WR at a time in latency tests
    if (latency && o.qps != 1)
        return std::unexpected(invalid("latency tests use one QP (--qp 1)"));
    if (latency && o.post_list != 1)
        return std::unexpected(invalid("latency tests post one WR at a time (--post_list 1)"));
    if (o.post_list > o.tx_depth || o.tx_depth % o.post_list != 0)
        return std::unexpected(
            invalid(fmt::format("--post_list {} must divide --tx-depth {}", o.post_list, o.tx_depth)));
    // the async loop awaits its own completions: the ping-pong and two-sided tests
    // wait on the peer's data or receives, which is the data layer's loop
    const bool one_sided = o.test.verb == Verb::read || o.test.verb == Verb::atomic ||
                           (o.test.verb == Verb::write && !latency);
    if (o.async != AsyncMode::off && !one_sided && !rpc)
        return std::unexpected(invalid(fmt::format(
            "--async runs read_lat, atomic_lat, write_bw, read_bw, atomic_bw and the RPC tests, not {}",
            test_name(o.test))));
    if (o.inline_size && *o.inline_size != 0 && (o.test.verb == Verb::read || o.test.verb == Verb::atomic))
        return std::unexpected(invalid("READ and atomics cannot be inline: --inline_size 0 or absent"));
    return o;
}

} // namespace rdmaxx::perf
