#!/bin/bash
# soak-tutorial.sh [RUNS] [BUILD_DIR] - the tutorial (examples/run-tutorial.sh) RUNS times
# in a row per transport (default 200), with a CPU hog on every core beside it: the
# conversation's last call must never fail (issue 13). In the VM:
#   scripts/vm/run.sh scripts/soak-tutorial.sh 200
# Prints one line per transport and exits non-zero if any run failed.
set -uo pipefail
runs=${1:-200}
build=${2:-build}
here=$(dirname "$0")
hogs=()
for _ in $(seq "$(nproc)"); do
    (while :; do :; done) &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
failed_total=0
for transport in tcp cm; do
    failed=0
    start=$(date +%s)
    for i in $(seq "$runs"); do
        if ! out=$("$here/../examples/run-tutorial.sh" "$build" "$transport" 2>&1); then
            failed=$((failed + 1))
            echo "run $i over $transport failed:"
            echo "$out" | tail -20
        fi
    done
    echo "soak over $transport: $runs runs, $failed failed, $(($(date +%s) - start)) s, beside $(nproc) CPU hog(s)"
    failed_total=$((failed_total + failed))
done
[ "$failed_total" = 0 ]
