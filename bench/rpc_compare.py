#!/usr/bin/env python3
"""rpc_compare.py - lib/rpc (rdmaxx-perf rpc_lat / rpc_bw) beside perftest's UD and RC
sends and UCX's active messages, in the same run, alternating, on this machine's device
(in the VM: bench/compare.sh BUILD --rpc).

  rpc_compare.py --perf BUILD/bench/rdmaxx-perf [--rounds N (5)] [--size S (32)]
                 [--window W (32)] [--large-rounds N (3)] [--out DIR]

Per round, in this order: ib_send_lat -c UD, ib_send_lat -c RC, rpc_lat, rpc_lat
--callbacks, rpc_lat --task, rpc_lat --rdma-threshold 0, ucp_am_lat, ucp_am_lat on UD alone, ib_send_bw
-c UD, ib_send_bw -c RC, rpc_bw -w W, rpc_bw -w W --rdma-threshold 0, ucp_am_bw,
ucp_am_bw on UD alone (ucx_perftest). Reported, each tool's best
round, the median of the rounds and the range, and the ratios of the best rounds, of the
medians, and within each round (their median and range: a drift of the host's speed
between rounds moves both tools of a round):
  round trip: rpc_lat's t_typical (a whole round trip) / (2 x ib_send_lat UD's t_typical,
              half of one)                                            (target <= 1.3);
              the same with the calls in lib/rpc's callback form, and co_awaited by
              an async::Task (use_task), instead of by an asio::awaitable
  rate:       rpc_bw's calls per second / ib_send_bw UD's message rate  (target >= 0.4)
  UCX:        rpc against ucp_am_lat (2 x its typical: it reports half a round trip, as
              perftest) and ucp_am_bw's message rate                (target: rpc faster);
              and, for reference, UCX restricted to UD (UCX_TLS=ud_v), the transport
              lib/rpc's small messages take, where UCX itself picks RC;
              and rpc_lat and rpc_bw with --rdma-threshold 0 (every message on the
              session's RC path, a SEND and a WRITE_WITH_IMM, as UCX's RC eager
              messages), against 2 x ib_send_lat UD and RC and UCX, for reference
Then per large round, 1 MiB: ib_read_bw, rpc_bw --one-way (1 MiB requests READ by the
server, empty responses: window 4), rpc_bw echo (1 MiB each way: window 1), ucp_am_bw;
the RPC tests in event mode (busy polling on the VM's 2 vCPUs takes the CPU rxe's
packet processing needs). Reported: goodput, one way / ib_read_bw (target >= 0.8) and
/ UCX AM (target > 1); echo's both ways together / ib_read_bw, for reference.
UCX runs on the RDMA device only if one of its verbs transports does (UCX_TLS rc_verbs,
ud_verbs, then rc_v,ud_v, UCX_NET_DEVICES=DEVICE:1); every attempt's error is kept in
the results. TCP is tried last and reported apart: it does not count.
Server and client pinned to CPUs 0 and 1 (compare.py's run_pair).

With --sweep SIZES (comma-separated bytes), only the round trip by size, in
--rounds rounds alternating: rpc_lat (lib/rpc's default rdma_threshold), rpc_lat
--rdma-threshold 0 (every message on the session's RC path), ucp_am_lat and
ib_send_lat RC; written to DIR/rpc-sizes.md and .json (target: rpc faster than UCX AM
at every size measured)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import compare
from compare import perftest_figure, run_pair

UCX_VERBS = ["rc_verbs", "ud_verbs", "rc_v,ud_v"]


def ucx_configs(device):
    """The configurations UCX is tried in, the first that runs counting: its verbs
    transports, then TCP (reported apart). UCX's UD drops every packet rxe delivers
    unless its Ethernet DGID check is off."""
    verbs = {"UCX_NET_DEVICES": f"{device}:1"}
    configs = [{"UCX_TLS": tls} | verbs for tls in UCX_VERBS]
    return configs + [{"UCX_TLS": "rc_v,ud_v", "UCX_UD_VERBS_ETH_DGID_CHECK": "n"} | verbs, {"UCX_TLS": "tcp"}]


def ucx_ud_config(device):
    """UCX on UD alone, as lib/rpc's small messages travel: a like-for-like reference
    where UCX itself picks RC for active messages."""
    return {"UCX_TLS": "ud_v", "UCX_UD_VERBS_ETH_DGID_CHECK": "n", "UCX_NET_DEVICES": f"{device}:1"}


def perftest_rate(output):
    """ib_send_bw's MsgRate [Mpps]: the fifth field of its result line."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0].isdigit() and fields[1].isdigit():
            return float(fields[4])
    raise RuntimeError(f"no result line in perftest's output:\n{output}")


