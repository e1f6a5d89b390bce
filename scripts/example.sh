#!/bin/bash
# example.sh - install what is needed, build, and run the examples on a real RDMA
# device (this host's if it has one, else rxe0 in the project's Soft-RoCE VM): devinfo,
# then the tutorial's server and client through their five scenarios, over TCP and
# over RDMA CM, the same on lib/async (async_server with async_client over TCP and RDMA
# CM, and each async side with a blocking one), then
# async_mixed (one thread: RDMA, a TCP socket and a timer at once), then kv (lib/rpc: a
# key-value server and its load generator; the second server is stopped by SIGINT, its
# graceful shutdown, and must exit 0; the third sets its sessions up over RDMA CM).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build
ninja -C build examples/devinfo examples/server examples/client examples/async_server examples/async_client \
    examples/async_mixed examples/kv
run=(bash -c 'build/examples/devinfo && examples/run-tutorial.sh build tcp && examples/run-tutorial.sh build cm &&
     examples/run-tutorial.sh build tcp async_server async_client &&
     examples/run-tutorial.sh build cm async_server async_client &&
     examples/run-tutorial.sh build cm async_server client && examples/run-tutorial.sh build tcp server async_client &&
     build/examples/async_mixed --mode event && build/examples/async_mixed --mode busy &&
     { build/examples/kv --serve --once & server=$!; build/examples/kv 127.0.0.1 -n 5000; rc=$?;
       [ $rc = 0 ] || kill $server; wait $server; [ $rc = 0 ]; } &&
     { build/examples/kv --serve & server=$!; build/examples/kv 127.0.0.1 -n 5000 --read-gets; rc=$?;
       kill -INT $server; wait $server && [ $rc = 0 ]; } &&
     { address=${RDMAXX_VM_ADDR:-$(hostname -I | cut -d" " -f1)};
       build/examples/kv --serve --once --cm & server=$!; build/examples/kv "$address" -n 2000 --read-gets --cm; rc=$?;
       [ $rc = 0 ] || kill $server; wait $server; [ $rc = 0 ]; }')
if compgen -G '/sys/class/infiniband/*' >/dev/null; then
    exec "${run[@]}"
fi
exec scripts/vm/run.sh "${run[@]}"
