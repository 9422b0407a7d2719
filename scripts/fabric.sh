#!/bin/sh
# fabric.sh: the eight-host RoCE fabric test (test/fabric).
#
# Creates 9 network namespaces (rxfab-br with bridge br0, rxfab-h1..h8 with
# veth eth0 at 10.199.0.1-8/24; nothing routes outside them), opens one rxed
# device per host in this one test process, and runs:
#   TestEightHostFabric         full mesh of 28 RC QP pairs, 10 rounds of
#                               all-to-all 64 KiB WRITE_WITH_IMM, every byte
#                               checked; a UD multicast group across all 8
#   TestEightHostFabricLossyLink the same mesh with 2% loss both ways on
#                               host 2's link (rxed fault injection)
#   TestEightHostAllreduce      the ring allreduce (examples/allreduce), one
#                               rank process per host (ip netns exec), ranks
#                               joined by rdma_cm; 64 KiB, 1 MiB, 4 MiB, every
#                               rank's result bit-exact
#   TestEightHostAllreduceLossyLink the ring at 1 MiB with 2% loss on host 2
# The log lines give bandwidth and CPU per host: the mesh's is the process
# CPU time over the run divided by 8 (its hosts share one process), the
# allreduce's each rank process's own.
#
# Needs root (network namespaces); without it the tests skip with a message
# (and fail under CI=true). Extra arguments go to go test, e.g. -race.
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
	echo "fabric.sh: needs root for network namespaces (try: sudo $0)" >&2
	exit 1
fi
exec go test -run EightHost -count=1 -v "$@" ./test/fabric
