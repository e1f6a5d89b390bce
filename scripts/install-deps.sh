#!/bin/bash
# install-deps.sh - install everything rdmaxx needs to build and to run its device
# tests in the Soft-RoCE VM, on Debian 12. Idempotent: already-installed packages are
# skipped, so CI can call it on every run.
set -euo pipefail

PACKAGES=(
    # build
    g++ meson ninja-build pkg-config cmake
    libibverbs-dev librdmacm-dev libspdlog-dev libfmt-dev doctest-dev
    # rdmaxx-copy's end-to-end checksum (XXH64, header-only: no link dependency)
    libxxhash-dev
    # lib/async's runtime (standalone, header-only)
    libasio-dev
    # the libFuzzer target of the endpoint parser (g++ has no libFuzzer; clang 14
    # cannot compile libstdc++ 12's <expected>, clang 19 can)
    clang-19 libclang-rt-19-dev
    # the Soft-RoCE VM: Debian's own kernel (it has rdma_rxe), qemu, a static busybox
    qemu-system-x86 linux-image-amd64 busybox-static kmod cpio xz-utils gzip iproute2
    # user space inside the VM (the guest runs the host's / read-only)
    rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
    # bench/rpc_compare.py's other engine: UCX active messages (ucx_perftest)
    ucx-utils
    # the API reference (ninja docs) and its host test
    doxygen
    # bench/compare.sh's plot (Debian's python3, not a pyenv one)
    python3-matplotlib
)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "install-deps: all ${#PACKAGES[@]} packages present"; exit 0; }

echo "install-deps: installing ${missing[*]}"
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
