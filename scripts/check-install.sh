#!/bin/bash
# check-install.sh - rdmaxx as its users get it: `meson install` into a prefix, then a
# consumer project built against the installed .pc files, and the same consumer with
# rdmaxx as a meson subproject. The wrap-only program must not need the data library.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/rdmaxx-install.XXXXXX")
trap 'rm -rf "$work"' EXIT

meson setup "$work/build" --prefix "$work/prefix" -Dtests=false -Dexamples=false >/dev/null
ninja -C "$work/build" >/dev/null
meson install -C "$work/build" --no-rebuild >/dev/null
pcdir=$(dirname "$(find "$work/prefix" -name rdmaxx-wrap.pc)")
for pc in rdmaxx rdmaxx-wrap rdmaxx-data; do
    [ -f "$pcdir/$pc.pc" ] || { echo "check-install: $pc.pc not installed"; exit 1; }
done
[ -f "$work/prefix/include/rdmaxx/wrap/qp.hpp" ] && [ -f "$work/prefix/include/rdmaxx/data/post.hpp" ] ||
    { echo "check-install: headers not installed under include/rdmaxx"; exit 1; }

# installed: found through pkg-config
PKG_CONFIG_PATH=$pcdir meson setup "$work/installed" tests/consumer --wrap-mode=nofallback >/dev/null
ninja -C "$work/installed" >/dev/null
LD_LIBRARY_PATH=$(dirname "$(find "$work/prefix" -name 'librdmaxx-wrap.so' | head -n 1)") \
    "$work/installed/wrap-only"
[ -x "$work/installed/umbrella" ] || { echo "check-install: rdmaxx.pc did not resolve"; exit 1; }
if readelf -d "$work/installed/wrap-only" | grep -q rdmaxx-data; then
    echo "check-install: wrap-only links the data library"; exit 1
fi

# subproject
cp -r tests/consumer "$work/consumer"
mkdir -p "$work/consumer/subprojects"
ln -s "$root" "$work/consumer/subprojects/rdmaxx"
meson setup "$work/sub" "$work/consumer" --wrap-mode=forcefallback -Drdmaxx:tests=false -Drdmaxx:examples=false >/dev/null
ninja -C "$work/sub" >/dev/null
"$work/sub/wrap-only"
"$work/sub/with-data"
echo "check-install: installed and subproject consumers build and run"
