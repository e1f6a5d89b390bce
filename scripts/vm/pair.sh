#!/bin/bash
# pair.sh CMD [ARGS...] - inside the VM (scripts/vm/run.sh scripts/vm/pair.sh CMD):
# two more RDMA devices, rxeA on vA (198.51.100.1) and rxeB on vB (198.51.100.2), the
# two ends of a veth pair. Policy routing sends traffic between the two addresses
# over the wire instead of loopback, so `tc qdisc add dev vA root netem loss 5%`
# really drops packets. vB has a second address, 198.51.100.3, added once the devices
# are ready (their GID index 1 stays vB's first): clients bound to it come from another
# host as a listener on A sees them. CMD gets RDMAXX_PAIR_{A,B}_{DEV,ADDR,IF},
# RDMAXX_PAIR_B_ADDR2 and RDMAXX_PAIR_GID_INDEX. The devices are removed when CMD ends.
set -euo pipefail
A=198.51.100.1 B=198.51.100.2 B2=198.51.100.3
ip link add vA type veth peer name vB
ip addr add $A/24 dev vA
ip addr add $B/24 dev vB
ip link set vA up
ip link set vB up
for i in all vA vB; do
    sysctl -qw net.ipv4.conf.$i.rp_filter=0 net.ipv4.conf.$i.accept_local=1
done
# local traffic to the other end leaves through the wire, not lo
ip route add $B/32 dev vA src $A table 100
ip route add $B2/32 dev vA src $A table 100
ip route add $A/32 dev vB src $B table 101
ip rule add pref 10 iif lo to $B lookup 100
ip rule add pref 11 iif lo to $A lookup 101
ip rule add pref 12 iif lo to $B2 lookup 100
ip rule add pref 100 lookup local
ip rule del pref 0
rdma link add rxeA type rxe netdev vA
rdma link add rxeB type rxe netdev vB
cleanup() {
    rdma link delete rxeA 2>/dev/null
    rdma link delete rxeB 2>/dev/null
    ip link delete vA 2>/dev/null
    ip rule add pref 0 lookup local 2>/dev/null
    ip rule del pref 10 2>/dev/null
    ip rule del pref 11 2>/dev/null
    ip rule del pref 12 2>/dev/null
    ip rule del pref 100 2>/dev/null
    true
}
trap cleanup EXIT
for dev in rxeA rxeB; do   # ready: ACTIVE with the IPv4 RoCE v2 GID at index 1
    for _ in $(seq 250); do
        grep -q ACTIVE /sys/class/infiniband/$dev/ports/1/state 2>/dev/null &&
            grep -q '0000:0000:0000:0000:0000:ffff:' /sys/class/infiniband/$dev/ports/1/gids/1 2>/dev/null && break
        sleep 0.02
    done
done
ip addr add $B2/32 dev vB
for _ in $(seq 250); do # its RoCE v2 GID on rxeB: CM clients bound to it
    grep -q '0000:0000:0000:0000:0000:ffff:c633:6403' /sys/class/infiniband/rxeB/ports/1/gids/* 2>/dev/null && break
    sleep 0.02
done
export RDMAXX_PAIR_B_ADDR2=$B2
export RDMAXX_PAIR_A_DEV=rxeA RDMAXX_PAIR_A_ADDR=$A RDMAXX_PAIR_A_IF=vA
export RDMAXX_PAIR_B_DEV=rxeB RDMAXX_PAIR_B_ADDR=$B RDMAXX_PAIR_B_IF=vB
export RDMAXX_PAIR_GID_INDEX=1
"$@"
