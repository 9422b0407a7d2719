#!/usr/bin/env bash
# Runs every Fuzz target of the module for a bounded budget (FUZZTIME, default
# 200000x: an execution count) on top of its seed corpus. A count, not a
# duration, because Go 1.26's coordinator can report a spurious "context
# deadline exceeded" when a duration-based -fuzztime expires on a loaded
# machine (golang/go#75804, fixed in Go 1.27). If a duration is given and that
# happens without a finding ("Failing input written"), the run is retried once.
set -uo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-200000x}
go=${GO:-go}
status=0
for pkg in $($go list ./...); do
	for f in $($go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz'); do
		for attempt in 1 2; do
			echo "fuzz $pkg $f (attempt $attempt, $fuzztime)"
			out=$($go test -run '^$' -fuzz "^$f\$" -fuzztime "$fuzztime" -timeout 5m "$pkg" 2>&1)
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
