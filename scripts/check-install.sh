#!/bin/bash
# check-install.sh - rdmaxx as its users get it: `meson install` into a prefix, then a
# consumer project built against the installed .pc files, the same consumer built with
# CMake (find_package), and with rdmaxx as a meson subproject. The wrap-only program
# must not need the data library; the CMake-built programs run without LD_LIBRARY_PATH.
# The lib/rpc consumer makes a call over RDMA: on this machine's device, else on rxe0
# in the project's Soft-RoCE VM (scripts/vm/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# Without a device here the lib/rpc consumer runs in the VM, which sees the project
# directory but not this machine's /tmp: the work tree is then a build-* directory.
runner=() tmp=${TMPDIR:-/tmp}
compgen -G '/sys/class/infiniband/*' >/dev/null || runner=(scripts/vm/run.sh) tmp=$root
work=$(mktemp -d "$tmp/build-install.XXXXXX")
trap 'rm -rf "$work"' EXIT

# unoptimised, no debug information: what is checked is what is installed and how
# consumers find it, and the compiler takes half the time
meson setup "$work/build" --prefix "$work/prefix" -Dtests=false -Dexamples=false \
    -Doptimization=0 -Ddebug=false >/dev/null
ninja -C "$work/build" >/dev/null
meson install -C "$work/build" --no-rebuild >/dev/null
pcdir=$(dirname "$(find "$work/prefix" -name rdmaxx-wrap.pc)")
for pc in rdmaxx rdmaxx-wrap rdmaxx-data rdmaxx-async rdmaxx-rpc; do
    [ -f "$pcdir/$pc.pc" ] || { echo "check-install: $pc.pc not installed"; exit 1; }
done
[ -f "$work/prefix/include/rdmaxx/wrap/qp.hpp" ] && [ -f "$work/prefix/include/rdmaxx/data/post.hpp" ] &&
    [ -f "$work/prefix/include/rdmaxx/rpc/endpoint.hpp" ] ||
    { echo "check-install: headers not installed under include/rdmaxx"; exit 1; }
[ -f "$pcdir/../cmake/rdmaxx/rdmaxxConfig.cmake" ] && [ -f "$pcdir/../cmake/rdmaxx/rdmaxxConfigVersion.cmake" ] ||
    { echo "check-install: the CMake package not installed"; exit 1; }

# installed: found through pkg-config
PKG_CONFIG_PATH=$pcdir meson setup "$work/installed" tests/consumer --wrap-mode=nofallback >/dev/null
ninja -C "$work/installed" >/dev/null
libdir=$(dirname "$(find "$work/prefix" -name 'librdmaxx-wrap.so' | head -n 1)")
LD_LIBRARY_PATH=$libdir "$work/installed/wrap-only"
# lib/rpc through pkg-config: one call, on the installed libraries alone
LD_LIBRARY_PATH=$libdir "${runner[@]}" "$work/installed/with-rpc" ||
    { echo "check-install: the lib/rpc consumer failed"; exit 1; }
if ! readelf -d "$work/installed/with-rpc" | grep -q 'librdmaxx-rpc'; then
    echo "check-install: with-rpc does not link librdmaxx-rpc"; exit 1
fi
[ -x "$work/installed/umbrella" ] || { echo "check-install: rdmaxx.pc did not resolve"; exit 1; }
if readelf -d "$work/installed/wrap-only" | grep -q rdmaxx-data; then
    echo "check-install: wrap-only links the data library"; exit 1
fi

# installed: found through CMake (its package reads the same .pc files); no
# LD_LIBRARY_PATH: the installed libraries carry a runpath, CMake gives the programs one
cmake -S tests/consumer -B "$work/cmake" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake" >/dev/null
"$work/cmake/wrap-only"
"$work/cmake/with-data"
"${runner[@]}" "$work/cmake/with-rpc" || { echo "check-install: the CMake-built lib/rpc consumer failed"; exit 1; }
if readelf -d "$work/cmake/wrap-only" | grep -q rdmaxx-data; then
    echo "check-install: the CMake-built wrap-only links the data library"; exit 1
fi
mkdir -p "$work/versions"
cat > "$work/versions/CMakeLists.txt" <<'VERSIONS'
cmake_minimum_required(VERSION 3.20)
project(rdmaxx-versions CXX) # CXX: the library architecture directory is searched
find_package(rdmaxx 0.2 CONFIG QUIET)
if(rdmaxx_FOUND)
  message(FATAL_ERROR "0.1 satisfied a request for 0.2")
endif()
find_package(rdmaxx 0.1.0 CONFIG QUIET COMPONENTS nosuch)
if(rdmaxx_FOUND)
  message(FATAL_ERROR "a component that does not exist was found")
endif()
find_package(rdmaxx 0.1.0 CONFIG REQUIRED COMPONENTS async)
VERSIONS
cmake -S "$work/versions" -B "$work/versions/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null ||
    { echo "check-install: the CMake package's version or component rules are wrong"; exit 1; }

# subproject
cp -r tests/consumer "$work/consumer"
mkdir -p "$work/consumer/subprojects"
ln -s "$root" "$work/consumer/subprojects/rdmaxx"
meson setup "$work/sub" "$work/consumer" --wrap-mode=forcefallback -Drdmaxx:tests=false -Drdmaxx:examples=false >/dev/null
# only the programs it runs, and so only the layers they need (wrap, data): the layers
# above were built and linked twice already (installed: pkg-config, CMake), and a third
# compile of them costs CI a minute
ninja -C "$work/sub" wrap-only with-data >/dev/null
"$work/sub/wrap-only"
"$work/sub/with-data"
echo "check-install: installed and subproject consumers build and run"
