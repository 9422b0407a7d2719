//go:build linux

// Package interop is the harness that checks rxed against real Linux rdma_rxe peers: it boots
// Debian guests with rdma_rxe under qemu inside a private network namespace and runs the standard
// tools (ibv_*_pingpong, perftest) against rxed's equivalents, cell by cell, in both directions.
//
// This file is the matrix: which tools, with which command lines, at which sizes. The command
// lines are plain templates (see Render) so that adjusting rxed's flags is a one-line edit.
package interop

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Kind says how a tool's output is read.
type Kind int

const (
	// Pingpong tools (ibv_rc_pingpong & co.) print "N bytes in T seconds = R Mbit/sec".
	Pingpong Kind = iota
	// PerfBW tools (ib_*_bw) print a perftest bandwidth table.
	PerfBW
	// PerfLat tools (ib_*_lat) print a perftest latency table.
	PerfLat
)

// Tool is one standard tool and the rxed command that plays the same role.
//
// Templates are expanded by Render. Placeholders:
//
//	{rxed}     path of the rxed binary
//	{addr}     rxed's own RoCE address (10.78.0.1 or fd78::1: the cell's GID family)
//	{gid}      the rxe guest's GID index for the cell's family (IPv4 or IPv6)
//	{port}     TCP port of the out-of-band exchange (unique per run)
//	{size}     message size in bytes
//	{iters}    iterations
//	{mtu}      path MTU in bytes (1024 or 4096)
//	{counters} file rxed writes its counters to, as JSON, when it exits
//	{export}   the file rxed serve exports (Serve cells)
//	{args}     the cell's extra arguments (perftest flags shared by both implementations)
//	{rxeargs}  extra arguments for the rxe tool only
//
// The client form is the server form followed by a space and the server's IPv4 address (the
// tools' TCP exchange always runs over IPv4, also for IPv6 GIDs).
type Tool struct {
	Name string
	Kind Kind
	Rxe  string // the rdma_rxe guest's command
	Rxed string // rxed's command
}

// Tools is the command table. Edit the Rxed column to follow rxed's command-line interface.
var Tools = map[string]Tool{
	"rc_pingpong": {"ibv_rc_pingpong", Pingpong,
		"ibv_rc_pingpong -d rxe0 -g {gid} -p {port} -s {size} -n {iters} -m {mtu} -c",
		"{rxed} pingpong --addr {addr} -t rc -p {port} -s {size} -n {iters} -m {mtu} -c --counters-out {counters}"},
	"uc_pingpong": {"ibv_uc_pingpong", Pingpong,
		"ibv_uc_pingpong -d rxe0 -g {gid} -p {port} -s {size} -n {iters} -m {mtu} -c",
		"{rxed} pingpong --addr {addr} -t uc -p {port} -s {size} -n {iters} -m {mtu} -c --counters-out {counters}"},
	"ud_pingpong": {"ibv_ud_pingpong", Pingpong,
		"ibv_ud_pingpong -d rxe0 -g {gid} -p {port} -s {size} -n {iters} -c",
		"{rxed} pingpong --addr {addr} -t ud -p {port} -s {size} -n {iters} -m {mtu} -c --counters-out {counters}"},
	"send_bw": {"ib_send_bw", PerfBW,
		"ib_send_bw -d rxe0 -x {gid} -p {port} -s {size} -n {iters} -m {mtu} -F {args} {rxeargs}",
		"{rxed} perf send --addr {addr} -p {port} -s {size} -n {iters} -m {mtu} -F --validate --counters-out {counters} {args}"},
	"write_bw": {"ib_write_bw", PerfBW,
		"ib_write_bw -d rxe0 -x {gid} -p {port} -s {size} -n {iters} -m {mtu} -F {args} {rxeargs}",
		"{rxed} perf write --addr {addr} -p {port} -s {size} -n {iters} -m {mtu} -F --validate --counters-out {counters} {args}"},
	"read_bw": {"ib_read_bw", PerfBW,
		"ib_read_bw -d rxe0 -x {gid} -p {port} -s {size} -n {iters} -m {mtu} -F {args} {rxeargs}",
		"{rxed} perf read --addr {addr} -p {port} -s {size} -n {iters} -m {mtu} -F --validate --counters-out {counters} {args}"},
	"atomic_bw": {"ib_atomic_bw", PerfBW,
		"ib_atomic_bw -d rxe0 -x {gid} -p {port} -n {iters} -m {mtu} -F {args} {rxeargs}",
		"{rxed} perf atomic --addr {addr} -p {port} -n {iters} -m {mtu} -F --validate --counters-out {counters} {args}"},
	"write_lat": {"ib_write_lat", PerfLat,
		"ib_write_lat -d rxe0 -x {gid} -p {port} -s {size} -n {iters} -m {mtu} -F {args} {rxeargs}",
		"{rxed} perf write --lat --addr {addr} -p {port} -s {size} -n {iters} -m {mtu} -F --validate --counters-out {counters} {args}"},
	"send_lat": {"ib_send_lat", PerfLat,
		"ib_send_lat -d rxe0 -x {gid} -p {port} -s {size} -n {iters} -m {mtu} -F {args} {rxeargs}",
		"{rxed} perf send --lat --addr {addr} -p {port} -s {size} -n {iters} -m {mtu} -F --validate --counters-out {counters} {args}"},
	"read_lat": {"ib_read_lat", PerfLat,
		"ib_read_lat -d rxe0 -x {gid} -p {port} -s {size} -n {iters} -m {mtu} -F {args} {rxeargs}",
		"{rxed} perf read --lat --addr {addr} -p {port} -s {size} -n {iters} -m {mtu} -F --validate --counters-out {counters} {args}"},
}

