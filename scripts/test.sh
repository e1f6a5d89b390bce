#!/bin/bash
# test.sh - install what is needed, build, run the host suite on this machine and the
# device suite on a real RDMA device: this host's if it has one, else rxe0 in the
# project's Soft-RoCE VM (scripts/vm/run.sh). Ends with "N passed, N failed, N skipped".
#
#   scripts/test.sh [--build DIR] [--werror] [--no-debug-info] [--sanitize] [--no-fuzz]
#                   [--no-install] [--device-suite NAME]...
#
# Exit code 0 only when nothing failed.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
setup=()
install=1
device_suites=(--suite device)
device_filter=()
host_filter=()
while [ $# -gt 0 ]; do
    case "$1" in
        --build) build=$2; shift ;;
        --werror) setup+=(-Dwerror=true) ;;
        # -O2 without -g: a third less compile time, for a build whose tests pass or
        # fail on their own output (CI's -Werror half)
        --no-debug-info) setup+=(-Ddebug=false) ;;
        # perf-smoke (suite "perf") exercises the benchmark program's every test: the
        # -Werror run covers it; under the sanitizers it took a quarter of the device
        # suite's time (CI's 40-minute budget), and building the benchmark programs
        # there (never run) 70 s of 2 cores: -Dbench=false. copy-pair (suite "loss") is rdmaxx-copy
        # through a lossy wire: what it adds to the copy test (run here) is rxe's
        # retransmission, not the tool's code, and it costs a minute. -O1 compiles the
        # sanitizer build faster than the default -O2, and ASan's reports are as good;
        # so does -g1 (line tables: reports keep their file:line; the async and rpc
        # sources compiled a third faster than with -g). UBSan's alignment, null and
        # object-size checks doubled the build's time (the largest test source: 81 s
        # with them, 38 without, 38 with ASan alone) for what ASan already sees: an
        # access out of its object (object-size), a null dereference (its SEGV report);
        # lost is a misaligned access, which x86 forgives and the fuzz targets (clang's
        # full UBSan over the wire codecs) still check. The test programs' own sources,
        # the largest translation units, compile at -O0 (-Dtest_optimization=0: half
        # the time; the rpc ones excepted, tests/meson.build); the libraries stay at -O1
        # (all at -O0, device-rpc ran 2.3 times as long). The linkage test (nested
        # `meson setup` runs, no code of this build's: 27 s) runs in the other half only.
        --sanitize) setup+=(-Db_sanitize=address,undefined -Db_lundef=false -Doptimization=1
                            -Ddebug=false "-Dcpp_args=-g1 -fno-sanitize=alignment,null,object-size"
                            -Dbench=false -Dtest_optimization=0)
                    device_filter=(--no-suite perf --no-suite loss)
                    host_filter=(--no-suite linkage) ;;
        # the libFuzzer targets are compiled by clang with their own ASan and UBSan,
        # whatever this build's flags: CI builds and runs them in one of its two halves
        --no-fuzz) setup+=(-Dfuzz=disabled) ;;
        --no-install) install=0 ;;
        # only these suites of the device tests (CI runs each device test once: its
        # -Werror half the suites its sanitizer half leaves out)
        --device-suite) [ "${device_suites[*]}" = "--suite device" ] && device_suites=()
                        device_suites+=(--suite "$2"); shift ;;
        *) echo "test.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

[ "$install" = 1 ] && scripts/install-deps.sh
if [ -f "$build/build.ninja" ]; then
    meson setup --reconfigure "$build" "${setup[@]}" >/dev/null
else
    meson setup "$build" "${setup[@]}"
fi
ninja -C "$build"

rm -f "$build"/meson-logs/{host,device}.json
status=0
meson test -C "$build" --no-rebuild --suite host "${host_filter[@]}" --logbase host --print-errorlogs || status=1
if compgen -G '/sys/class/infiniband/*' >/dev/null; then
    device_runner=()
else
    device_runner=(scripts/vm/run.sh)
fi
"${device_runner[@]}" meson test -C "$build" --no-rebuild "${device_suites[@]}" "${device_filter[@]}" --logbase device \
    --print-errorlogs || status=1
python3 scripts/summarize.py "$build"/meson-logs/host.json "$build"/meson-logs/device.json || status=1
exit $status
