#!/usr/bin/env python3
"""windows_compare.py - what lending through memory windows costs
(EndpointOptions::lend_through_windows): rdmaxx-perf's RPC tests with --windows against
the same without, or against another build's rdmaxx-perf with --windows (what a change
to the window path gained), in one run, alternating A B B A, on this machine's device.

  windows_compare.py --perf BUILD/bench/rdmaxx-perf [--base OTHER/bench/rdmaxx-perf]
                     [--rounds N (3)]

In the VM: scripts/vm/run.sh python3 bench/windows_compare.py --perf build/bench/rdmaxx-perf
Cases: the round trip at 32 B with every message on the RC path (--rdma-threshold 0:
the windows' cost alone, nothing to move), at 4 KiB and 64 KiB; 4 KiB calls with a
window of 8 in flight; 1 MiB requests one way with a window of 4 (event mode). Reported
per case: each side's median and range, and the ratio B / A within each round (its
median and range): times, lower is better; MiB/s, higher is better. Under emulation
only ratios taken in one run mean anything (bench/results/rpc-round-trip.md)."""
import argparse
import json
import statistics

import compare

CASES = [  # name, test, size, arguments, iterations, the JSON figure
    ("32 B round trip, --rdma-threshold 0 (us)", "rpc_lat", 32, ["--rdma-threshold", "0"], 2000, "t_typical"),
    ("4 KiB round trip (us)", "rpc_lat", 4096, [], 2000, "t_typical"),
    ("64 KiB round trip (us)", "rpc_lat", 65536, [], 1000, "t_typical"),
    ("4 KiB, window 8 (MiB/s)", "rpc_bw", 4096, ["-w", "8"], 6000, "mib_per_s"),
    ("1 MiB one way, window 4 (MiB/s)", "rpc_bw", 1 << 20, ["--one-way", "-w", "4", "--async", "event"], 300,
     "mib_per_s"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--perf", required=True)
    parser.add_argument("--base")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device, _ = compare.device_and_gid("windows_compare: no RDMA device")
    # side: (label, program, whether it lends through windows)
    if args.base:
        sides = [("base", args.base, True), ("this", args.perf, True)]
    else:
        sides = [("without", args.perf, False), ("with", args.perf, True)]
    results = {name: {label: [] for label, _, _ in sides} for name, *_ in CASES}
    for r in range(args.rounds):
        for name, test, size, extra, iters, key in CASES:
            for label, perf, windows in sides if r % 2 == 0 else reversed(sides):
                server = [perf, test, "-d", device, "-s", str(size), "-n", str(iters), *extra]
                server += ["--windows"] if windows else []
                out = compare.run_pair(server, server[:2] + ["127.0.0.1"] + server[2:] + ["--json"])
                value = json.loads(out.strip().splitlines()[-1])[key] if out else float("nan")
                results[name][label].append(value)
                print(f"round {r}: {name}, {label}: {value:.2f}", flush=True)
    (a, *_), (b, *_) = sides
    print(f"\n| case | {a} | {b} | {b} / {a} per round |\n| --- | --- | --- | --- |")
    for name, *_ in CASES:
        first, second = results[name][a], results[name][b]
        ratios = [y / x for x, y in zip(first, second)]
        cell = lambda v: f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
        print(f"| {name} | {cell(first)} | {cell(second)} | {cell(ratios)} |")


if __name__ == "__main__":
    main()
