#!/usr/bin/env python3
"""rpc_compare.py - lib/rpc (rdmaxx-rpc-perf) beside perftest's UD sends, in the same
run, alternating, on this machine's device (in the VM: bench/compare.sh BUILD --rpc).

  rpc_compare.py --rpc BUILD/bench/rdmaxx-rpc-perf [--rounds N (5)] [--size S (32)]
                 [--window W (32)] [--out DIR]

Per round: ib_send_lat -c UD, rdmaxx-rpc-perf (one call at a time), ib_send_bw -c UD,
rdmaxx-rpc-perf -w W. Reported, each tool's best round and the median of the rounds:
  round trip: rpc's median round trip / (2 x ib_send_lat's t_typical)  (target <= 1.3)
  rate: rpc's calls per second / ib_send_bw's message rate             (target >= 0.4)
Server and client pinned to CPUs 0 and 1 (compare.py's run_pair)."""
import argparse
import glob
import json
import os
import statistics
import sys

from compare import perftest_figure, run_pair


def perftest_rate(output):
    """ib_send_bw's MsgRate [Mpps]: the fifth field of its result line."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0].isdigit() and fields[1].isdigit():
            return float(fields[4])
    raise RuntimeError(f"no result line in perftest's output:\n{output}")


def rpc_figure(output, key):
    fields = output.strip().splitlines()[-1].split()
    return float(fields[fields.index(key) + 1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rpc", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    devices = sorted(os.path.basename(d) for d in glob.glob("/sys/class/infiniband/*"))
    if not devices:
        sys.exit("rpc_compare: no RDMA device here (run it with bench/compare.sh BUILD --rpc, which uses the VM)")
    device = os.environ.get("RDMAXX_DEVICE") or devices[0]
    gid = os.environ.get("RDMAXX_GID_INDEX") or os.environ.get("RDMAXX_VM_GID_INDEX")
    pt = ["-d", device, "-c", "UD", "-s", str(args.size)] + (["-x", gid] if gid else [])
    host = "127.0.0.1"
    rpc_server = [args.rpc, "--serve", "--once", "-d", device]
    rpc_client = [args.rpc, host, "-d", device, "-s", str(args.size)]
    lat_iters, bw_iters = "5000", "20000"

    runs = {"send_lat_us": [], "rpc_rtt_us": [], "send_bw_mpps": [], "rpc_mcalls": []}
    for r in range(args.rounds):
        out = run_pair(["ib_send_lat"] + pt + ["-n", lat_iters], ["ib_send_lat"] + pt + ["-n", lat_iters, host])
        runs["send_lat_us"].append(perftest_figure(out, True, args.size))
        out = run_pair(rpc_server, rpc_client + ["-n", lat_iters, "-w", "1"])
        runs["rpc_rtt_us"].append(rpc_figure(out, "median_us"))
        out = run_pair(["ib_send_bw"] + pt + ["-n", bw_iters], ["ib_send_bw"] + pt + ["-n", bw_iters, host])
        runs["send_bw_mpps"].append(perftest_rate(out))
        out = run_pair(rpc_server, rpc_client + ["-n", bw_iters, "-w", str(args.window)])
        runs["rpc_mcalls"].append(rpc_figure(out, "mcalls_per_s"))
        print(f"rpc_compare: round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in runs.items()), flush=True)

    rtt_best = min(runs["rpc_rtt_us"]) / (2 * min(runs["send_lat_us"]))
    rtt_median = statistics.median(runs["rpc_rtt_us"]) / (2 * statistics.median(runs["send_lat_us"]))
    rate_best = max(runs["rpc_mcalls"]) / max(runs["send_bw_mpps"])
    rate_median = statistics.median(runs["rpc_mcalls"]) / statistics.median(runs["send_bw_mpps"])
    table = (f"# lib/rpc against perftest UD sends ({device}, {args.size} B, {args.rounds} rounds alternating)\n\n"
             "| | perftest (best / median) | rdmaxx rpc (best / median) | ratio best (median) | target |\n"
             "| --- | --- | --- | --- | --- |\n"
             f"| round trip [us] vs 2 x ib_send_lat UD | {2 * min(runs['send_lat_us']):.2f} / "
             f"{2 * statistics.median(runs['send_lat_us']):.2f} | {min(runs['rpc_rtt_us']):.2f} / "
             f"{statistics.median(runs['rpc_rtt_us']):.2f} | {rtt_best:.2f} ({rtt_median:.2f}) | <= 1.3 |\n"
             f"| rate [M/s], window {args.window} vs ib_send_bw UD | {max(runs['send_bw_mpps']):.4f} / "
             f"{statistics.median(runs['send_bw_mpps']):.4f} | {max(runs['rpc_mcalls']):.4f} / "
             f"{statistics.median(runs['rpc_mcalls']):.4f} | {rate_best:.2f} ({rate_median:.2f}) | >= 0.4 |\n")
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rpc.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "rpc.json"), "w") as f:
        json.dump({"device": device, "size": args.size, "window": args.window, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
