#!/bin/bash
# check-static.sh [BUILD_DIR] - rdma_link=static: a -Werror build whose programs need
# and load no libibverbs, librdmacm or provider .so, and still find rxe0 and run an
# RC WRITE/READ between two QPs on it (in the VM unless this host has a device).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-static}
[ -f "$build/build.ninja" ] || meson setup "$build" -Drdma_link=static -Dwerror=true >/dev/null
ninja -C "$build" tests/device-wrap-tests >/dev/null
program=$build/tests/device-wrap-tests
if ldd "$program" | grep -Ei 'libibverbs|librdmacm|rdmav|libmlx|libnl'; then
    echo "check-static: $program needs the shared libraries above"; exit 1
fi
runner=(scripts/vm/run.sh)
compgen -G '/sys/class/infiniband/*' >/dev/null && runner=()
# LD_DEBUG=files lists every library the loader opens, dlopen()ed providers included
"${runner[@]}" bash -c '
    LD_DEBUG=files LD_DEBUG_OUTPUT=/tmp/ld "$1" --test-case="two RC QPs connect*" || exit 1
    if grep -hE "file=[^ ]*(rdmav|libibverbs|librdmacm|libmlx)" /tmp/ld.*; then
        echo "check-static: a provider or verbs library was loaded at run time"; exit 1
    fi' check-static "$program"
echo "check-static: static programs run on the device with no verbs library or provider .so"
