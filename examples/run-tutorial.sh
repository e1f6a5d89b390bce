#!/bin/bash
# run-tutorial.sh BUILD_DIR [tcp|cm] [SERVER CLIENT] - the tutorial end to end on this
# machine's RDMA device: the server, then the client once the server listens; both
# must exit 0. SERVER and CLIENT name the examples (default: server client; the async
# ones are async_server and async_client, and any server works with any client).
# RDMA CM needs an address on the RDMA device's netdev: $RDMAXX_VM_ADDR in the VM.
set -uo pipefail
build=${1:-build}
transport=${2:-tcp}
server_program=${3:-server}
client_program=${4:-client}
if ! compgen -G '/sys/class/infiniband/*' >/dev/null; then
    echo "tutorial: no RDMA device here: skipped (run it with scripts/vm/run.sh)"
    exit 77
fi
port=${TUTORIAL_PORT:-7471}
# RDMA CM cannot use loopback: default to this machine's first non-loopback IPv4
address=${RDMAXX_VM_ADDR:-$(ip -4 -o addr show scope global | awk '{split($4, a, "/"); print a[1]; exit}')}
address=${address:-127.0.0.1}
"$build/examples/$server_program" --host "$address" --port "$port" --transport "$transport" &
server=$!
for _ in $(seq 500); do   # until it listens (never a fixed sleep)
    if [ "$transport" = cm ]; then
        rdma res show cm_id 2>/dev/null | grep -q "LISTEN.*:$port" && break
    else
        ss -ltn | grep -q ":$port " && break
    fi
    kill -0 "$server" 2>/dev/null || break
    sleep 0.02
done
if [ "$transport" = tcp ]; then
    # a port scanner's knock first: the server logs it and keeps listening
    { exec 3<>"/dev/tcp/$address/$port" && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && exec 3>&-; } 2>/dev/null
fi
"$build/examples/$client_program" --host "$address" --port "$port" --transport "$transport"
client_rc=$?
wait "$server"
server_rc=$?
echo "tutorial over $transport ($server_program, $client_program): client exit $client_rc, server exit $server_rc"
[ "$client_rc" = 0 ] && [ "$server_rc" = 0 ]
