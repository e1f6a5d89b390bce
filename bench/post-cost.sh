#!/bin/bash
# post-cost.sh [BUILD_DIR] [N] - instructions per post (callgrind, which counts
# instructions, not time: repeatable on a noisy machine) of rdmaxx's SendBatch against
# the raw verbs it calls, on both post APIs. Needs an RDMA device:
#   scripts/vm/run.sh bench/post-cost.sh build
# Prints one line per path and fails when rdmaxx adds more instructions to the raw
# post of its API than its budget: 60 classic, 100 extended (measured on rxe: 47 and
# 88; the extended path replays built WRs out of line, which is why automatic is
# classic).
set -euo pipefail
build=${1:-build}
n=${2:-10000}
declare -A budget=([classic]=60 [extended]=100)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A per_post
for variant in raw_classic rdmaxx_classic raw_extended rdmaxx_extended; do
    valgrind --tool=callgrind --callgrind-out-file="$out/$variant" --toggle-collect="${variant}_post" \
        "$build/bench/rdmaxx-post-cost" "$variant" "$n" >"$out/$variant.log" 2>&1 ||
        { cat "$out/$variant.log"; exit 1; }
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$out/$variant")
    per_post[$variant]=$((total / n))
    printf '%-16s %6d instructions per post (%d posts)\n' "$variant" "${per_post[$variant]}" "$n"
done
status=0
for api in classic extended; do
    added=$((per_post[rdmaxx_$api] - per_post[raw_$api]))
    echo "rdmaxx over raw, $api: $added instructions per post (budget ${budget[$api]})"
    [ "$added" -le "${budget[$api]}" ] || status=1
done
exit $status
