#!/usr/bin/env bash
# Rebuilds README.md from its parts: docs/readme-head.md (the two commands,
# overview, layout, library), docs/tools.md (every command), docs/decode.md
# (decoding captures) and docs/readme-tail.md (tests, interop, benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
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
} > README.md
