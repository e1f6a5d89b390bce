#!/usr/bin/env python3
"""compare.py - perftest and rdmaxx-perf side by side: the same device, sizes and knobs,
in the same run, alternating A B A B, so that drift of the machine hits both alike.
Prints one table (per test and size: perftest's figure, rdmaxx's, and the ratio) and
writes it with the raw figures and a plot into OUT.

  compare.py --perf BUILD/bench/rdmaxx-perf [--out DIR] [--sizes 2,64,... | all]
             [--rounds N (5)] [--max-rounds M (10)] [--tests write_lat,...] [--keep]
             [--async busy|event|hybrid [--post-list L (1)]]

With --async MODE the two sides are rdmaxx-perf's own loop on the data layer ("sync",
in perftest's column) and its loop on lib/async in MODE ("async"), for the tests
--async runs; the table (with the async runs' CPU time per operation) goes to
OUT/async-MODE.md and .json (async-MODE-lL.* for a post list L > 1), and there is no
plot. Both sides of a bandwidth test issue the same verbs: post lists of L WRs, one
doorbell each, the last WR of each signaled (sync: -l L -Q L; async: each list one
awaited operation, tx_depth / L of them in flight), so that the ratio is the cost of
awaiting, not a different signaling pattern. With L = 1 the async side awaits every WR
as its own operation (qp.write() and the like), and lib/async posts the ones that one
poll's completions start with one doorbell (its held sends): fewer doorbells than the
sync loop rings, which is the library's doing, not the benchmark's.

Latency compares t_typical (the median; ratio rdmaxx/perftest, lower is better),
bandwidth the average MiB/s, read from whichever printed figure is more precise
(perftest prints MiB/s with two decimals, 0.09 at 2 bytes, and Mpps with six,
0.000047 at 1 MiB). Ratio rdmaxx/perftest, higher is better. Each tool's figure is its best run of the N rounds, with the median ratio
beside it: under software emulation a whole run lands in one of a few modes (e.g.
13 us or 17 us for the same test), and the best run compares the tools, not the modes.
Where either tool's runs spread over more than 10 %, both go on alternating, up to M
rounds, so that each has its chance at the fast mode.
Server and client are pinned to CPUs 0 and 1 when there are two. Server and
client run on this machine's device ($RDMAXX_DEVICE, else the first); on RoCE both
use the GID index $RDMAXX_GID_INDEX (the VM sets it). WRITE_WITH_IMM has no perftest
counterpart (perftest 4.5): rdmaxx's figures alone, perftest's WRITE run beside them
in the same alternation so that both tools see the same machine."""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

# test: (perftest program, knobs given to both tools). Inline is asked for explicitly
# (perftest's mlx5 latency defaults, none for bandwidth), and rdmaxx then gets what
# perftest really used: perftest disables inline on devices it does not know (rxe).
TESTS = {
    "write_lat": ("ib_write_lat", ["-I", "220"]),
    "send_lat": ("ib_send_lat", ["-I", "236"]),
    "read_lat": ("ib_read_lat", []),
    "atomic_lat": ("ib_atomic_lat", ["-A", "FETCH_AND_ADD"]),
    "write_imm_lat": ("ib_write_lat", ["-I", "220"]),  # perftest's WRITE figures beside it: no WRITE_WITH_IMM there
    "write_bw": ("ib_write_bw", ["-I", "0"]),
    "send_bw": ("ib_send_bw", ["-I", "0"]),
    "read_bw": ("ib_read_bw", []),
    "atomic_bw": ("ib_atomic_bw", ["-A", "FETCH_AND_ADD"]),
    "write_imm_bw": ("ib_write_bw", ["-I", "0"]),
}
ASYNC_TESTS = ["read_lat", "atomic_lat", "write_bw", "read_bw", "atomic_bw"]
ATTEMPTS = 3  # a run that fails (perftest's clock calibration under emulation) is retried
DEFAULT_SIZES = [2, 64, 1024, 16384, 262144, 1048576]
PIN_CPUS = (os.cpu_count() or 1) >= 2

port = 19000


