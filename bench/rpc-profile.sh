#!/bin/bash
# rpc-profile.sh [BUILD_DIR] [N] [MODE] [RPC_LAT_ARG]... - what a lib/rpc call runs,
# each side: callgrind (it counts instructions, not time) of `rdmaxx-perf rpc_lat` (32 B,
# N calls, the endpoints in MODE: busy, event or hybrid; the further arguments to both
# sides, e.g. --rdma-threshold 0 for the RC path, --callbacks for the callback form).
# N (15000) must exceed what a setup loop runs (the server's 8,207 ring receives and
# 1,024 send buffers, whose slices one function makes): the footprint counts the
# instructions run about once per call or more.
# The client is profiled against a server run normally, then the server against a
# client. Prints, for the client, the inclusive instructions per call of the call path's
# parts, and for each side the call's footprint: the distinct instructions it runs, per
# library and function (bench/footprint.py: under emulation, what a round trip pays for).
# Needs a device:
#   scripts/vm/run.sh bench/rpc-profile.sh build
# Polling (Completions::spin/take) grows with the time a call waits, which valgrind
# stretches: read the parts, not the total. The footprint does not grow so: it repeats to
# the instruction.
set -euo pipefail
build=${1:-build}
n=${2:-15000}
mode=${3:-busy}
shift $(($# < 3 ? $# : 3))
dev=${RDMAXX_DEVICE:-$(ls /sys/class/infiniband | head -n 1)}
bench=$(dirname "$0")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
warm=$((n / 10 < 5 ? 5 : n / 10 > 200 ? 200 : n / 10)) # rdmaxx-perf's warm-up calls
calls=$((n + warm))
perf=("$build/bench/rdmaxx-perf" rpc_lat -d "$dev" -n "$n" --async "$mode" "$@")
profile=(valgrind --tool=callgrind --dump-instr=yes)

port=18700
taskset -c 0 "${perf[@]}" -p $port >/dev/null 2>&1 &
sleep 1
taskset -c 1 "${profile[@]}" --callgrind-out-file="$out/client.cg" "${perf[@]}" 127.0.0.1 -p $port --timeout 60000 \
    >"$out/client.log" 2>&1 || { cat "$out/client.log"; exit 1; }
wait

port=18701 # valgrind takes seconds to start the server: the client waits for its port
taskset -c 0 "${profile[@]}" --callgrind-out-file="$out/server.cg" "${perf[@]}" -p $port >"$out/server.log" 2>&1 &
taskset -c 1 "${perf[@]}" 127.0.0.1 -p $port --timeout 60000 >"$out/server-client.log" 2>&1 ||
    { cat "$out/server-client.log" "$out/server.log"; exit 1; }
wait

echo "client: inclusive instructions per call"
callgrind_annotate --inclusive=yes --threshold=99.99 "$out/client.cg" 2>/dev/null |
    awk -v calls="$calls" '
        /(lib\/rpc\/src\/[a-z_]+\.cpp|lib\/wrap\/src\/mr\.cpp):.*\[/ {
            count = $1; gsub(/,/, "", count); name = $0
            sub(/^.*(lib\/rpc\/src\/[a-z_]+\.cpp|lib\/wrap\/src\/mr\.cpp):/, "", name); sub(/\(.*$/, "", name)
            sub(/^.*rdmaxx::/, "", name)
            if (!(name in seen)) { seen[name] = 1; printf "%8.0f  %s\n", count / calls, name }
        }' | sort -rn | head -25
for side in client server; do
    echo
    echo "$side: footprint"
    python3 "$bench/footprint.py" "$out/$side.cg" "$calls" 30 'sort|summarize' # not the latencies' summary
done
