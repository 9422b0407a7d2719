#!/usr/bin/env bash
# Runs every Fuzz target of the module for a bounded budget (FUZZTIME, default
# 100000x: an execution count; the Makefile says why) on top of its seed corpus. A count, not a
# duration, because Go 1.26's coordinator can report a spurious "context
# deadline exceeded" when a duration-based -fuzztime expires on a loaded
# machine (golang/go#75804, fixed in Go 1.27). If a duration is given and that
# happens without a finding ("Failing input written"), the run is retried once.
set -uo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-100000x}
go=${GO:-go}
# Targets whose executions are long programs (FuzzRTSQP runs a whole
# two-QP exchange per input: about 450 per second on a 2-core machine;
# FuzzDecode decodes every input as three captures, about 270 per second;
# FuzzReader writes and reads a capture and a cut copy, about 2,200;
# FuzzEngineReceive builds two devices, a connection and an rdma_cm
# listener per input, about 450) get a
# tenth of the count, so each stays within the per-target timeout and the
# run's total stays what it was before FuzzDecode checked its output and
# FuzzReader, FuzzServerSession and kv's FuzzParseHello were added.
slow="FuzzRTSQP FuzzDecode FuzzReader FuzzEngineReceive"
# Go minimizes every input that adds coverage, for up to 60 s each by
# default, on top of the execution count: a slow target that finds a few
# sat minimizing for most of its run (FuzzRTSQP: 10000x took 30 s, 16 s
# with 5 s). A failing input is still written when its minimization is cut
# short.
minimize=${FUZZMINIMIZETIME:-5s}
budget() {
	case " $slow " in
	*" $1 "*)
		case $fuzztime in
		*x) echo "$((${fuzztime%x} / 10))x" ;;
		*) echo "$fuzztime" ;;
		esac
		;;
	*) echo "$fuzztime" ;;
	esac
}
status=0
for pkg in $($go list ./...); do
	for f in $($go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz'); do
		ft=$(budget "$f")
		for attempt in 1 2; do
			echo "fuzz $pkg $f (attempt $attempt, $ft)"
			out=$($go test -run '^$' -fuzz "^$f\$" -fuzztime "$ft" -fuzzminimizetime "$minimize" -timeout 5m "$pkg" 2>&1)
			rc=$?
			if [ $rc -eq 0 ]; then
				echo "$out" | tail -n 1
				break
			fi
			echo "$out" | tail -n 20
			if [ $attempt -eq 1 ] && echo "$out" | grep -q 'context deadline exceeded' && ! echo "$out" | grep -q 'Failing input written'; then
				echo "fuzz $f: coordinator deadline without a finding; retrying once"
				continue
			fi
			status=1
			break
		done
	done
done
exit $status