// Cell is one test of the matrix; it runs once per direction.
type Cell struct {
	Name    string
	Tool    string // key of Tools
	Size    int
	Iters   int
	MTU     int     // 1024 or 4096; 4096 raises the link MTU to 9000
	IPv6    bool    // RoCEv2 over IPv6 GIDs instead of IPv4
	LossPct float64 // tc netem loss on every bridge port, in percent
	// Baseline names a loss cell's clean twin: the same tool and parameters without loss, run
	// just before it and its sibling loss cells, whose bandwidth in the same direction and run
	// the report divides the lossy one by (LossRatios). Selecting a loss cell selects its twin
	// too.
	Baseline string
	Args     string // extra flags given to both sides
	RxeArgs  string // extra flags given to the rxe tool only ({rxeargs})
	// ClientArgs are extra flags given to the client only, either implementation, before the
	// server's address (a TOS cell's -T: the server must take the client's TOS).
	ClientArgs string
	// TOS makes a TOS cell (matrix_tos.go): the client sets this IP TOS, and the run's
	// captures (rxed's and the wire's, runner_tos.go) must show it on every packet of the test
	// connections both ways, TTL 64.
	TOS int
	// Serve runs rxed as the daemon (ServeRxed, exporting a pre-filled file) instead of the
	// tool's Rxed column; the rxe tool is its client ServeClients times in a row. rxed is
	// the server only, so the cell has no rxed-client direction and no rxe-mode run.
	Serve   bool
	CM      *CMSpec    // an rdma_cm cell (matrix_rdmacm.go): its own command lines, run by runCM
	Mcast   *McastSpec // a multicast cell (matrix_mcast.go): its members, run by runMcast
	Timeout time.Duration
}

// ServeClients is how many clients a Serve cell runs one after the other against one daemon:
// the daemon must survive a client's disconnect and serve the next.
const ServeClients = 2

// ServeRxed is rxed's command in Serve cells: the daemon exporting the file {export} to
// perftest clients on TCP {port}; --grace bounds the SIGTERM shutdown the harness asks for.
const ServeRxed = "{rxed} serve --addr {addr} -p {port} -m {mtu} --export data=file:{export} --grace 5s --counters-out {counters}"

// Runs reports whether cell c runs in direction d for subject s.
func (c Cell) Runs(s Subject, d Direction) bool {
	if c.Mcast != nil { // the members name their roles: one run, rxed only
		return s == SubjectRxed && d == SubjectServer
	}
	return !c.Serve || (s == SubjectRxed && d == SubjectServer)
}

// Direction says which role the implementation under test (rxed, or the second guest in rxe
// mode) plays in a run.
type Direction int

const (
	// SubjectServer: rxed is the server, the rxe guest the client.
	SubjectServer Direction = iota
	// SubjectClient: the rxe guest is the server, rxed the client.
	SubjectClient
)