def device_and_gid(none_here):
    """This machine's device ($RDMAXX_DEVICE, else the first) and the GID index to use
    ($RDMAXX_GID_INDEX, or the VM's; None: the tools' default); exits with `none_here`
    when there is no device."""
    devices = sorted(os.path.basename(d) for d in glob.glob("/sys/class/infiniband/*"))
    if not devices:
        sys.exit(none_here)
    device = os.environ.get("RDMAXX_DEVICE") or devices[0]
    return device, os.environ.get("RDMAXX_GID_INDEX") or os.environ.get("RDMAXX_VM_GID_INDEX")


def listening(p):
    return f":{p} " in subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout


def run_pair(server_cmd, client_cmd):
    """Server first, the client once the server listens; the client's stdout, or None
    when every attempt failed."""
    for attempt in range(ATTEMPTS):
        try:
            return run_pair_once(server_cmd, client_cmd)
        except RuntimeError as e:
            print(f"compare: attempt {attempt + 1}: {e}", file=sys.stderr, flush=True)
    return None


def pinned(cmd, cpu):
    """Server and client each on a CPU of their own, the same for both tools: without it
    the scheduler's placement (both on one CPU, or apart) decides the figure as much as
    the tool does."""
    if PIN_CPUS and shutil.which("taskset"):
        return ["taskset", "-c", str(cpu)] + cmd
    return cmd


