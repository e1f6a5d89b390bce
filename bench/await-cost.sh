#!/bin/bash
# await-cost.sh [BUILD_DIR] [N] - instructions per awaited RDMA WRITE (callgrind, which
# counts instructions, not time: repeatable on a noisy machine) against the raw verbs
# loop that takes a completion and posts the next WR. Needs an RDMA device:
#   scripts/vm/run.sh bench/await-cost.sh build
# Each step takes one completion, resumes its waiter and posts the next WR (see
# bench/await_cost.cpp), through raw verbs, lib/async with a completion handler
# (callback), and lib/async awaited with asio::use_awaitable (await). The program waits
# for each completion outside the count, so no step polls an empty CQ. Prints one line
# per path, the await path's instructions split by where they run (Asio's coroutine
# machinery, rdmaxx, the verbs provider, libc), and fails when lib/async's own path
# (callback) adds more than its budget to the raw loop.
set -euo pipefail
build=${1:-build}
n=${2:-10000}
budget=750 # measured on rxe: 686 (await: 982, Asio's coroutine machinery the difference)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A per_step
for variant in raw callback await; do
    valgrind --tool=callgrind --callgrind-out-file="$out/$variant" --toggle-collect="${variant}_step" \
        "$build/bench/rdmaxx-await-cost" "$variant" "$n" >"$out/$variant.log" 2>&1 ||
        { cat "$out/$variant.log"; exit 1; }
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$out/$variant")
    per_step[$variant]=$((total / n))
    printf '%-8s %6d instructions per step (%d steps)\n' "$variant" "${per_step[$variant]}" "$n"
done
# self cost per function, grouped by the source (or object) it comes from
callgrind_annotate --inclusive=no --auto=no --threshold=100 "$out/await" 2>/dev/null |
    awk -v n="$n" '
        /^ *[0-9,]+ .*:/ {
            cost = $1; gsub(",", "", cost)
            if ($0 ~ /\/asio\//) group = "asio"
            else if ($0 ~ /rdmaxx|await_cost/) group = "rdmaxx"
            else if ($0 ~ /rdmav|libibverbs|verbs\.h/) group = "verbs"
            else if ($0 ~ /libc|libstdc/) group = "libc"
            else group = "other"
            sum[group] += cost
        }
        END { printf "await, by source:"; for (g in sum) printf " %s %d", g, sum[g] / n; print "" }'
added=$((per_step[callback] - per_step[raw]))
echo "lib/async over raw verbs: callback $added, await $((per_step[await] - per_step[raw])) instructions per operation (budget for callback: $budget)"
[ "$added" -le "$budget" ]
