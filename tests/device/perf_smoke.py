#!/usr/bin/env python3
"""perf_smoke.py RDMAXX_PERF - a short run of each rdmaxx-perf test, server and client
on this machine's RDMA device: both must exit 0 (each checks the bytes the other's
run left in its memory; the RPC tests' client checks every echo), and every output
line must parse with sane figures. No
speed is asserted. Also: a sweep in the human table, and a client the server must
refuse. Exit 77 (skipped) without an RDMA device."""
import glob
import json
import os
import shlex
import subprocess
import sys
import time

perf = sys.argv[1]
if not glob.glob("/sys/class/infiniband/*"):
    print("perf-smoke: no RDMA device here: skipped (run it with scripts/vm/run.sh)")
    sys.exit(77)

failures = []
next_port = 18700


def listening(port):
    out = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
    return f":{port} " in out


def pair(test, client_args, server_test=None, server_args=(), host="127.0.0.1", tty=False):
    """Runs a server and a client of `test`; returns (client rc, stdout, stderr, server rc)."""
    global next_port
    port, next_port = next_port, next_port + 1
    server = subprocess.Popen([perf, server_test or test, "-p", str(port), *server_args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    for _ in range(500):  # until it listens: never a fixed sleep
        if listening(port) or server.poll() is not None:
            break
        time.sleep(0.02)
    command = [perf, test, host, "-p", str(port), *client_args]
    if tty:  # stdout a terminal: script(1) gives the client a pseudo-terminal
        command = ["script", "-qec", shlex.join(command), "/dev/null"]
    client = subprocess.run(command, capture_output=True, text=True, timeout=300)
    try:
        server_out, server_err = server.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server_out, server_err = server.communicate()
    return client.returncode, client.stdout, client.stderr + server_err, server.returncode


def check(name, ok, detail=""):
    print(f"perf-smoke: {'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failures.append(name)


def check_json(name, out, test, sizes, qps):
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    check(f"{name}: one JSON line per size", [r["size"] for r in rows] == sizes, f"({len(rows)} lines)")
    for r in rows:
        check(f"{name}: names its test", r["tool"] == "rdmaxx-perf" and r["test"] == test and r["qps"] == qps)
        if test.endswith("_lat"):
            sane = 0 < r["t_min"] <= r["t_typical"] <= r["t_max"] and r["t_min"] <= r["t_avg"] <= r["t_max"] \
                and r["t_typical"] <= r["p99"] <= r["p99_9"] <= r["t_max"]
        else:
            sane = r["gbit_per_s"] > 0 and r["mpps"] > 0 and \
                abs(r["mib_per_s"] - r["gbit_per_s"] * 1e9 / 8 / 2**20) < 1e-3 * r["mib_per_s"] + 1e-3 and \
                r["iters"] == 20 * qps
        check(f"{name}: figures {r['size']} B", sane, json.dumps(r))


for verb in ["write", "read", "send", "write_imm", "atomic"]:
    for measure in ["lat", "bw"]:
        test = f"{verb}_{measure}"
        size = 8 if verb == "atomic" else (64 if measure == "lat" else 4096)
        variants = [["-s", str(size)]]
        if measure == "bw":  # several QPs, post lists, a signal interval, the other atomic
            variants.append(["-s", str(size), "-q", "2", "-l", "4", "-Q", "8"] +
                            (["-A", "CMP_AND_SWAP"] if verb == "atomic" else []))
        elif verb == "atomic":
            variants.append(["-A", "CMP_AND_SWAP"])
        for extra in variants:
            name = f"{test} {' '.join(extra)}"
            rc, out, err, src = pair(test, ["-n", "20", "--json", *extra])
            check(f"{name}: client and server exit 0", rc == 0 and src == 0, err.strip())
            if rc == 0:
                check_json(name, out, test, [size], int(extra[extra.index("-q") + 1]) if "-q" in extra else 1)

# the client's loop on lib/async (the server is the same): each completion mode with a
# latency and a bandwidth test (every pair costs ~1.5 s of CI's budget)
for test, extra, modes in [("read_lat", ["-s", "64"], ["busy", "hybrid"]), ("atomic_lat", ["-A", "CMP_AND_SWAP"], ["event"]),
                           ("write_bw", ["-s", "4096", "-q", "2"], ["event"]),
                           ("read_bw", ["-s", "4096", "-t", "16"], ["hybrid"]),
                           ("atomic_bw", ["-A", "CMP_AND_SWAP"], ["busy"])]:
    for mode in modes:
        name = f"{test} --async {mode} {' '.join(extra)}"
        rc, out, err, src = pair(test, ["--async", mode, "-n", "20", "--json", *extra])
        check(f"{name}: client and server exit 0", rc == 0 and src == 0, err.strip())
        if rc == 0:
            check_json(name, out, test, [8 if test.startswith("atomic") else 64 if test.endswith("lat") else 4096],
                       2 if "-q" in extra else 1)
            rows = [json.loads(line) for line in out.splitlines()]
            check(f"{name}: says async {mode}, with its CPU time", all(
                r.get("async") == mode and r.get("cpu_us_per_op", 0) > 0 for r in rows), out.strip())

# lib/rpc's calls: one at a time and windows of them, single- and multi-packet, on
# several sessions, each side's endpoint in each completion mode; awaited by coroutines,
# and in the callback form
for test, extra in [("rpc_lat", ["-s", "32"]), ("rpc_lat", ["-s", "5000"]), ("rpc_bw", ["-s", "32", "-w", "8"]),
                    ("rpc_bw", ["-s", "3000", "-w", "4", "--sessions", "3"]), ("rpc_lat", ["-s", "32", "--callbacks"]),
                    ("rpc_bw", ["-s", "3000", "-w", "4", "--sessions", "3", "--callbacks"]),
                    ("rpc_lat", ["-s", "32", "--task"])]:
    for mode in ["busy", "event", "hybrid"] if extra == ["-s", "32"] else ["busy", "event"]:
        name = f"{test} --async {mode} {' '.join(extra)}"
        rc, out, err, src = pair(test, ["--async", mode, "-n", "20", "--json", *extra], server_args=["--async", mode])
        check(f"{name}: client and server exit 0", rc == 0 and src == 0, err.strip())
        if rc != 0:
            continue
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        sessions = int(extra[extra.index("--sessions") + 1]) if "--sessions" in extra else 1
        window = int(extra[extra.index("-w") + 1]) if "-w" in extra else 1
        form = "callbacks" if "--callbacks" in extra else "async::Task" if "--task" in extra else "asio::awaitable"
        check(f"{name}: one JSON line", [r["size"] for r in rows] == [int(extra[1])], out.strip())
        for r in rows:
            check(f"{name}: names its test, mode, window, sessions and form", r["test"] == test and
                  r["async"] == mode and r["window"] == window and r["sessions"] == sessions and
                  r["form"] == form and r["retransmissions"] >= 0, json.dumps(r))
            if test == "rpc_lat":
                sane = 0 < r["t_min"] <= r["t_typical"] <= r["t_max"] and r["t_typical"] <= r["p99"] <= r["t_max"]
            else:
                sane = r["mpps"] > 0 and r["iters"] == 20 * sessions and r["cpu_us_per_op"] > 0
            check(f"{name}: figures", sane, json.dumps(r))
rc, out, err, src = pair("rpc_lat", ["-a", "-n", "5"])
rows = [line.split() for line in out.splitlines() if line[:2].strip().isdigit()]
check("rpc_lat -a: a table row per size, 2 B .. 1 MiB", rc == 0 and src == 0 and [int(r[0]) for r in rows] ==
      [2 << i for i in range(20)], (out + err).strip()[-600:])
check("rpc_lat -a: perftest's columns, its own banner", "t_typical[usec]" in out and "lib/rpc sessions" in out)

# QPs connected through RDMA CM (it needs an address on the RDMA device's netdev)
cm_host = os.environ.get("RDMAXX_VM_ADDR") or subprocess.run(
    ["sh", "-c", "ip -4 -o addr show scope global | awk '{split($4, a, \"/\"); print a[1]; exit}'"],
    capture_output=True, text=True).stdout.strip()
for test, extra in [("write_lat", ["-s", "64"]), ("send_bw", ["-s", "4096", "-q", "2"]), ("read_bw", ["-s", "4096"]),
                    ("atomic_lat", ["-A", "CMP_AND_SWAP"])]:
    name = f"{test} -R {' '.join(extra)}"
    rc, out, err, src = pair(test, ["-R", "-n", "20", "--json", *extra], server_args=["-R"], host=cm_host)
    check(f"{name}: client and server exit 0", rc == 0 and src == 0, err.strip())
    if rc == 0:
        check_json(name, out, test, [8 if test.startswith("atomic") else 64 if test.endswith("lat") else 4096],
                   2 if "-q" in extra else 1)
        check(f"{name}: says RDMA CM", all(json.loads(l)["transport"] == "rdma_cm" for l in out.splitlines()))
rc, out, err, src = pair("write_lat", ["-R", "-n", "20"], host=cm_host)
check("RDMA CM client, TCP server: refused, and says why", rc == 1 and "over RDMA CM, this server over TCP" in err,
      err.strip())

# the human table over a whole sweep (2 B .. 8 MiB)
rc, out, err, src = pair("write_lat", ["-a", "-n", "5"])
rows = [line.split() for line in out.splitlines() if line[:2].strip().isdigit()]
check("write_lat -a: a table row per size", rc == 0 and src == 0 and [int(r[0]) for r in rows] ==
      [2 << i for i in range(23)], err.strip())
check("write_lat -a: perftest's columns", "t_typical[usec]" in out and "99.9% percentile[usec]" in out)

# on a terminal, a sweep shows its progress (and erases it before each row)
rc, out, err, src = pair("write_bw", ["-a", "-n", "5"], tty=True)
check("write_bw -a on a terminal: a progress line per size", rc == 0 and src == 0 and
      "[1/23] 2 B x 5..." in out and "[23/23] 8388608 B x 5..." in out, (out + err)[-300:])
rc, out, err, src = pair("write_bw", ["-s", "64", "-n", "5"], tty=True)
check("write_bw of one size on a terminal: no progress line", rc == 0 and "[1/1]" not in out)

# a client of another test is refused, and says why
rc, out, err, src = pair("write_bw", ["-n", "20"], server_test="read_bw")
check("mismatched tests: both fail", rc == 1 and src == 1)
check("mismatched tests: the client says why", "the client runs write_bw, this server read_bw" in err, err.strip())

# bad arguments never reach the device
bad = subprocess.run([perf, "write_lat", "127.0.0.1", "--qp", "2"], capture_output=True, text=True)
check("latency with 2 QPs: a usage error", bad.returncode == 2 and "one QP" in bad.stderr)
bad = subprocess.run([perf, "rpc_lat", "127.0.0.1", "-w", "4"], capture_output=True, text=True)
check("rpc_lat with a window of 4: a usage error", bad.returncode == 2 and "one call at a time" in bad.stderr)
bad = subprocess.run([perf, "write_bw", "127.0.0.1", "--sessions", "2"], capture_output=True, text=True)
check("write_bw with sessions: a usage error", bad.returncode == 2 and "RPC tests'" in bad.stderr)

print(f"perf-smoke: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
