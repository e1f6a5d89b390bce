#!/bin/bash
# Runs a test program between two devices: in the project's VM, inside
# scripts/vm/pair.sh (rxeA and rxeB over a veth wire); elsewhere as it is.
if [ "${RDMAXX_VM:-}" = 1 ]; then
    exec "$(dirname "$0")/../../scripts/vm/pair.sh" "$@"
fi
exec "$@"
