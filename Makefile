# The README's test command is `make test`; .ci/run runs exactly that.
GO ?= go
# 100000 executions per Fuzz target (FuzzRTSQP, FuzzDecode and FuzzReader a tenth: see
# scripts/fuzz.sh): 30 targets took 7 of the 25 minutes of CI at 200000 (about 19,000
# executions a second each on 2 cores), and the default run is to stay well under 30
# minutes; the 33 targets now take about what the 30 did. Longer: make fuzz FUZZTIME=2000000x.
FUZZTIME ?= 100000x

.PHONY: test unit fuzz vet demo

test: vet unit fuzz interop

# staticcheck is a tool of go.mod (go tool builds it from the module
# cache, downloading it like any module): U1000 reports unused code.
# The cross vets type-check the portable paths (pkg/roce/transport's
# udp_other.go, mcast_other.go and the like) that a Linux build never
# compiles; internal/netns, test/interop and test/fabric are Linux-only
# (build-tagged) and drop out of them. U1000 runs for each of them too, as
# code only one platform's files use is unused on the others: the tool is
# built for this machine (go tool -n builds it and prints its path; GOOS
# on go tool itself would build it for the target) and analyses the
# target's files (about 40 s each with a cold cache on 2 cores, 15 s warm).
CROSS_GOOS ?= darwin freebsd windows
vet:
	$(GO) vet ./...
	@for os in $(CROSS_GOOS); do echo "GOOS=$$os $(GO) vet ./..."; GOOS=$$os $(GO) vet ./... || exit 1; done
	$(GO) tool staticcheck -checks U1000 ./...
	@sc=$$($(GO) tool -n staticcheck) || exit 1; for os in $(CROSS_GOOS); do echo "GOOS=$$os staticcheck -checks U1000 ./..."; GOOS=$$os $$sc -checks U1000 ./... || exit 1; done
	@bash scripts/readme.sh --check
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

# -race needs cgo (a C compiler); without one the tests still run, without
# the race detector, and say so.
RACE ?= $(shell [ "$$($(GO) env CGO_ENABLED)" = 1 ] && echo -race)

unit:
	@[ -n "$(RACE)" ] || echo "note: no C compiler (CGO_ENABLED=0): running the tests without -race; apt-get install gcc to enable it"
	$(GO) test $(RACE) -count=1 -timeout 20m ./...

# Each Fuzz target runs for a bounded budget (FUZZTIME executions) on top of its seed corpus.
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) bash scripts/fuzz.sh

demo:
	$(GO) run ./cmd/rxed demo

# Interop suite: rxed against real Linux rdma_rxe guests under qemu (test/interop/README.md).
# Needs root (installs qemu/debootstrap when missing); skips without it, fails if CI=true.
# Part of `make test` (so of CI). Examples: make interop INTEROP_FLAGS='-subject rxe -cells loss'
INTEROP_FLAGS ?=
.PHONY: interop
interop:
	$(GO) run ./test/interop/cmd/interop $(INTEROP_FLAGS)