func (d Direction) String() string {
	if d == SubjectServer {
		return "rxe→rxed (rxed server)"
	}
	return "rxed→rxe (rxed client)"
}

// Short is the direction's name in file names.
func (d Direction) Short() string {
	if d == SubjectServer {
		return "srv"
	}
	return "cli"
}

// bwIters keeps every bandwidth run at a few MiB: under TCG rxe moves about 20 MiB/s.
func bwIters(size int) int {
	n := (4 << 20) / size
	return min(max(n, 5), 200)
}

// lossRun is one lossy twin of a clean cell: netem loss in percent and its message count.
type lossRun struct {
	pct   float64
	iters int
}

// Matrix returns every cell, grouped so that all MTU 1024 cells come before the MTU 4096 ones
// (the link MTU is switched once).
func Matrix() []Cell {
	var cells []Cell
	add := func(c Cell) {
		if c.Timeout == 0 {
			c.Timeout = 90 * time.Second
		}
		cells = append(cells, c)
	}
	// lossy adds c's clean twin (Baseline; "{loss}" in c.Name reads "clean") and after it c at
	// each loss ("loss1%", ...) with that run's message count
	lossy := func(c Cell, runs ...lossRun) {
		clean := c
		clean.Name = strings.Replace(c.Name, "{loss}", "clean", 1)
		add(clean)
		for _, r := range runs {
			l := c
			l.Name = strings.Replace(c.Name, "{loss}", fmt.Sprintf("loss%g%%", r.pct), 1)
			l.LossPct, l.Iters, l.Baseline, l.Timeout = r.pct, r.iters, clean.Name, 180*time.Second
			add(l)
		}
	}
	// Issue 14's loss goal is stated at 1% and 5% on both ends. At 1% a run of 100 messages
	// had some 60 losses to recover from, and against rxe under TCG its ratio to the clean
	// twin spread over 0.39-0.66x from one CI run to the next (WRITE, 10 runs), the twin's
	// own bandwidth moving by a third; 400 messages (and a twin of 400) keep it within
	// 0.44-0.55x (8 runs, docs/performance.md session AA). 5% keeps 100: some 300 losses,
	// and rxe's own requester needs 19 s for them.
	lossRuns := []lossRun{{1, 400}, {5, 100}}
	for _, mtu := range []int{1024, 4096} {
		for _, t := range []string{"rc", "uc"} {
			for _, size := range []int{1, 1500, 8192} {
				add(Cell{Name: fmt.Sprintf("%s_pingpong/mtu%d/%dB", t, mtu, size), Tool: t + "_pingpong",
					Size: size, Iters: 20, MTU: mtu})
			}
		}
		// UD messages cannot exceed the path MTU
		for _, size := range []int{1, mtu} {
			add(Cell{Name: fmt.Sprintf("ud_pingpong/mtu%d/%dB", mtu, size), Tool: "ud_pingpong",
				Size: size, Iters: 20, MTU: mtu})
		}
	}
	// perftest cells run at MTU 1024 (the default link)
	for _, size := range []int{2, 4096, 1 << 20} {
		add(Cell{Name: fmt.Sprintf("send_bw/RC/%dB", size), Tool: "send_bw", Size: size, Iters: bwIters(size), MTU: 1024, Args: "-c RC"})
	}
	for _, size := range []int{2, 1024} {
		add(Cell{Name: fmt.Sprintf("send_bw/UD/%dB", size), Tool: "send_bw", Size: size, Iters: bwIters(size), MTU: 1024, Args: "-c UD"})
	}
	for _, conn := range []string{"RC", "UC"} {
		for _, size := range []int{2, 4096, 1 << 20} {
			add(Cell{Name: fmt.Sprintf("write_bw/%s/%dB", conn, size), Tool: "write_bw", Size: size, Iters: bwIters(size), MTU: 1024, Args: "-c " + conn})
		}
	}
	// Outstanding reads/atomics (perftest's -o): both sides announce the depth in their keys and
	// use it as max_dest_rd_atomic, the peer's as max_rd_atomic.
	for _, size := range []int{4096, 65536} {
		add(Cell{Name: fmt.Sprintf("read_bw/o8/%dB", size), Tool: "read_bw", Size: size, Iters: bwIters(size), MTU: 1024, Args: "-o 8"})
	}
	for _, op := range []string{"CMP_AND_SWAP", "FETCH_AND_ADD"} {
		add(Cell{Name: "atomic_bw/" + op, Tool: "atomic_bw", Size: 8, Iters: 200, MTU: 1024, Args: "-A " + op + " -o 4"})
	}
	for _, t := range []string{"write_lat", "send_lat", "read_lat"} {
		add(Cell{Name: t + "/2B", Tool: t, Size: 2, Iters: 100, MTU: 1024})
	}
	add(Cell{Name: "rc_pingpong/ipv6/4096B", Tool: "rc_pingpong", Size: 4096, Iters: 20, MTU: 1024, IPv6: true})
	add(Cell{Name: "write_bw/ipv6/65536B", Tool: "write_bw", Size: 65536, Iters: 50, MTU: 1024, IPv6: true, Args: "-c RC"})
	lossy(Cell{Name: "write_bw/{loss}/65536B", Tool: "write_bw", Size: 65536, Iters: 400, MTU: 1024, Args: "-c RC"}, lossRuns...)
	// rxed serve against unmodified perftest clients (rxed server only): two clients in a row
	// per cell, then SIGTERM; the harness checks the exported file afterwards.
	add(Cell{Name: "serve/write_bw/65536B", Tool: "write_bw", Size: 65536, Iters: 30, MTU: 1024, Args: "-c RC", Serve: true})
	add(Cell{Name: "serve/read_bw/65536B", Tool: "read_bw", Size: 65536, Iters: 30, MTU: 1024, Args: "-o 8", Serve: true})
	for _, op := range []string{"CMP_AND_SWAP", "FETCH_AND_ADD"} {
		add(Cell{Name: "serve/atomic_bw/" + op, Tool: "atomic_bw", Size: 8, Iters: 200, MTU: 1024, Args: "-A " + op + " -o 4", Serve: true})
	}
	lossy(Cell{Name: "read_bw/{loss}/65536B", Tool: "read_bw", Size: 65536, Iters: 400, MTU: 1024, Args: "-o 8"}, lossRuns...)
	for _, c := range rdmacmCells() {
		add(c)
	}
	for _, c := range rdmacmPerfCells() { // perftest -R (matrix_rdmacm_perf.go)
		add(c)
	}
	for _, c := range tosCells() { // IP TOS of rdma_cm connections (matrix_tos.go)
		add(c)
	}
	for _, c := range McastCells() { // mckey (matrix_mcast.go)
		c.Cell.Mcast = c.Mcast
		add(c.Cell)
	}
	// MTU 1024 first, then 4096; stable otherwise
	sort.SliceStable(cells, func(i, j int) bool { return cells[i].MTU < cells[j].MTU })
	return cells
}

