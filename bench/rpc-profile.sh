#!/bin/bash
# rpc-profile.sh [BUILD_DIR] [N] [MODE] [RPC_LAT_ARG]... - where the instructions of a
# lib/rpc call go, at the client: callgrind (it counts instructions, not time) of
# `rdmaxx-perf rpc_lat` (32 B, N calls, the endpoints in MODE: busy, event or hybrid;
# the further arguments to both sides, e.g. --rdma-threshold 0 for the RC path) against
# a server run normally; prints the inclusive instructions per call of the call path's
# parts. Needs a device:
#   scripts/vm/run.sh bench/rpc-profile.sh build
# Polling (Completions::spin/take) grows with the time a call waits, which valgrind
# stretches: read the parts, not the total.
set -euo pipefail
build=${1:-build}
n=${2:-1000}
mode=${3:-busy}
shift $(($# < 3 ? $# : 3))
dev=${RDMAXX_DEVICE:-$(ls /sys/class/infiniband | head -n 1)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=18700
taskset -c 0 "$build/bench/rdmaxx-perf" rpc_lat -d "$dev" -n "$n" -p $port --async "$mode" "$@" >/dev/null 2>&1 &
sleep 1
taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$out/rpc.cg" "$build/bench/rdmaxx-perf" rpc_lat \
    127.0.0.1 -d "$dev" -n "$n" -p $port --async "$mode" --timeout 60000 "$@" >"$out/client.log" 2>&1 ||
    { cat "$out/client.log"; exit 1; }
wait
calls=$((n + n / 10)) # rdmaxx-perf warms up with a tenth as many
callgrind_annotate --inclusive=yes --threshold=99.99 "$out/rpc.cg" 2>/dev/null |
    awk -v calls="$calls" '
        /(lib\/rpc\/src\/[a-z_]+\.cpp|lib\/wrap\/src\/mr\.cpp):.*\[/ {
            count = $1; gsub(/,/, "", count); name = $0
            sub(/^.*(lib\/rpc\/src\/[a-z_]+\.cpp|lib\/wrap\/src\/mr\.cpp):/, "", name); sub(/\(.*$/, "", name)
            sub(/^.*rdmaxx::/, "", name)
            if (!(name in seen)) { seen[name] = 1; printf "%8.0f  %s\n", count / calls, name }
        }' | sort -rn | head -25
