#!/bin/bash
# example.sh - install what is needed, build, and run the devinfo example on a real
# RDMA device: this host's if it has one, else rxe0 in the project's Soft-RoCE VM.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build
ninja -C build examples/devinfo
if compgen -G '/sys/class/infiniband/*' >/dev/null; then
    exec build/examples/devinfo
fi
exec scripts/vm/run.sh build/examples/devinfo
