#!/usr/bin/env bash
# Rebuilds README.md from its parts: docs/readme-head.md (the two commands,
# overview, layout, library), docs/tools.md (every command), docs/decode.md
# (decoding captures), docs/readme-tail.md (tests, interop, benchmarks) and
# docs/workloads.md, docs/performance.md, docs/fabric.md, docs/conform.md and
# docs/security.md (the threat model), each when present.
# With --check it only reports whether README.md is up to date (make vet).
set -euo pipefail
cd "$(dirname "$0")/.."
out=README.md
if [ "${1:-}" = --check ]; then
	out=$(mktemp)
	trap 'rm -f "$out"' EXIT
fi
{
	cat docs/readme-head.md
	echo
	# docs/tools.md without its title and without the decode pointer (the full
	# decode section follows).
	sed -e '1{/^# /d}' -e '/^## rxed decode$/,$d' docs/tools.md | sed -e 's/^## /### /' -e '1s/^/## Commands\n/'
	echo
	sed -e 's/^## Decoding captures/### Decoding captures/' docs/decode.md
	echo
	cat docs/readme-tail.md
	echo
	# Sections of their own, each one level down, when present.
	for part in docs/workloads.md docs/performance.md docs/fabric.md docs/conform.md; do
		[ -f "$part" ] || continue
		# Headings outside code blocks move so the file's top one is "##".
		awk '
			FNR == NR { if (/^```/) f = !f; else if (!f && match($0, /^#+ /)) { l = RLENGTH - 1; if (!m || l < m) m = l }; next }
			/^```/ { f = !f; print; next }
			!f && /^#+ / { n = index($0, " ") - 1; $0 = substr("######", 1, n + 2 - m) substr($0, n + 1) }
			{ print }
		' "$part" "$part"
		echo
	done
	# The threat model, one level down.
	sed -e 's/^## /### /' -e 's/^# Security and threat model/## Security and threat model/' docs/security.md
} > "$out"
if [ "${1:-}" = --check ] && ! cmp -s "$out" README.md; then
	echo "README.md is out of date with docs/: run scripts/readme.sh" >&2
	exit 1
fi
