#!/bin/bash
# run-tutorial.sh BUILD_DIR - the tutorial end to end on this machine's RDMA device:
# the server, then the client once the server listens; both must exit 0.
set -uo pipefail
build=${1:-build}
if ! compgen -G '/sys/class/infiniband/*' >/dev/null; then
    echo "tutorial: no RDMA device here: skipped (run it with scripts/vm/run.sh)"
    exit 77
fi
port=${TUTORIAL_PORT:-7471}
address=${RDMAXX_VM_ADDR:-127.0.0.1}
"$build/examples/server" --host "$address" --port "$port" &
server=$!
for _ in $(seq 500); do   # until it listens (never a fixed sleep)
    ss -ltn | grep -q ":$port " && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.02
done
"$build/examples/client" --host "$address" --port "$port"
client_rc=$?
wait "$server"
server_rc=$?
echo "tutorial: client exit $client_rc, server exit $server_rc"
[ "$client_rc" = 0 ] && [ "$server_rc" = 0 ]