def rdmaxx_row(output):
    return json.loads(output.strip().splitlines()[-1])


def ucx_row(output):
    """ucx_perftest -v: a CSV head (iterations,50.0_percentile_lat,avg_lat,...) and, among
    whatever it logs, one line of as many figures."""
    head, row = None, None
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("iterations,"):
            head = line.split(",")
        elif head and len(line.split(",")) == len(head):
            try:
                row = dict(zip(head, map(float, line.split(","))))
            except ValueError:
                pass
    if row is None:
        raise RuntimeError(f"no CSV result in ucx_perftest's output:\n{telling(output)}")
    return row


def probe_pair(server_cmd, client_cmd, timeout):
    """compare.run_pair_once for a tool that may fail or hang: both sides' output in the
    error, a short timeout, the server killed at once."""
    compare.port += 1
    port = str(compare.port)
    server = subprocess.Popen(compare.pinned(server_cmd + ["-p", port], 0), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    for _ in range(500):
        if compare.listening(compare.port) or server.poll() is not None:
            break
        time.sleep(0.02)
    try:
        client = subprocess.run(compare.pinned(client_cmd + ["-p", port], 1), capture_output=True, text=True,
                                timeout=timeout)
        rc, out, err = client.returncode, client.stdout, client.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", e.stdout or "", (e.stderr or "") + f"\n(no result within {timeout} s)"
        out, err = (out.decode() if isinstance(out, bytes) else out), (err.decode() if isinstance(err, bytes) else err)
    try:
        server_out = server.communicate(timeout=5 if rc == 0 else 1)[0]
    except subprocess.TimeoutExpired:
        server.kill()
        server_out = server.communicate()[0]
    if rc != 0:
        raise RuntimeError(f"client: exit {rc}\n{telling(out + err)}\nserver:\n{telling(server_out)}")
    return out


class Ucx:
    """ucx_perftest on the first configuration that works on the device, found once; each
    failed attempt's error kept (probed with UCX's debug log, its telling lines kept)."""

    def __init__(self, size, configs):
        self.size, self.tls, self.env, self.attempts = size, None, {}, []
        if not configs:
            return
        if not shutil.which("ucx_perftest"):
            self.attempts.append({"config": "-", "error": "ucx_perftest not installed (Debian's ucx-utils: "
                                  "scripts/install-deps.sh)"})
            return
        for env in configs:
            name = " ".join(f"{k}={v}" for k, v in env.items())
            try:
                row, ep_config = self.run("ucp_am_lat", 200, env | {"UCX_LOG_LEVEL": "debug"}, probe=True)
                self.attempts.append({"config": name, "error": None, "lanes": ep_config})
                self.tls, self.env = env["UCX_TLS"], env
                break
            except (RuntimeError, ValueError) as e:
                self.attempts.append({"config": name, "error": str(e)})
                print(f"rpc_compare: UCX with {name}: {str(e)[-400:]}", file=sys.stderr, flush=True)

    def counts(self):
        return self.tls is not None and self.tls != "tcp"

    def run(self, test, iters, env=None, probe=False, size=None):
        saved = {k: os.environ.get(k) for k in (env or self.env)}
        os.environ.update(env or self.env)
        try:
            server = ["ucx_perftest"]
            client = ["ucx_perftest", "127.0.0.1", "-t", test, "-s", str(size or self.size), "-n", str(iters),
                      "-w", str(max(10, iters // 10)), "-v"]
            if probe:  # line-buffered: a hung run killed at its timeout still shows its log
                out = probe_pair(["stdbuf", "-oL", "-eL"] + server, ["stdbuf", "-oL", "-eL"] + client, 20)
                lanes = [line.split("UCX  INFO")[-1].strip() for line in out.splitlines() if "ep_cfg" in line]
                return ucx_row(out), lanes
            out = run_pair(server, client)
            if out is None:
                raise RuntimeError(f"ucx_perftest {test} failed every attempt")
            return ucx_row(out)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def telling(log):
    """A UCX debug log's lines that say what went wrong: errors, warnings, the lanes it
    chose and its first resends (the rest repeats them)."""
    keep, resends = [], 0
    for line in log.splitlines():
        if "resending rt_psn" in line:
            resends += 1
            if resends > 2:
                continue
        if any(k in line for k in ("ERROR", "WARN", "ep_cfg", "resending rt_psn", "connected to IFACE", "exit",
                                   "no result within")):
            keep.append(line.split("] ", 1)[-1].strip())
    if resends > 2:
        keep.append(f"... {resends} 'resending' lines in all: nothing the peer sent was received")
    return "\n".join(keep[-25:])


def best_median(runs, best):
    return (best(runs), statistics.median(runs)) if runs else (None, None)


def fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def spread(runs, digits=2):
    return f"{min(runs):.{digits}f}-{max(runs):.{digits}f}" if runs else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--perf", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--large-rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--sweep", help="comma-separated sizes: the round trip by size alone")
    args = ap.parse_args()
    device, gid = compare.device_and_gid(
        "rpc_compare: no RDMA device here (run it with bench/compare.sh BUILD --rpc, which uses the VM)")
    if args.sweep:
        return sweep(args, device, gid, [int(v) for v in args.sweep.split(",")])
    size = str(args.size)
    host = "127.0.0.1"
    lat_iters, bw_iters, ucx_lat_iters, ucx_bw_iters = 5000, 20000, 5000, 20000

    def perftest(program, transport, iters, msg_size=size):
        pt = [program, "-d", device, *(["-c", transport] if transport else []), "-s", msg_size, "-n", str(iters)] + (
            ["-x", gid] if gid else [])
        return run_pair(pt, pt + [host])

    def rdmaxx(test, iters, extra=(), msg_size=size):
        mine = [args.perf, test, "-d", device, "-s", msg_size, "-n", str(iters), *extra]
        out = run_pair(mine, mine[:2] + [host] + mine[2:] + ["--json"])
        return rdmaxx_row(out) if out is not None else None

    ucx = Ucx(args.size, ucx_configs(device))
    # tried only where UCX runs on the device at all (else its failure is told once)
    ucx_ud = Ucx(args.size, [ucx_ud_config(device)] if ucx.counts() else [])
    runs = {k: [] for k in ("send_lat_ud_us", "send_lat_rc_us", "rpc_rtt_us", "rpc_rtt_callbacks_us", "rpc_rtt_task_us",
                            "rpc_rtt_rc_us",
                            "ucx_am_lat_us", "ucx_ud_am_lat_us", "send_bw_ud_mpps", "send_bw_rc_mpps", "rpc_mcalls",
                            "rpc_mcalls_rc", "ucx_am_bw_mpps", "ucx_ud_am_bw_mpps")}
    retransmissions = {"rpc_lat": [], "rpc_lat_callbacks": [], "rpc_lat_task": [], "rpc_lat_rc": [], "rpc_bw": [], "rpc_bw_rc": []}
    every_rc = ["--rdma-threshold", "0"]
    ucx_mean = []  # ucp_am_lat's mean half round trip (its median is in the table)
    per_round = []  # each round's figures by key: the ratios within a round

    def add(key, value):
        if value is not None:
            runs[key].append(value)
            per_round[-1][key] = value

    for r in range(args.rounds):
        per_round.append({})
        for transport, key in (("UD", "send_lat_ud_us"), ("RC", "send_lat_rc_us")):
            out = perftest("ib_send_lat", transport, lat_iters)
            add(key, perftest_figure(out, True, args.size) if out else None)
        for extra, key, test in (([], "rpc_rtt_us", "rpc_lat"),
                                 (["--callbacks"], "rpc_rtt_callbacks_us", "rpc_lat_callbacks"),
                                 (["--task"], "rpc_rtt_task_us", "rpc_lat_task"),
                                 (every_rc, "rpc_rtt_rc_us", "rpc_lat_rc")):
            row = rdmaxx("rpc_lat", lat_iters, extra)
            if row:
                add(key, row["t_typical"])
                retransmissions[test].append(row["retransmissions"])
        if ucx.tls:
            row = ucx.run("ucp_am_lat", ucx_lat_iters)
            add("ucx_am_lat_us", row["50.0_percentile_lat"])
            ucx_mean.append(row["overall_lat"])
        if ucx_ud.tls:
            add("ucx_ud_am_lat_us", ucx_ud.run("ucp_am_lat", ucx_lat_iters)["50.0_percentile_lat"])
        for transport, key in (("UD", "send_bw_ud_mpps"), ("RC", "send_bw_rc_mpps")):
            out = perftest("ib_send_bw", transport, bw_iters)
            add(key, perftest_rate(out) if out else None)
        for extra, key, test in (([], "rpc_mcalls", "rpc_bw"), (every_rc, "rpc_mcalls_rc", "rpc_bw_rc")):
            row = rdmaxx("rpc_bw", bw_iters, ["-w", str(args.window)] + extra)
            if row:
                add(key, row["mpps"])
                retransmissions[test].append(row["retransmissions"])
        if ucx.tls:
            add("ucx_am_bw_mpps", ucx.run("ucp_am_bw", ucx_bw_iters)["overall_mr"] / 1e6)
        if ucx_ud.tls:
            add("ucx_ud_am_bw_mpps", ucx_ud.run("ucp_am_bw", ucx_bw_iters)["overall_mr"] / 1e6)
        print(f"rpc_compare: round {r + 1}: " + ", ".join(f"{k} {v[-1]:.4g}" for k, v in runs.items() if v),
              flush=True)

    mib = 1 << 20
    large = {k: [] for k in ("read_bw", "rpc_one_way", "rpc_echo_both", "ucx_am_bw")}
    for r in range(args.large_rounds):
        out = perftest("ib_read_bw", None, 300, str(mib))
        if out:
            large["read_bw"].append(perftest_figure(out, False, mib))
        row = rdmaxx("rpc_bw", 300, ["--one-way", "-w", "4", "--async", "event"], str(mib))
        if row:
            large["rpc_one_way"].append(row["mib_per_s"])
        row = rdmaxx("rpc_bw", 300, ["-w", "1", "--async", "event"], str(mib))
        if row:
            large["rpc_echo_both"].append(2 * row["mib_per_s"])
        if ucx.tls:
            large["ucx_am_bw"].append(ucx.run("ucp_am_bw", 300, size=mib)["overall_mr"] * mib / 2**20)
        print(f"rpc_compare: 1 MiB round {r + 1}: " + ", ".join(f"{k} {v[-1]:.4g}" for k, v in large.items() if v),
              flush=True)

    lat = {k: best_median(runs[k], min) for k in ("send_lat_ud_us", "send_lat_rc_us", "rpc_rtt_us",
                                                  "rpc_rtt_callbacks_us", "rpc_rtt_task_us", "rpc_rtt_rc_us",
                                                  "ucx_am_lat_us",
                                                  "ucx_ud_am_lat_us")}
    rate = {k: best_median(runs[k], max) for k in ("send_bw_ud_mpps", "send_bw_rc_mpps", "rpc_mcalls",
                                                    "rpc_mcalls_rc", "ucx_am_bw_mpps", "ucx_ud_am_bw_mpps")}

    def ratio(a, b, i, scale=1.0):
        return a[i] / (scale * b[i]) if a[i] is not None and b[i] is not None else None

    r_lat, u_lat = lat["rpc_rtt_us"], lat["ucx_am_lat_us"]
    ratios = {
        "rtt_vs_2x_send_lat_ud": [ratio(r_lat, lat["send_lat_ud_us"], i, 2) for i in (0, 1)],
        "rtt_callbacks_vs_2x_send_lat_ud": [ratio(lat["rpc_rtt_callbacks_us"], lat["send_lat_ud_us"], i, 2)
                                            for i in (0, 1)],
        "rtt_task_vs_2x_send_lat_ud": [ratio(lat["rpc_rtt_task_us"], lat["send_lat_ud_us"], i, 2) for i in (0, 1)],
        "rtt_vs_2x_send_lat_rc": [ratio(r_lat, lat["send_lat_rc_us"], i, 2) for i in (0, 1)],
        "rtt_vs_2x_ucx_am_lat": [ratio(r_lat, u_lat, i, 2) for i in (0, 1)],
        "rate_vs_send_bw_ud": [ratio(rate["rpc_mcalls"], rate["send_bw_ud_mpps"], i) for i in (0, 1)],
        "rate_vs_send_bw_rc": [ratio(rate["rpc_mcalls"], rate["send_bw_rc_mpps"], i) for i in (0, 1)],
        "rate_vs_ucx_am_bw": [ratio(rate["rpc_mcalls"], rate["ucx_am_bw_mpps"], i) for i in (0, 1)],
        "rtt_vs_2x_ucx_ud_am_lat": [ratio(r_lat, lat["ucx_ud_am_lat_us"], i, 2) for i in (0, 1)],
        "rate_vs_ucx_ud_am_bw": [ratio(rate["rpc_mcalls"], rate["ucx_ud_am_bw_mpps"], i) for i in (0, 1)],
        "rc_rtt_vs_2x_send_lat_ud": [ratio(lat["rpc_rtt_rc_us"], lat["send_lat_ud_us"], i, 2) for i in (0, 1)],
        "rc_rtt_vs_2x_send_lat_rc": [ratio(lat["rpc_rtt_rc_us"], lat["send_lat_rc_us"], i, 2) for i in (0, 1)],
        "rc_rtt_vs_2x_ucx_am_lat": [ratio(lat["rpc_rtt_rc_us"], u_lat, i, 2) for i in (0, 1)],
        "rc_rate_vs_send_bw_rc": [ratio(rate["rpc_mcalls_rc"], rate["send_bw_rc_mpps"], i) for i in (0, 1)],
        "rc_rate_vs_ucx_am_bw": [ratio(rate["rpc_mcalls_rc"], rate["ucx_am_bw_mpps"], i) for i in (0, 1)],
    }

    def verdict(value, ok):
        return "-" if value is None else ("met" if ok(value) else "**not met**")

    ucx_name = ("UCX AM (" + " ".join(f"{k}={v}" for k, v in ucx.env.items() if k != "UCX_NET_DEVICES") + ")"
                if ucx.tls else "UCX AM")
    ucx_note = "" if ucx.counts() else (" (over TCP: does not count)" if ucx.tls else " (did not run: see below)")
    # (name, rdmaxx's key, the other's key, scale, ratios, target, its test)
    rows = [
        ("round trip [us]: rpc_lat vs 2 x ib_send_lat UD", "rpc_rtt_us", "send_lat_ud_us", 2,
         ratios["rtt_vs_2x_send_lat_ud"], "<= 1.3", lambda v: v <= 1.3),
        ("round trip [us]: rpc_lat --callbacks (lib/rpc's callback form) vs 2 x ib_send_lat UD",
         "rpc_rtt_callbacks_us", "send_lat_ud_us", 2, ratios["rtt_callbacks_vs_2x_send_lat_ud"], "<= 1.3",
         lambda v: v <= 1.3),
        ("round trip [us]: rpc_lat --task (each call co_awaited by an async::Task) vs 2 x ib_send_lat UD",
         "rpc_rtt_task_us", "send_lat_ud_us", 2, ratios["rtt_task_vs_2x_send_lat_ud"], "<= 1.3", lambda v: v <= 1.3),
        ("round trip [us]: rpc_lat vs 2 x ib_send_lat RC", "rpc_rtt_us", "send_lat_rc_us", 2,
         ratios["rtt_vs_2x_send_lat_rc"], "(reference)", None),
        (f"round trip [us]: rpc_lat vs 2 x {ucx_name} ucp_am_lat{ucx_note}", "rpc_rtt_us", "ucx_am_lat_us", 2,
         ratios["rtt_vs_2x_ucx_am_lat"], "< 1", (lambda v: v < 1) if ucx.counts() else None),
        (f"rate [M/s], window {args.window}: rpc_bw vs ib_send_bw UD", "rpc_mcalls", "send_bw_ud_mpps", 1,
         ratios["rate_vs_send_bw_ud"], ">= 0.4", lambda v: v >= 0.4),
        (f"rate [M/s], window {args.window}: rpc_bw vs ib_send_bw RC", "rpc_mcalls", "send_bw_rc_mpps", 1,
         ratios["rate_vs_send_bw_rc"], "(reference)", None),
        (f"rate [M/s], window {args.window}: rpc_bw vs {ucx_name} ucp_am_bw{ucx_note}", "rpc_mcalls",
         "ucx_am_bw_mpps", 1, ratios["rate_vs_ucx_am_bw"], "> 1", (lambda v: v > 1) if ucx.counts() else None),
    ]
    if ucx_ud.tls:
        ud_name = "UCX AM on UD alone (UCX_TLS=ud_v UCX_UD_VERBS_ETH_DGID_CHECK=n)"
        rows += [
            (f"round trip [us]: rpc_lat vs 2 x {ud_name} ucp_am_lat", "rpc_rtt_us", "ucx_ud_am_lat_us", 2,
             ratios["rtt_vs_2x_ucx_ud_am_lat"], "(reference)", None),
            (f"rate [M/s], window {args.window}: rpc_bw vs {ud_name} ucp_am_bw", "rpc_mcalls", "ucx_ud_am_bw_mpps", 1,
             ratios["rate_vs_ucx_ud_am_bw"], "(reference)", None),
        ]
    every = "rpc_lat --rdma-threshold 0 (every message on the RC path)"
    every_bw = f"rate [M/s], window {args.window}: rpc_bw --rdma-threshold 0"
    rows += [
        (f"round trip [us]: {every} vs 2 x ib_send_lat UD", "rpc_rtt_rc_us", "send_lat_ud_us", 2,
         ratios["rc_rtt_vs_2x_send_lat_ud"], "(reference)", None),
        (f"round trip [us]: {every} vs 2 x ib_send_lat RC", "rpc_rtt_rc_us", "send_lat_rc_us", 2,
         ratios["rc_rtt_vs_2x_send_lat_rc"], "(reference)", None),
        (f"round trip [us]: {every} vs 2 x {ucx_name} ucp_am_lat{ucx_note}", "rpc_rtt_rc_us", "ucx_am_lat_us", 2,
         ratios["rc_rtt_vs_2x_ucx_am_lat"], "(reference)", None),
        (f"{every_bw} vs ib_send_bw RC", "rpc_mcalls_rc", "send_bw_rc_mpps", 1, ratios["rc_rate_vs_send_bw_rc"],
         "(reference)", None),
        (f"{every_bw} vs {ucx_name} ucp_am_bw{ucx_note}", "rpc_mcalls_rc", "ucx_am_bw_mpps", 1,
         ratios["rc_rate_vs_ucx_am_bw"], "(reference)", None),
    ]
    figures = {**lat, **rate}
    per_round_ratios = {}

    def paired(mine_key, other_key, scale):
        """The ratio within each round that has both figures: the host's speed, which
        drifts between rounds, moves both."""
        return [r[mine_key] / (scale * r[other_key]) for r in per_round if mine_key in r and other_key in r]

    table = (f"# lib/rpc against perftest and UCX ({device}, {args.size} B, {args.rounds} rounds alternating)\n\n"
             "Each tool's best round / median of the rounds (range); ratio = rdmaxx rpc / other, of the best "
             "rounds (of the medians); per round: the median of the ratios within each round (their range). "
             "Round trips: the other tool's half round trip doubled. Soft-RoCE under "
             "QEMU TCG: only the ratios of one run mean anything.\n\n"
             "| comparison | other: best / median (range) | rdmaxx rpc: best / median (range) | ratio best (median) "
             "| per round | target | verdict |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    for name, mine_key, other_key, scale, (best, median), target, ok in rows:
        mine, mine_runs = figures[mine_key], runs[mine_key]
        other, other_runs = figures[other_key], runs[other_key]
        digits = 1 if scale == 2 else 4
        scaled = [v * scale for v in other_runs]
        others = (f"{fmt(other[0] and other[0] * scale, digits)} / {fmt(other[1] and other[1] * scale, digits)} "
                  f"({spread(scaled, digits)})") if other_runs else "-"
        within = paired(mine_key, other_key, scale)
        per_round_ratios[f"{mine_key} / {other_key}"] = within
        table += (f"| {name} | {others} | {fmt(mine[0], digits)} / {fmt(mine[1], digits)} "
                  f"({spread(mine_runs, digits)}) | {fmt(best)} ({fmt(median)}) | "
                  f"{fmt(statistics.median(within)) if within else '-'} ({spread(within)}) | {target} | "
                  f"{verdict(best, ok) if ok else '-'} |\n")
    per_message = ""
    if rate["rpc_mcalls"][0] and rate["ucx_am_bw_mpps"][0]:
        per_message = (f": counted per message, rpc_bw's best round is "
                       f"{fmt(2 * rate['rpc_mcalls'][0] / rate['ucx_am_bw_mpps'][0])}x ucp_am_bw's")
    table += (f"\nrdmaxx rpc retransmissions per run: rpc_lat {retransmissions['rpc_lat']}, "
              f"rpc_lat --callbacks {retransmissions['rpc_lat_callbacks']}, "
              f"rpc_lat --task {retransmissions['rpc_lat_task']}, "
              f"rpc_lat --rdma-threshold 0 {retransmissions['rpc_lat_rc']}, "
              f"rpc_bw {retransmissions['rpc_bw']}, rpc_bw --rdma-threshold 0 {retransmissions['rpc_bw_rc']}. Latencies are medians (perftest's and rdmaxx-perf's "
              "t_typical, ucx_perftest's 50th percentile); ucp_am_lat's means (half round trips, us): "
              f"{[round(v, 1) for v in ucx_mean]}. ucp_am_bw's rate is of one-way messages, rpc_bw's of calls "
              f"(a request and its response){per_message}.\n")
    big = {k: best_median(v, max) for k, v in large.items()}
    ratios["mib_one_way_vs_read_bw"] = [ratio(big["rpc_one_way"], big["read_bw"], i) for i in (0, 1)]
    ratios["mib_echo_both_vs_read_bw"] = [ratio(big["rpc_echo_both"], big["read_bw"], i) for i in (0, 1)]
    ratios["mib_one_way_vs_ucx_am_bw"] = [ratio(big["rpc_one_way"], big["ucx_am_bw"], i) for i in (0, 1)]
    table += (f"\n## 1 MiB ({args.large_rounds} rounds alternating, MiB/s of payload)\n\n"
              "| comparison | other: best / median (range) | rdmaxx rpc: best / median (range) | ratio best (median) "
              "| target | verdict |\n| --- | --- | --- | --- | --- | --- |\n")
    for name, other, mine, key, target, ok in (
            ("one way (1 MiB requests, window 4) vs ib_read_bw", "read_bw", "rpc_one_way", "mib_one_way_vs_read_bw",
             ">= 0.8", lambda v: v >= 0.8),
            (f"one way vs {ucx_name} ucp_am_bw{ucx_note}", "ucx_am_bw", "rpc_one_way", "mib_one_way_vs_ucx_am_bw",
             "> 1", (lambda v: v > 1) if ucx.counts() else None),
            ("echo (1 MiB each way, window 1), both ways together, vs ib_read_bw", "read_bw", "rpc_echo_both",
             "mib_echo_both_vs_read_bw", "(reference)", None)):
        best, median = ratios[key]
        table += (f"| {name} | {fmt(big[other][0], 1)} / {fmt(big[other][1], 1)} ({spread(large[other], 1)}) | "
                  f"{fmt(big[mine][0], 1)} / {fmt(big[mine][1], 1)} ({spread(large[mine], 1)}) | "
                  f"{fmt(best)} ({fmt(median)}) | {target} | {verdict(best, ok) if ok else '-'} |\n")
    table += "\n## UCX on this device\n\n"
    for a in ucx.attempts + ucx_ud.attempts:
        if a["error"] is None:
            table += f"- `{a['config']}`: ran ({'; '.join(a['lanes']) or 'lanes not logged'}).\n"
        else:
            table += f"- `{a['config']}`: failed:\n\n```\n{a['error'].strip()}\n```\n"
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rpc.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "rpc.json"), "w") as f:
        json.dump({"device": device, "size": args.size, "window": args.window, "rounds": args.rounds,
                   "runs": runs, "large_runs_mib_per_s": large, "retransmissions": retransmissions, "ucx_am_lat_mean_us": ucx_mean, "ratios_best_median": ratios,
                   "ratios_per_round": per_round_ratios, "runs_per_round": per_round,
                   "ucx": {"tls": ucx.tls, "counts": ucx.counts(), "attempts": ucx.attempts},
                   "ucx_ud_alone": {"tls": ucx_ud.tls, "attempts": ucx_ud.attempts}}, f, indent=1)


def sweep(args, device, gid, sizes):
    """The round trip by size: rpc_lat (default threshold, and every message on the RC
    path), ucp_am_lat and ib_send_lat RC, alternating within each round."""
    host = "127.0.0.1"
    ucx = Ucx(sizes[0], ucx_configs(device))
    tools = ("rpc", "rpc_rc", "ucx", "send_lat_rc")
    runs = {size: {t: [] for t in tools} for size in sizes}
    for r in range(args.rounds):
        for size in sizes:
            iters = max(50, min(2000, (64 << 20) // size))  # ~64 MiB each way per run, at most 2,000
            mine = [args.perf, "rpc_lat", "-d", device, "-s", str(size), "-n", str(iters)]
            for key, extra in (("rpc", []), ("rpc_rc", ["--rdma-threshold", "0"])):
                out = run_pair(mine + extra, mine[:2] + [host] + mine[2:] + extra + ["--json"])
                if out is not None:
                    runs[size][key].append(rdmaxx_row(out)["t_typical"])
            if ucx.counts():
                runs[size]["ucx"].append(2 * ucx.run("ucp_am_lat", iters, size=size)["50.0_percentile_lat"])
            pt = ["ib_send_lat", "-d", device, "-c", "RC", "-s", str(size), "-n", str(iters)] + (
                ["-x", gid] if gid else [])
            out = run_pair(pt, pt + [host])
            if out:
                runs[size]["send_lat_rc"].append(2 * perftest_figure(out, True, size))
            print(f"rpc_compare: sweep round {r + 1}, {size} B: " +
                  ", ".join(f"{t} {v[-1]:.1f}" for t, v in runs[size].items() if v), flush=True)

    def cell(v):
        return f"{min(v):.1f} / {statistics.median(v):.1f} ({spread(v, 1)})" if v else "-"

    def ratio(a, b):
        return f"{min(a) / min(b):.2f} ({statistics.median(a) / statistics.median(b):.2f})" if a and b else "-"

    ucx_name = " ".join(f"{k}={v}" for k, v in ucx.env.items() if k != "UCX_NET_DEVICES") if ucx.counts() else None
    table = (f"# lib/rpc's round trip by size ({device}, {args.rounds} rounds alternating)\n\n"
             "Round trips in us, each tool's best round / median of the rounds (range); ratios of the best "
             "rounds (of the medians), rdmaxx / UCX: below 1 is faster. rpc: rdmaxx-perf rpc_lat, busy, with "
             "lib/rpc's default rdma_threshold (one UD packet's payload: above it the RC path); rpc RC: every message on the "
             "session's RC path (--rdma-threshold 0); UCX: ucp_am_lat's median half round trip doubled"
             f"{f' ({ucx_name})' if ucx_name else ' (did not run on this device)'}; ib_send_lat RC doubled, "
             "for reference. Soft-RoCE under QEMU TCG: only the ratios of one run mean anything.\n\n"
             "| bytes | rpc | rpc RC | UCX AM | ib_send_lat RC | rpc / UCX | rpc RC / UCX | faster than UCX |\n"
             "| ---: | --- | --- | --- | --- | --- | --- | --- |\n")
    for size in sizes:
        v = runs[size]
        best = min(v["rpc"] + v["rpc_rc"]) if v["rpc"] or v["rpc_rc"] else None
        verdict = "-" if best is None or not v["ucx"] else ("yes" if best < min(v["ucx"]) else "**no**")
        table += (f"| {size} | {cell(v['rpc'])} | {cell(v['rpc_rc'])} | {cell(v['ucx'])} | {cell(v['send_lat_rc'])} | "
                  f"{ratio(v['rpc'], v['ucx'])} | {ratio(v['rpc_rc'], v['ucx'])} | {verdict} |\n")
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rpc-sizes.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "rpc-sizes.json"), "w") as f:
        json.dump({"device": device, "rounds": args.rounds, "ucx": ucx.env if ucx.counts() else None,
                   "round_trip_us": {str(k): v for k, v in runs.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
