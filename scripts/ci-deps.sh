#!/usr/bin/env bash
# Installs the tools CI needs beyond Go: tshark, the independent oracle of
# internal/decode's Wireshark cross-check (TestTsharkAgreesOn*), which fails
# under CI=true without it.
#
# Idempotent and quiet: does nothing when tshark is already installed, runs
# `apt-get update` only when the package index cannot supply tshark, and
# prints apt's output only on failure. It installs only as root on a
# Debian-like system; otherwise it says why and leaves the decision to the
# tests (exit status 0).
set -euo pipefail

if command -v tshark >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "ci-deps: tshark missing and not running as root: install it with 'apt-get install tshark'" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "ci-deps: tshark missing and apt-get not available: install tshark (Wireshark's CLI) by hand" >&2
	exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# wireshark-common asks whether non-root users may capture; CI only reads
# files, so answer no without a prompt.
if command -v debconf-set-selections >/dev/null 2>&1; then
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
fi

install() {
	apt-get install -y -qq --no-install-recommends tshark >>"$log" 2>&1
}

# An index that already knows tshark needs no update.
if ! apt-cache show tshark >/dev/null 2>&1 || ! install; then
	if ! apt-get update -qq >>"$log" 2>&1 || ! install; then
		cat "$log" >&2
		echo "ci-deps: installing tshark failed" >&2
		exit 1
	fi
fi
command -v tshark >/dev/null 2>&1 || { cat "$log" >&2; echo "ci-deps: tshark still missing after install" >&2; exit 1; }
