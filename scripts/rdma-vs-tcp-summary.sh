#!/bin/sh
# Summarises the outputs of scripts/rdma-vs-tcp.sh: for every cell, the
# median over the runs and the (min-max) range, as docs/rdma-vs-tcp.md
# quotes them. Several OUT directories are summarised together.
# usage: scripts/rdma-vs-tcp-summary.sh OUT [OUT...]
set -eu
[ $# -gt 0 ] || set -- rdma-vs-tcp.out

# files PATTERN OUT...: the files matching PATTERN in every OUT
files() { p=$1; shift; for d in "$@"; do ls "$d"/$p 2>/dev/null || true; done; }

# med KEY VALUE lines on stdin -> "KEY median (min-max)"
med() {
	sort -k1,1 -k2,2g | awk '
	function f(x) { return (x >= 1000 || x <= -1000) ? sprintf("%.0f", x) : sprintf("%.3g", x) }
	function flush() { if (n) { m = (n % 2) ? v[(n+1)/2] : (v[n/2] + v[n/2+1]) / 2
		printf "%s %s (%s-%s) n=%d\n", k, f(m), f(v[1]), f(v[n]), n }; n = 0 }
	$1 != k { flush(); k = $1 } { v[++n] = $2 } END { flush() }'
}

echo "## load (/proc/loadavg, before and after each run)"
grep -h "load" $(files 'kv-run*.txt' "$@") $(files 'allreduce-run*.txt' "$@") | sed 's/^# *//' | cut -c1-100

echo "## kv bench: GET/s, p50 us, p99 us, server CPU/op us, copied B/GET per transport/clients/GET%"
for col in 4:GET/s 6:p50 7:p99 11:serverCPU/op 12:clientCPU/op 13:copiedB/GET 14:wireB/GET; do
	c=${col%%:*} name=${col#*:}
	awk -v c="$c" -v name="$name" '($1 == "rdma" || $1 == "tcp") && NF >= 15 { print $1 "/" $2 "c/" $3 "%/" name, $c }' $(files 'kv-run*.txt' "$@") | med
done
echo "## kv bench --handler-cpu: app CPU/GET ns (handlers locked to their threads to be timed)"
awk '($1 == "rdma" || $1 == "tcp") && NF >= 15 { print $1 "/" $2 "c/" $3 "%/appCPU/GET", $9 }' $(files 'kv-cpu-run*.txt' "$@") | med
echo "## kv bench: rdma/tcp ratios of the same run (GET/s, p50, p99, server CPU/op)"
awk '/^# load after/ { r = 0 } /rdma\/tcp/ { r = 1; next } r && NF == 6 { for (i = 3; i <= 6; i++) { sub("x", "", $i) }
	print $1 "c/" $2 "%/GET/s", $3; print $1 "c/" $2 "%/p50", $4; print $1 "c/" $2 "%/p99", $5; print $1 "c/" $2 "%/serverCPU", $6 }
	' $(files 'kv-run*.txt' "$@") | med

# allreduce: busbw (GB/s) of both transports and their ratio, per ranks/size
ar() { # ar LABEL FILES...
	label=$1; shift
	awk -v label="$label" '/^# ring allreduce/ { n = ($4 == "rank") ? $7 : $4 }
	# size count float sum -1 | rdma time algbw busbw #wrong | tcp time algbw busbw #wrong
	$3 == "float" && $6 != "failed" && $10 != "failed" {
		k = label n "r/" $1 "B/"
		print k "rdma-us", $6; print k "tcp-us", $10
		print k "rdma-busbw", $8; print k "tcp-busbw", $12
		if ($6 > 0) print k "busbw-ratio", $10 / $6 # = rdma busbw / tcp busbw, from the unrounded times
		if ($9 != "0" || $13 != "0") print k "WRONG", $9 + $13 }
	$3 == "float" && ($6 == "failed" || $10 == "failed") { print label n "r/" $1 "B/FAILED", 1 }' "$@" | med
}
echo "## allreduce, ranks in one process: bus bandwidth GB/s, rdma/tcp ratio"
ar inproc/ $(files 'allreduce-run*.txt' "$@")
echo "## allreduce, one process per rank (rank 0's view): bus bandwidth GB/s, rdma/tcp ratio"
ar procs/ $(files 'allreduce-procs*-rank0.txt' "$@")
echo "## allreduce, one process per rank: every rank's process CPU per allreduce (us) and rdma/tcp"
awk '/^# ring allreduce, rank/ { n = $7 } /CPU \(user\+system/ { c = 1; next } /^# load after/ { c = 0 }
	c && $2 ~ /^[0-9]+$/ { k = "procs/" n "r/" $2 "B/"; print k "rdma-cpu-us", $3; print k "tcp-cpu-us", $4; print k "cpu-ratio", $5 }' \
	$(files 'allreduce-procs*-rank*.txt' "$@") | med
