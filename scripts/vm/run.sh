#!/bin/bash
# run.sh CMD [ARGS...] - runs CMD in a throw-away QEMU VM that boots Debian's own
# kernel with Soft-RoCE: a real RDMA device, rxe0, on a machine that has none.
#
# Inside, CMD sees the host's / read-only at the same paths, the current directory
# read-write (CMD starts there), fresh tmpfs on /tmp /var/tmp /run /dev/shm, the
# caller's exported environment, root, and rxe0 on dummy0 (192.0.2.1/24). It gets
# RDMAXX_VM=1, RDMAXX_VM_DEV=rxe0, RDMAXX_VM_ADDR=192.0.2.1 (RDMA CM needs a
# non-loopback address) and RDMAXX_VM_GID_INDEX (the RoCE v2 IPv4 GID). The guest has
# no NIC: nothing leaves it. CMD's output is streamed; its exit code is run.sh's.
# 125: the VM failed before CMD ran (the console log follows); 124: timeout.
#
# Knobs: RDMAXX_VM_TIMEOUT (s, 3600), RDMAXX_VM_MTU (dummy0's MTU; 1500 gives a
# RoCE MTU of 1024, 4200+ gives 4096), RDMAXX_VM_MEM (1G), RDMAXX_VM_SMP (2: two
# busy-polling peers on one vCPU are ~200x slower), RDMAXX_VM_ACCEL (tcg | kvm),
# RDMAXX_VM_VERBOSE=1 (guest console to stderr), RDMAXX_VM_CACHE (/var/tmp/rdmaxx-vm).
# One VM at a time: they take a lock, so concurrent callers queue.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "rdmaxx-vm: $*" >&2; exit 125; }
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: scripts/install-deps.sh"

cache=${RDMAXX_VM_CACHE:-/var/tmp/rdmaxx-vm}
kver=
for d in /lib/modules/*/kernel/drivers/infiniband/sw/rxe; do   # newest kernel with rdma_rxe
    v=${d#/lib/modules/}; v=${v%%/*}
    [ -e "/boot/vmlinuz-$v" ] && kver=$v
done
[ -n "$kver" ] || die "no kernel with rdma_rxe: scripts/install-deps.sh installs linux-image-amd64"
mkdir -p "$cache"
exec 8>"$cache/vm.lock"
flock 8   # one VM at a time: two would share two cores
initrd=$cache/initramfs-$kver.cpio.gz
if [ ! -s "$initrd" ] || [ "$here/init.sh" -nt "$initrd" ] || [ "$here/build-initramfs.sh" -nt "$initrd" ]; then
    "$here/build-initramfs.sh" "$initrd" "$kver" || die "building the initramfs failed"
fi
kernel=$cache/vmlinux-$kver
[ -s "$kernel" ] || kernel=/boot/vmlinuz-$kver

case "${RDMAXX_VM_ACCEL:-tcg}" in
    tcg) accel=(-accel tcg,thread=multi -cpu max) ;;
    kvm) accel=(-accel kvm -cpu host) ;;
    *) die "RDMAXX_VM_ACCEL must be tcg or kvm" ;;
esac

ctl=$(mktemp -d /tmp/rdmaxx-vm.XXXXXX) || die "mktemp"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$ctl"' EXIT
trap 'exit 130' INT TERM

work=$(pwd -P)
[ "$work" = / ] && die "run it from a project directory, not /"
quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
printf 'VM_WORK=%s\nVM_MTU=%s\n' "$(quote "$work")" "$(quote "${RDMAXX_VM_MTU:-}")" > "$ctl/job.env"
{
    # the caller's exported environment, without the host session's own variables
    export -p | grep -vE '^declare -[a-zA-Z-]* (PWD|OLDPWD|SHLVL|_|BASHOPTS|SHELLOPTS|SSH_[A-Z_]*|DISPLAY|XDG_RUNTIME_DIR|DBUS_SESSION_BUS_ADDRESS)(=|$)'
    echo 'export RDMAXX_VM=1'
    echo 'set -a; . /run/rdmaxx-vm.env; set +a'
    echo 'ulimit -l unlimited'
    echo "cd -- $(quote "$PWD") || exit 125"
    printf 'exec'; printf ' %q' "$@"; echo
} > "$ctl/job.sh"
mkfifo "$ctl/stdout" "$ctl/stderr"

p9() { printf 'local,path=%s,mount_tag=%s,security_model=none,multidevs=remap%s' "${1//,/,,}" "$2" "${3:-}"; }
qemu=(qemu-system-x86_64 -nodefaults -no-user-config -no-reboot
    -machine q35 "${accel[@]}" -smp "${RDMAXX_VM_SMP:-2}" -m "${RDMAXX_VM_MEM:-1G}"
    -nic none                        # no network device: nothing can leave the guest
    -display none -vga none -monitor none -serial "file:$ctl/console.log"
    -kernel "$kernel" -initrd "$initrd"
    -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off tsc=reliable"
    -virtfs "$(p9 / hostroot ,readonly=on)"
    -virtfs "$(p9 "$ctl" ctl)"
    -virtfs "$(p9 "$work" work)"
    -device virtio-serial-pci
    -chardev "file,id=out,path=${ctl//,/,,}/stdout" -device virtserialport,chardev=out,name=rdmaxx.stdout
    -chardev "file,id=err,path=${ctl//,/,,}/stderr" -device virtserialport,chardev=err,name=rdmaxx.stderr)

# readers first: QEMU blocks opening a FIFO until it has one
cat "$ctl/stdout" & pids+=($!)
cat "$ctl/stderr" >&2 & pids+=($!)
if [ "${RDMAXX_VM_VERBOSE:-0}" = 1 ]; then
    : > "$ctl/console.log"
    tail -f "$ctl/console.log" >&2 & pids+=($!)
fi
timeout "${RDMAXX_VM_TIMEOUT:-3600}" "${qemu[@]}" 2> "$ctl/qemu.err" < /dev/null
qemu_rc=$?
# a QEMU that died before opening the FIFOs leaves the readers blocked: open them once
for f in stdout stderr; do exec {fd}<>"$ctl/$f"; exec {fd}>&-; done
wait "${pids[0]}" "${pids[1]}" 2>/dev/null

[ "$qemu_rc" = 124 ] && { echo "rdmaxx-vm: timeout after ${RDMAXX_VM_TIMEOUT:-3600} s" >&2; exit 124; }
if [ -s "$ctl/rc" ]; then
    rc=$(cat "$ctl/rc")
    [ "$rc" = 125 ] && tail -n 40 "$ctl/console.log" >&2
    exit "$rc"
fi
echo "rdmaxx-vm: the VM ended without an exit code (qemu exit $qemu_rc)" >&2
cat "$ctl/qemu.err" >&2
tail -n 60 "$ctl/console.log" >&2
exit 125
