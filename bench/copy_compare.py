#!/usr/bin/env python3
"""copy_compare.py - rdmaxx-copy's throughput against ib_write_bw at the same block size,
in the same run on the same device, alternating A B A B (5 rounds each, after one
of each not counted: the first copy into a fresh tmpfs pays for its pages), server
and client pinned to CPUs of their own as bench/compare.py does.

  copy_compare.py --copy BUILD/tools/copy/rdmaxx-copy [--out DIR] [--file-mib N (64)]
                  [--blocks 1048576,...] [--depth N (4)] [--rounds N (5)] [--warmup N (1)]

A: ib_write_bw -s BLOCK -n FILE/BLOCK (the same bytes). B: rdmaxx-copy of a file of
random bytes in one tmpfs (/dev/shm) to a server directory on another (/tmp), so the
figure is RDMA plus the file I/O the tool must do, not a disk. rdmaxx-copy's figure
is its own per-file MiB/s (--json: from the file's announcement to the server's
verdict, fsync and rename included; the connection's setup excluded, as perftest's
is). Prints and writes OUT/copy.md: per block size the median of each tool, the ratio
of the medians (copy / ib_write_bw; target >= 0.8) and each tool's range."""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (run_pair, pinning, perftest's figures)


def copy_figure(output):
    rows = [json.loads(line) for line in output.splitlines() if line.strip()]
    files = [r for r in rows if not r.get("total")]
    if len(files) != 1 or not files[0]["ok"]:
        raise RuntimeError(f"rdmaxx-copy failed: {output}")
    return files[0]["mib_per_s"]


def spread(runs):
    return f"{min(runs):.1f}-{max(runs):.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copy", required=True)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--file-mib", type=int, default=64)
    ap.add_argument("--blocks", default="1048576,65536")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="rounds of each tool run first and not counted")
    args = ap.parse_args()
    device, gid = compare.device_and_gid("copy_compare: no RDMA device here (run it with scripts/vm/run.sh)")
    common = ["-d", device] + (["-x", gid] if gid else [])
    size = args.file_mib << 20
    src_dir = tempfile.mkdtemp(prefix="copy-src.", dir="/dev/shm")
    dst = tempfile.mkdtemp(prefix="copy-dst.", dir="/tmp")
    src = os.path.join(src_dir, "data.bin")
    with open(src, "wb") as f:
        for _ in range(args.file_mib):
            f.write(os.urandom(1 << 20))

    rows = []
    for block in [int(b) for b in args.blocks.split(",")]:
        n = size // block
        perftest, copy = [], []
        for round in range(args.warmup + args.rounds):  # A B A B; the first ones warm the VM's tmpfs up
            counted = round >= args.warmup
            base = ["ib_write_bw", *common, "-s", str(block), "-n", str(n), "-t", str(min(128, n))]
            out = compare.run_pair(base, base + ["127.0.0.1"])
            if out is not None and counted:
                perftest.append(compare.perftest_figure(out, False, block))
            server = [args.copy, "--serve", dst, "--once", *common]
            client = [args.copy, *common, "--json", "-b", str(block), "--depth", str(args.depth), src, "127.0.0.1:"]
            out = compare.run_pair(server, client)
            if out is not None and counted:
                copy.append(copy_figure(out))
            if os.path.exists(os.path.join(dst, "data.bin")):
                os.remove(os.path.join(dst, "data.bin"))
        if not perftest or not copy:
            print(f"copy_compare: {block} B: a tool failed every time", file=sys.stderr)
            continue
        row = {"block": block, "file_mib": args.file_mib, "depth": args.depth, "ib_write_bw": perftest,
               "rdmaxx_copy": copy, "ratio": statistics.median(copy) / statistics.median(perftest)}
        rows.append(row)
        print(f"copy_compare: block {block} B: ib_write_bw {statistics.median(perftest):.1f} MiB/s "
              f"({spread(perftest)}), rdmaxx-copy {statistics.median(copy):.1f} MiB/s ({spread(copy)}), "
              f"ratio {row['ratio']:.2f}", flush=True)

    lines = [f"# rdmaxx-copy against ib_write_bw ({device})", "",
             f"`bench/copy_compare.py`: {args.rounds} rounds each after {args.warmup} not counted, alternating, one VM run; a {args.file_mib} MiB file "
             f"of random bytes from /dev/shm to /tmp (both tmpfs), rdmaxx-copy depth {args.depth}; "
             "ib_write_bw -s BLOCK -n FILE/BLOCK (the same bytes). MiB/s: the median, and every run's range. "
             "Ratio: copy / ib_write_bw (target >= 0.8).", "",
             "| block | ib_write_bw MiB/s | range | rdmaxx-copy MiB/s | range | ratio |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['block']} | {statistics.median(r['ib_write_bw']):.1f} | {spread(r['ib_write_bw'])} | "
                     f"{statistics.median(r['rdmaxx_copy']):.1f} | {spread(r['rdmaxx_copy'])} | {r['ratio']:.2f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "copy.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "copy.json"), "w") as f:
        json.dump({"device": device, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
