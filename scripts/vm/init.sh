#!/bin/sh
# /init of the VM (busybox ash, PID 1): mounts the host's / read-only and the work
# dir read-write over 9p, creates rxe0 on dummy0, runs the job, writes its exit code
# to the control dir and powers off. It stays PID 1 so it can always power off.
export PATH=/bin:/sbin
R=/newroot CTL=/newroot/run/rdmaxx-vm
say() { echo "rdmaxx-vm: $*" > /dev/console; }
fail() {
    say "FATAL: $*"
    [ -n "$ERR" ] && echo "rdmaxx-vm: guest setup failed: $*" > "$ERR"
    [ -d "$CTL" ] && echo 125 > "$CTL/rc"
    sync; poweroff -f
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
modprobe -a virtio_pci 9pnet_virtio 9p virtio_console || fail "virtio/9p modules"

# the job's stdout/stderr: virtio-serial ports named by the host
OUT= ERR=
for _ in $(seq 50); do
    for p in /sys/class/virtio-ports/*; do
        case "$(cat "$p/name" 2>/dev/null)" in
            rdmaxx.stdout) OUT=/dev/${p##*/} ;;
            rdmaxx.stderr) ERR=/dev/${p##*/} ;;
        esac
    done
    [ -e "$OUT" ] && [ -e "$ERR" ] && break
    usleep 20000
done
[ -e "$OUT" ] || OUT=/dev/console
[ -e "$ERR" ] || ERR=/dev/console

P9=trans=virtio,version=9p2000.L,msize=512000
# the host's files do not change during a run: full caching
mount -t 9p -o "$P9,ro,cache=loose" hostroot $R || fail "mount the host's /"
mount -t tmpfs -o mode=0755 tmpfs $R/run || fail "tmpfs /run"
mkdir -p $CTL
mount -t 9p -o "$P9,rw,cache=none" ctl $CTL || fail "mount the control dir"
. $CTL/job.env
mount -t tmpfs -o mode=1777 tmpfs $R/tmp
mount -t tmpfs -o mode=1777 tmpfs $R/var/tmp
mount --move /dev $R/dev || fail "move /dev"
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount --bind $R/dev /dev
# the work dir, writable, at its host path (cache=mmap: linkers mmap their output)
if [ -n "$VM_WORK" ]; then
    mkdir -p "$R$VM_WORK" 2>/dev/null
    mount -t 9p -o "$P9,rw,cache=mmap" work "$R$VM_WORK" || fail "mount the work dir $VM_WORK"
fi
hostname rdmaxx-vm

modprobe -a crc32_generic crc32_pclmul 2>/dev/null
modprobe -a ib_core ib_uverbs rdma_cm rdma_ucm rdma_rxe || fail "RDMA modules"
ip link set lo up
# rxe on a dummy netdev with a TEST-NET-1 address that exists only in this NIC-less
# guest: RDMA CM needs a non-loopback address
modprobe dummy numdummies=0
ip link add dummy0 type dummy || fail "dummy0"
[ -n "$VM_MTU" ] && ip link set dummy0 mtu "$VM_MTU"
ip addr add 192.0.2.1/24 dev dummy0 || fail "address on dummy0"
ip link set dummy0 up
chroot $R rdma link add rxe0 type rxe netdev dummy0 > /dev/console 2>&1 || fail "rdma link add rxe0"
# ready when the port is ACTIVE and the RoCE v2 IPv4-mapped GID is there
GID=
for _ in $(seq 250); do
    for n in 0 1 2 3 4 5 6 7; do
        case "$(cat /sys/class/infiniband/rxe0/ports/1/gids/$n 2>/dev/null)/$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n 2>/dev/null)" in
            0000:0000:0000:0000:0000:ffff:*"/RoCE v2") GID=$n; break ;;
        esac
    done
    grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && [ -n "$GID" ] && break
    usleep 20000
done
[ -n "$GID" ] || fail "rxe0 has no RoCE v2 IPv4 GID"
printf 'RDMAXX_VM_DEV=rxe0\nRDMAXX_VM_ADDR=192.0.2.1\nRDMAXX_VM_GID_INDEX=%s\n' "$GID" > $R/run/rdmaxx-vm.env

ulimit -l unlimited
chroot $R /bin/bash /run/rdmaxx-vm/job.sh < /dev/null > "$OUT" 2> "$ERR"
echo $? > $CTL/rc.tmp && mv $CTL/rc.tmp $CTL/rc
sync
[ -n "$VM_WORK" ] && umount "$R$VM_WORK"
umount $CTL
poweroff -f
