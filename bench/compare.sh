#!/bin/bash
# compare.sh [BUILD_DIR] [--rpc] [options] - perftest and rdmaxx-perf side by side on
# this machine's RDMA device, or on rxe0 in the project's Soft-RoCE VM when it has none.
# Results (table, raw figures, plot) go to bench/results/. See bench/compare.py; with
# --rpc, rdmaxx-perf's rpc_lat and rpc_bw beside perftest's UD and RC sends and UCX's
# active messages (bench/rpc_compare.py).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
script=bench/compare.py tool=(--perf "$build/bench/rdmaxx-perf")
if [ "${1:-}" = --rpc ]; then
    shift
    script=bench/rpc_compare.py
fi
[ -x "${tool[1]}" ] || { echo "compare: build first: meson setup $build && ninja -C $build" >&2; exit 2; }
runner=()
compgen -G '/sys/class/infiniband/*' >/dev/null || runner=(scripts/vm/run.sh)
# Debian's python3: its matplotlib draws the plot
"${runner[@]}" /usr/bin/python3 "$script" "${tool[@]}" "$@"
