#!/bin/bash
# rpc-syscalls.sh [BUILD_DIR] [N] - the system calls a lib/rpc call makes, each side,
# beside perftest's UD ping-pong: `rdmaxx-perf rpc_lat` (32 B, N calls, busy; awaited,
# then in the callback form) and `ib_send_lat -c UD` (N iterations), each process
# counted by the kernel's syscall tracepoints (perf stat: a count, not a time, so it
# holds on a noisy host). Prints per side the calls per round trip of write (the post's
# doorbell on rxe), epoll_wait, timerfd_settime and all of them; a tool's setup is in
# its count, so N should be large (20,000 by default). Needs a device and linux-perf:
#   scripts/vm/run.sh bench/rpc-syscalls.sh build
# Where they come from: bench/results/rpc-round-trip.md.
set -euo pipefail
build=${1:-build}
n=${2:-20000}
dev=${RDMAXX_DEVICE:-$(ls /sys/class/infiniband | head -n 1)}
command -v perf >/dev/null || { echo "rpc-syscalls: perf missing (Debian: linux-perf)" >&2; exit 1; }
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
calls=(write epoll_wait timerfd_settime)
events=$(printf 'syscalls:sys_enter_%s,' "${calls[@]}")raw_syscalls:sys_enter
gid=()
[ -n "${RDMAXX_VM_GID_INDEX:-}" ] && gid=(-x "$RDMAXX_VM_GID_INDEX")

# one side's counts, per round trip: write epoll_wait timerfd_settime all
per_call() {
    awk -F, -v n="$n" 'BEGIN { split("7 11 16 6", width, " ") }
        !/^#/ && NF > 2 { i++; printf "%" width[i] ".2f", $1 / n }' "$1"
}

# run NAME SERVER_CMD... -- CLIENT_CMD...: the two counted, server on CPU 0, client on CPU 1
port=18900
run() {
    local name=$1 server=() client=()
    shift
    while [ "$1" != -- ]; do server+=("$1"); shift; done
    shift
    client=("$@")
    taskset -c 0 perf stat -x, -e "$events" -o "$out/server" "${server[@]}" >"$out/server.log" 2>&1 &
    sleep 2
    taskset -c 1 perf stat -x, -e "$events" -o "$out/client" "${client[@]}" >"$out/client.log" 2>&1 ||
        { cat "$out/client.log" "$out/server.log"; exit 1; }
    wait $! || { cat "$out/server.log"; exit 1; }
    printf '%-28s %-7s%s\n' "$name" server "$(per_call "$out/server")" "" client "$(per_call "$out/client")"
    port=$((port + 1))
}

printf '%-28s %-7s%7s%11s%16s%6s\n' "per round trip" side write epoll_wait timerfd_settime all
perf_bin=("$build/bench/rdmaxx-perf" rpc_lat -d "$dev" -s 32 -n "$n" --async busy)
run "rpc_lat" "${perf_bin[@]}" -p $port -- "${perf_bin[@]}" 127.0.0.1 -p $port
run "rpc_lat --callbacks" "${perf_bin[@]}" --callbacks -p $port -- "${perf_bin[@]}" --callbacks 127.0.0.1 -p $port
pt=(ib_send_lat -d "$dev" -c UD -s 32 -n "$n" "${gid[@]}")
run "ib_send_lat -c UD" "${pt[@]}" -p $port -- "${pt[@]}" 127.0.0.1 -p $port
