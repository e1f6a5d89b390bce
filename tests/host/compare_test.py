#!/usr/bin/env python3
"""bench/compare.py's pure logic: reading perftest's and rdmaxx-perf's output, when
more rounds are run, the best-of/median summary and the table row.

  compare_test.py SOURCE_ROOT
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import compare  # noqa: E402

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAILED: ") + what)
    if not ok:
        failures.append(what)


LAT = """ Max inline data : 0[B]
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 2       1000          11.25          40.35        11.69    	       11.88       	0.92   		14.10   		40.35
---------------------------------------------------------------------------------------
"""
BW = """---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 2          5000             0.10               0.09   		   0.045612
---------------------------------------------------------------------------------------
"""

check(compare.perftest_figure(LAT, True, 2) == 11.69, "perftest latency: t_typical, the fifth column")
mib = compare.perftest_figure(BW, False, 2)
check(abs(mib - 0.045612e6 * 2 / (1 << 20)) < 1e-12, "perftest bandwidth at 2 B: from the message rate, not the 0.09")
BIG = " 1048576    100              47.12              46.98   		   0.000047\n"
check(compare.perftest_figure(BIG, False, 1 << 20) == 46.98, "perftest bandwidth at 1 MiB: the MiB/s, not 0.000047 Mpps")
check(compare.perftest_inline(LAT) == "0", "perftest's inline size read from 'Max inline data'")
check(compare.perftest_inline(BW) is None, "no inline line, no inline size")
try:
    compare.perftest_figure("Couldn't connect to 127.0.0.1:19001\n", True, 2)
    check(False, "output without a result line is refused")
except RuntimeError as e:
    check("no result line" in str(e), "output without a result line is refused")

mine = "\n".join([json.dumps({"test": "write_lat", "size": 2, "t_typical": 12.03}),
                  json.dumps({"test": "write_bw", "size": 64, "mib_per_s": 2.9, "mpps": 0.047})])
check(compare.rdmaxx_figure(json.dumps({"t_typical": 12.03}), True, 2) == 12.03, "rdmaxx-perf latency from --json")
mine_big = json.dumps({"mib_per_s": 46.9876, "mpps": 0.000047})
check(compare.rdmaxx_figure(mine_big, False, 1 << 20) == 46.9876, "rdmaxx-perf bandwidth at 1 MiB: its MiB/s")
check(abs(compare.rdmaxx_figure(mine, False, 64) - 0.047e6 * 64 / (1 << 20)) < 1e-12,
      "rdmaxx-perf: the last JSON line counts")
tiny = json.dumps({"mib_per_s": 0.0001, "mpps": 0.047123})
check(abs(compare.rdmaxx_figure(tiny, False, 2) - 0.047123e6 * 2 / (1 << 20)) < 1e-12,
      "rdmaxx-perf bandwidth from the message rate when that is more precise")

check(not compare.scattered([13.0]), "one run is not scattered")
check(not compare.scattered([13.0, 13.5, 14.2]), "runs within 10 % are not scattered")
check(compare.scattered([13.0, 17.0]), "runs 30 % apart are scattered: more rounds")

row = compare.summarize("send_lat", 2, 1000, [13.0, 17.0, 13.2], [13.5, 13.4, 17.5])
check(row["perftest"] == 13.0 and row["rdmaxx"] == 13.4, "latency: each tool's lowest run")
check(abs(row["ratio"] - 13.4 / 13.0) < 1e-12, "latency ratio: rdmaxx over perftest")
check(abs(row["median_ratio"] - 13.5 / 13.2) < 1e-12, "median ratio beside it")
check(row["rounds"] == 3, "the row says how many rounds ran")
row = compare.summarize("write_bw", 2, 5000, [0.080, 0.087], [0.086, 0.084])
check(row["perftest"] == 0.087 and row["rdmaxx"] == 0.086, "bandwidth: each tool's highest run")
row = compare.summarize("write_imm_lat", 64, 1000, [], [14.5, 14.6])
check(row["perftest"] is None and row["ratio"] is None, "no perftest counterpart: no ratio")
line = compare.format_row(row)
check(line.startswith("| write_imm_lat | 64 | - | 14.50 | - | - | - | 14.50-14.60 (2) |"), f"table row: {line}")
check("0.0871" in compare.format_row(compare.summarize("write_bw", 2, 5000, [0.0871], [0.0869])),
      "small bandwidths keep three significant digits")

# --keep: the rows not measured again survive, the table is in the tests' order
old = [compare.summarize(t, n, 10, [1.0], [1.0]) for t, n in
       (("write_lat", 2), ("write_lat", 64), ("read_lat", 2), ("atomic_lat", 8))]
left = [(r["test"], r["size"]) for r in compare.kept(old, ["write_lat", "atomic_lat"], [64])]
check(left == [("write_lat", 2), ("read_lat", 2)], f"--keep keeps other sizes and tests: {left}")
rows = [compare.summarize(t, 2, 10, [1.0], [1.0]) for t in ("write_bw", "write_lat")]
check([r["test"] for r in compare.in_order(rows)] == ["write_lat", "write_bw"], "rows in the tests' order")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
