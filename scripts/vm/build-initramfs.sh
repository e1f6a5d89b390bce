#!/bin/bash
# build-initramfs.sh OUT KVER - the VM's initramfs: a static busybox, init.sh as
# /init, and the kernel modules the guest needs (with their dependencies). Also
# extracts the ELF vmlinux next to OUT: QEMU boots it through the PVH entry point,
# seconds faster under TCG than the compressed bzImage.
set -euo pipefail
out=$1 kver=$2
here=$(cd "$(dirname "$0")" && pwd)
busybox=$(command -v busybox) || { echo "need busybox-static" >&2; exit 1; }
{ LC_ALL=C ldd "$busybox" 2>&1 || true; } | grep -q "not a dynamic" || { echo "need a static busybox (busybox-static)" >&2; exit 1; }

# 9p over virtio for the host's files, virtio-serial for the job's output, the RDMA
# core with Soft-RoCE and RDMA CM, crc32 for rxe's ICRC, dummy/veth netdevs for rxe
modules=(virtio_pci 9pnet_virtio 9p virtio_console ib_core ib_uverbs rdma_cm rdma_ucm rdma_rxe
         crc32_generic crc32_pclmul dummy veth sch_netem)

stage=$(mktemp -d /tmp/rdmaxx-initramfs.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,dev,proc,sys,newroot,"lib/modules/$kver"}
cp "$busybox" "$stage/bin/busybox"
for applet in $("$stage/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$stage/bin/$applet"
done
ln -sf ../bin/busybox "$stage/sbin/modprobe"   # the kernel's request_module() runs it
install -m 0755 "$here/init.sh" "$stage/init"

declare -A copied=()
for m in "${modules[@]}"; do
    while read -r verb path _; do
        [ "$verb" = insmod ] && [ -z "${copied[$path]:-}" ] || continue
        copied[$path]=1
        dst=$stage/${path%.xz}; dst=${dst%.zst}; dst=${dst%.gz}
        mkdir -p "$(dirname "$dst")"
        case "$path" in
            *.ko) cp "$path" "$dst" ;;
            *.ko.xz) xz -dc "$path" > "$dst" ;;
            *.ko.zst) zstd -qdc "$path" > "$dst" ;;
            *.ko.gz) gzip -dc "$path" > "$dst" ;;
        esac
    done < <(modprobe -S "$kver" --show-depends "$m")
done
for f in modules.order modules.builtin modules.builtin.modinfo; do
    [ -e "/lib/modules/$kver/$f" ] && cp "/lib/modules/$kver/$f" "$stage/lib/modules/$kver/"
done
depmod -b "$stage" "$kver"
(cd "$stage" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet --owner=0:0 | gzip -1) > "$out.tmp"
mv "$out.tmp" "$out"

# vmlinux: find the compressed payload inside the bzImage and unpack it
vmlinux=$(dirname "$out")/vmlinux-$kver
for spec in '\xfd\x37\x7a\x58\x5a\x00:xz -dc --single-stream' '\x1f\x8b\x08:gzip -dc' '\x28\xb5\x2f\xfd:zstd -qdc'; do
    magic=${spec%%:*} unpack=${spec#*:}
    command -v "${unpack%% *}" >/dev/null || continue
    for offset in $(LC_ALL=C grep -obUaP "$magic" "/boot/vmlinuz-$kver" | cut -d: -f1 | head -n 20); do
        # the unpacker stops at the payload end and tail then dies of SIGPIPE: no error
        tail -c +$((offset + 1)) "/boot/vmlinuz-$kver" | $unpack > "$vmlinux.tmp" 2>/dev/null || true
        if [ "$(head -c 4 "$vmlinux.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
            mv "$vmlinux.tmp" "$vmlinux"
            exit 0
        fi
    done
done
rm -f "$vmlinux.tmp"   # run.sh falls back to the bzImage
