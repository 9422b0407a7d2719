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
# The log lines give aggregate bandwidth and CPU per host (process CPU time
# over the run divided by 8: all hosts share one process).
#
# Needs root (network namespaces); without it the tests skip with a message
# (and fail under CI=true). Extra arguments go to go test, e.g. -race.
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
	echo "fabric.sh: needs root for network namespaces (try: sudo $0)" >&2
	exit 1
fi
exec go test -run Fabric -count=1 -v "$@" ./test/fabric
