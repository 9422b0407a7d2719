#!/bin/sh
# slowrtt.sh TRACE: for every round trip the e2e latency benchmarks logged as
# slow (category "slowrtt", test/e2e/bench_tcp_test.go), the threads (Ms) of
# the process that emitted no trace event for 0.5 ms or more during it while
# a goroutine was running on them (their last event left one running or in
# a system call). A goroutine that spins on CQ.Poll makes a system call or
# yields every few microseconds, each an event, so such a silent thread is
# one the kernel (or the hypervisor) did not run.
#
#   cd test/e2e && go test -run '^$' -bench 'SendLatency8/poll' -benchtime 100000x -trace /tmp/t.out
#   scripts/slowrtt.sh /tmp/t.out
set -eu
go tool trace -d=parsed "$1" | awk '
# a duration as Go prints one above 1 ms: "1.5ms" or "1.2s"
function ns(s) { if (sub(/ms$/, "", s)) return s * 1e6; sub(/s$/, "", s); return s * 1e9 }
BEGIN { n = 0 } # the gaps are gs/ge/gm[0..n-1] (an unset n would index the first as "")
{
	if (!match($0, /Time=[0-9]+/)) next
	t = substr($0, RSTART + 5, RLENGTH - 5) + 0
	m = $1
	if ((m in last) && busy[m] && t - last[m] >= 500000) { gs[n] = last[m]; ge[n] = t; gm[n] = m; n++ }
	last[m] = t
	# busy: a goroutine runs on m after this event (the event names one, and
	# it did not just stop to wait)
	busy[m] = ($3 != "G=-1") && !($0 ~ /Running->Waiting/ && ("GoID=" substr($3, 3)) == $6)
	if ($0 ~ /Category="slowrtt"/) {
		match($0, /Message="[^"]+"/); split(substr($0, RSTART + 9, RLENGTH - 10), w, " ")
		what = w[1]; d = w[2]
		start = t - ns(d); silent = ""
		for (i = 0; i < n; i++) if (ge[i] > start && gs[i] < t)
			silent = silent sprintf(" %s %.2f ms", gm[i], (ge[i] - gs[i]) / 1e6)
		slow++; if (silent != "") explained++
		printf "slow %s round trip %s:%s\n", what, d, (silent == "" ? " no silent thread" : " silent" silent)
	}
}
END { printf "%d slow round trips, %d with a thread silent for >= 0.5 ms\n", slow, explained }'
