#!/bin/sh
# Regenerates the measurements behind docs/rdma-vs-tcp.md: RUNS runs each of
# `rxed kv bench` (twice: as a Go developer's servers run, and with
# --handler-cpu, whose locked handler threads measure the handlers' CPU
# but cost TCP's server a thread switch per request, so only that column
# is read from the second), `rxed allreduce` (ranks in one process), and of
# `rxed allreduce --rank R --peers ...` (one process per rank), over
# loopback, with /proc/loadavg before and after every run. Raw outputs go to
# OUT (default ./rdma-vs-tcp.out); scripts/rdma-vs-tcp-summary.sh OUT prints
# the medians and min-max ranges per cell that docs/rdma-vs-tcp.md quotes.
#
# Addresses: kv on 127.0.3.1-2 (its defaults' plan), in-process ranks on
# 127.0.7.1.., rank processes on 127.0.8.1.. (the test suites use 127.0.0.x
# and 127.0.2.x).
#
# usage: scripts/rdma-vs-tcp.sh [OUT]
#   env: RUNS=3 AR_MAX=64M AR_ITERS=3 PROC_MAX=16M KV_D=2s PROCS=1
set -eu
OUT=${1:-rdma-vs-tcp.out}
RUNS=${RUNS:-3}
AR_MAX=${AR_MAX:-64M}
AR_ITERS=${AR_ITERS:-3}
PROC_MAX=${PROC_MAX:-16M}
KV_D=${KV_D:-2s}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
go build -o "$OUT/rxed" ./cmd/rxed
RXED=$OUT/rxed
{ uname -a; nproc; grep -m1 'model name' /proc/cpuinfo || true; git rev-parse HEAD 2>/dev/null || true; } >"$OUT/machine.txt"

kvbench() { # kvbench FILE [FLAGS...]: one kv bench run into FILE, with the load before and after
	f=$1
	shift
	{ echo "# load before: $(cat /proc/loadavg)"
	  "$RXED" kv bench "$@" --addr 127.0.3.2 --server 127.0.3.1 -D "$KV_D" || echo "kv bench failed"
	  echo "# load after: $(cat /proc/loadavg)"; } >"$f" 2>&1
}

procs() { # procs N RUN: N rank processes on 127.0.8.1.., one ring sweep
	n=$1
	peers=""
	for i in $(seq 0 $((n - 1))); do peers="$peers${peers:+,}127.0.8.$((1 + i))"; done
	pids=""
	for r in $(seq 0 $((n - 1))); do
		"$RXED" allreduce --rank "$r" --peers "$peers" -b 4K -e "$PROC_MAX" -n "$AR_ITERS" \
			>"$OUT/allreduce-procs$n-run$2-rank$r.txt" 2>&1 &
		pids="$pids $!"
	done
	for p in $pids; do wait "$p" || echo "rank process $p failed (see $OUT/allreduce-procs$n-run$2-rank*.txt)"; done
}

for run in $(seq 1 "$RUNS"); do
	echo "run $run: load $(cat /proc/loadavg)"
	kvbench "$OUT/kv-run$run.txt"
	kvbench "$OUT/kv-cpu-run$run.txt" --handler-cpu
	"$RXED" allreduce --addr 127.0.7.1 --ranks 2,4,8 -b 4K -e "$AR_MAX" -n "$AR_ITERS" >"$OUT/allreduce-run$run.txt" 2>&1 ||
		echo "allreduce run $run failed (see $OUT/allreduce-run$run.txt)"
	if [ "${PROCS:-1}" = 1 ]; then
		for n in 2 4; do procs "$n" "$run"; done
	fi
done
echo "outputs in $OUT"