// Vars are the values substituted into a Tool template.
type Vars struct {
	Rxed     string
	Addr     string
	GID      int
	Port     int
	Counters string
	Export   string // the file a Serve cell exports
}

// Render expands a template for cell c. Unknown placeholders are left in place so that a
// mistake in the table shows up in the command line (and Matrix tests catch it).
func Render(tmpl string, c Cell, v Vars) string {
	r := strings.NewReplacer(
		"{rxed}", v.Rxed,
		"{addr}", v.Addr,
		"{gid}", fmt.Sprint(v.GID),
		"{port}", fmt.Sprint(v.Port),
		"{size}", fmt.Sprint(c.Size),
		"{iters}", fmt.Sprint(c.Iters),
		"{mtu}", fmt.Sprint(c.MTU),
		"{counters}", v.Counters,
		"{export}", v.Export,
		"{args}", c.Args,
		"{rxeargs}", c.RxeArgs,
	)
	return strings.Join(strings.Fields(r.Replace(tmpl)), " ")
}

// Select returns the cells whose name matches any of the comma-separated substrings in filter,
// and the clean twins of the loss cells among them, in matrix order (all cells when filter is
// empty).
func Select(cells []Cell, filter string) []Cell {
	if filter == "" {
		return cells
	}
	picked := map[string]bool{}
	for _, c := range cells {
		for _, f := range strings.Split(filter, ",") {
			if f != "" && strings.Contains(c.Name, f) {
				picked[c.Name] = true
				if c.Baseline != "" {
					picked[c.Baseline] = true
				}
				break
			}
		}
	}
	var out []Cell
	for _, c := range cells {
		if picked[c.Name] {
			out = append(out, c)
		}
	}
	return out
}