def run_pair_once(server_cmd, client_cmd):
    global port
    port += 1
    server_cmd, client_cmd = pinned(server_cmd, 0), pinned(client_cmd, 1)
    server = subprocess.Popen(server_cmd + ["-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    for _ in range(1000):
        if listening(port) or server.poll() is not None:
            break
        time.sleep(0.01)
    client = subprocess.run(client_cmd + ["-p", str(port)], capture_output=True, text=True, timeout=900)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    if client.returncode != 0:
        raise RuntimeError(f"{' '.join(client_cmd)}: exit {client.returncode}: {client.stderr.strip()[-400:]}")
    return client.stdout


def perftest_inline(output):
    for line in output.splitlines():
        if "Max inline data" in line:
            return line.split(":")[1].strip().split("[")[0]
    return None


def scattered(runs):
    """Whether a tool's runs spread over more than 10 %: it has been seen in more than
    one mode, and more rounds give both tools a fairer chance at their best."""
    return len(runs) >= 2 and max(runs) > 1.1 * min(runs)


def mib_per_s(printed_mib, mib_decimals, printed_mpps, size):
    """The average MiB/s from whichever printed figure carries more significant digits:
    the MiB/s itself, or the message rate (six decimals) times the size. perftest
    prints MiB/s with two decimals (0.09 at 2 bytes) and Mpps with six (0.000047 at
    1 MiB): small messages need the rate, large ones the MiB/s."""
    from_rate = printed_mpps * 1e6 * size / (1 << 20)
    if printed_mpps <= 0:
        return printed_mib
    if printed_mib <= 0:
        return from_rate
    mib_error = 0.5 * 10 ** -mib_decimals / printed_mib
    rate_error = 0.5e-6 / printed_mpps
    return printed_mib if mib_error <= rate_error else from_rate


def perftest_figure(output, latency, size):
    """t_typical [us] (latency) or the average MiB/s (bandwidth) from perftest's table."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0].isdigit() and fields[1].isdigit():
            return float(fields[4]) if latency else mib_per_s(float(fields[3]), 2, float(fields[4]), size)
    raise RuntimeError(f"no result line in perftest's output:\n{output}")


def rdmaxx_figure(output, latency, size):
    row = json.loads(output.strip().splitlines()[-1])
    return row["t_typical"] if latency else mib_per_s(row["mib_per_s"], 4, row["mpps"], size)


def rdmaxx_cpu(output):
    """The async run's CPU time per operation, in us (0 for a run on the data layer)."""
    return json.loads(output.strip().splitlines()[-1]).get("cpu_us_per_op", 0)


def iterations(test, size):
    # enough samples for a stable median, few enough for software emulation
    if test.endswith("_lat"):
        return max(50, min(1000, (16 << 20) // size))
    return max(100, min(5000, (64 << 20) // size))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--perf", required=True)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-rounds", type=int, default=10)
    ap.add_argument("--tests", default=",".join(TESTS))
    ap.add_argument("--keep", action="store_true", help="keep the rows of OUT/compare.json not measured again")
    ap.add_argument("--async", dest="async_mode", choices=["busy", "event", "hybrid"])
    ap.add_argument("--post-list", type=int, default=1, help="--async: WRs per post list and per signal (bandwidth)")
    args = ap.parse_args()
    if args.post_list != 1 and not args.async_mode:
        sys.exit("compare: --post-list goes with --async")
    if args.async_mode and args.tests == ",".join(TESTS):
        args.tests = ",".join(t for t in ASYNC_TESTS if args.post_list == 1 or t.endswith("_bw"))
    name = f"async-{args.async_mode}" if args.async_mode else "compare"
    if args.post_list != 1:
        name += f"-l{args.post_list}"
    sizes = [2 << i for i in range(20)] if args.sizes == "all" else [int(s) for s in args.sizes.split(",")]
    device, gid = device_and_gid("compare: no RDMA device here (run it with bench/compare.sh, which uses the VM)")
    common = ["-d", device] + (["-x", gid] if gid else [])
    host = "127.0.0.1"

    tests = args.tests.split(",")
    results = []
    if args.keep:  # the rows of the last run in OUT that this one does not measure again
        try:
            with open(os.path.join(args.out, name + ".json")) as f:
                results = kept(json.load(f)["results"], tests, sizes)
        except FileNotFoundError:
            pass
    for test in tests:
        program, knobs = TESTS[test]
        latency = test.endswith("_lat")
        for size in ([8] if test.startswith("atomic") else sizes):
            n = str(iterations(test, size))
            size_knobs = [] if test.startswith("atomic") else ["-s", str(size)]
            if args.async_mode and not latency:  # the same verbs on both sides (see the top)
                size_knobs += ["-l", str(args.post_list), "-Q", str(args.post_list)]
            perftest, rdmaxx, cpu = [], [], []
            my_knobs = knobs
            for round in range(args.max_rounds):  # A B A B
                if round >= args.rounds and not (scattered(perftest) or scattered(rdmaxx)):
                    break
                if args.async_mode:  # A: rdmaxx-perf's own loop, in perftest's place
                    sync = [args.perf, test, *common, *size_knobs, "-n", n]
                    out = run_pair(sync, sync[:2] + [host] + sync[2:] + ["--json"])
                    if out is not None:
                        perftest.append(rdmaxx_figure(out, latency, size))
                else:
                    base = [program, *common, *knobs, *size_knobs, "-n", n]
                    out = run_pair(base, base + [host])
                    if out is not None:
                        inline = perftest_inline(out)
                        if inline is not None and "-I" in knobs:
                            my_knobs = ["-I", inline]
                        if not test.startswith("write_imm"):
                            perftest.append(perftest_figure(out, latency, size))
                mine = [args.perf, test, *common, *([] if args.async_mode else my_knobs), *size_knobs, "-n", n]
                async_knobs = ["--async", args.async_mode] if args.async_mode else []
                out = run_pair(mine, mine[:2] + [host] + mine[2:] + async_knobs + ["--json"])
                if out is not None:
                    rdmaxx.append(rdmaxx_figure(out, latency, size))
                    cpu.append(rdmaxx_cpu(out))
            if not rdmaxx:
                print(f"compare: {test} {size} B: rdmaxx-perf failed every time", file=sys.stderr)
                continue
            row = summarize(test, size, int(n), perftest, rdmaxx)
            if args.async_mode:
                row["cpu_us_per_op"] = statistics.median(cpu)
            results.append(row)
            print(format_row(row), flush=True)
            save(args.out, name, device, args.rounds, results)  # as we go: a long run keeps what it measured

    table = format_table(results, device, args.rounds, args.async_mode, args.post_list)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(table)
    print(table)
    if not args.async_mode:
        plot(results, device, os.path.join(args.out, "compare.png"))


def kept(results, tests, sizes):
    """The rows a run of `tests` at `sizes` leaves alone (atomics have one size, 8)."""
    def measured(r):
        return r["test"] in tests and (r["test"].startswith("atomic") or r["size"] in sizes)
    return [r for r in results if not measured(r)]


def in_order(results):
    return sorted(results, key=lambda r: (list(TESTS).index(r["test"]), r["size"]))


def save(out, name, device, rounds, results):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump({"device": device, "rounds": rounds, "results": in_order(results)}, f, indent=1)


def figure(value):
    return f"{value:.3g}" if value < 1 else f"{value:.2f}"


def spread(runs):
    return f"{figure(min(runs))}-{figure(max(runs))} ({len(runs)})" if runs else "-"


def summarize(test, size, iters, perftest, rdmaxx):
    """One table row from each tool's runs: the best of each (lowest latency, highest
    bandwidth), their ratio and the ratio of the medians; perftest's may be empty."""
    latency = test.endswith("_lat")
    best = min if latency else max
    row = {"test": test, "size": size, "iters": iters, "unit": "us" if latency else "MiB/s",
           "rounds": max(len(perftest), len(rdmaxx)),
           "perftest": best(perftest) if perftest else None, "rdmaxx": best(rdmaxx),
           "perftest_runs": perftest, "rdmaxx_runs": rdmaxx}
    row["ratio"] = row["rdmaxx"] / row["perftest"] if perftest else None
    row["median_ratio"] = statistics.median(rdmaxx) / statistics.median(perftest) if perftest else None
    return row


def format_row(r):
    perftest = figure(r["perftest"]) if r["perftest"] is not None else "-"
    ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
    median_ratio = f"{r['median_ratio']:.2f}" if r.get("median_ratio") is not None else "-"
    cpu = f" {figure(r['cpu_us_per_op'])} |" if "cpu_us_per_op" in r else ""
    return (f"| {r['test']} | {r['size']} | {perftest} | {figure(r['rdmaxx'])} | {ratio} | {median_ratio} | "
            f"{spread(r['perftest_runs'])} | {spread(r['rdmaxx_runs'])} |{cpu}")


def format_table(results, device, rounds, async_mode=None, post_list=1):
    a, b = ("sync", f"async {async_mode}") if async_mode else ("perftest", "rdmaxx")
    cpu_head, cpu_rule = (" async CPU us/op |", " ---: |") if async_mode else ("", "")
    head = (f"Device {device}; at least {rounds} alternating runs per tool (more where a tool's runs spread over "
            "10 %: the count is in the range columns); "
            "each tool's best run (latency: lowest "
            f"t_typical in us, ratio {b}/{a}, lower is better; bandwidth: highest average MiB/s, ratio "
            f"{b}/{a}, higher is better), the ratio of the medians, and every run's range (and count)"
            + ("; sync is rdmaxx-perf's loop on the data layer, async its loop on lib/async; in bandwidth "
               + (f"both post lists of {post_list} WRs, one doorbell each and the last signaled (async: each list "
                  "one awaited operation, tx_depth / list of them in flight)" if post_list > 1 else
                  "sync posts every WR signaled, one doorbell each; async awaits every WR as its own operation, "
                  "tx_depth of them in flight, and posts the ones that a poll's completions start with one "
                  "doorbell (lib/async's held sends)")
               + "; the last column is the async runs' median CPU time (user + system) per WR" if async_mode else "")
            + "\n\n"
            f"| test | bytes | {a} | {b} | ratio | median ratio | {a} runs | {b} runs |{cpu_head}\n"
            f"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |{cpu_rule}\n")
    return head + "\n".join(format_row(r) for r in in_order(results)) + "\n"


def plot(results, device, path):
    try:
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(os.path.dirname(path), ".matplotlib"))
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare: no matplotlib for this python (scripts/install-deps.sh installs Debian's): no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, suffix, label in ((axes[0], "_lat", "t_typical [us]"), (axes[1], "_bw", "average bandwidth [MiB/s]")):
        for test in dict.fromkeys(r["test"] for r in results if r["test"].endswith(suffix)):
            rows = [r for r in results if r["test"] == test]
            xs = [r["size"] for r in rows]
            line, = ax.plot(xs, [r["rdmaxx"] for r in rows], marker="o", label=f"{test} rdmaxx")
            if rows[0]["perftest"] is not None:
                ax.plot(xs, [r["perftest"] for r in rows], marker="x", linestyle="--", color=line.get_color(),
                        label=f"{test} perftest")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size [bytes]")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"rdmaxx-perf vs perftest on {device} (Soft-RoCE under emulation: compare the lines, "
                 "not the numbers)" if device.startswith("rxe") else f"rdmaxx-perf vs perftest on {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"compare: plot in {path}")


if __name__ == "__main__":
    main()
