//go:build linux

package interop

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/rxed/rxed/pkg/conform"
)

// The conformance part: `rxed conform` (pkg/conform) against the guest's unmodified tools.
// Each ConformRun is one `rxed conform` invocation with one tool: as responder, the guest runs
// the tool's server in a loop (every scenario is a fresh connection); as requester (--serve),
// the guest runs the tool's client against rxed in a loop. Between them the runs reach every
// scenario at least once; scenarios a tool reaches that another run already covers are left
// out to keep the TCG guest's time down (conformRuns says which).
//
// Verdicts are rxe's behaviour and go to CONFORMANCE.md: a FAIL is a finding, never a failed
// CI step. What fails the step is the run itself breaking: a hang (the conform process
// outliving its bound), a panic, a bad exit status, a missing record, or an ERROR verdict
// (the scenario could not run: no server, exchange failed, peer vanished).

// ConformRun is one `rxed conform` run against one guest tool.
type ConformRun struct {
	Name  string // "conform/ib_write_bw", "conform/serve/ib_read_bw"
	Tool  conform.Tool
	Serve bool // the guest's tool is the client (peer-as-requester scenarios)
	// Guest is the tool's command line in the guest; Render-like placeholders {gid}, {port},
	// and {host} (rxed's address, for clients).
	Guest string
	// Only selects scenarios (a regexp on IDs, as -run); "" runs every one the tool reaches.
	Only string
	// Args are further rxed conform flags (--peer-iters, --peer-size).
	Args []string
	// Timeout is rxed conform's --timeout: the bound of one scenario.
	Timeout time.Duration
	// Bound is the guest's `timeout` for one tool instance: one that a scenario left waiting
	// is killed, and the loop starts the next.
	Bound time.Duration
}

// conformTimeout is the per-scenario bound under TCG: connection setup (the guest tool starts,
// the exchange), the packets and the longest timing cases (Q-TIMEOUT-EXCEEDED: retry_cnt 7 at
// 67 ms; Q-RNR-*: a few RNR timers) fit in well under a second of rxe time; the rest is the
// emulated guest's start-up of the tool (0.3-1 s) and scheduling slack.
const conformTimeout = 12 * time.Second

// ConformRuns is the conformance part of the interop suite.
//
// Responder scenarios: ib_write_bw runs all it reaches (most of the generic ones), ib_read_bw
// and ib_atomic_bw only READ / atomic cases, ib_send_bw the SEND cases, ibv_rc_pingpong a
// sample of SEND and drop cases (its exchange differs from perftest's), ibv_ud_pingpong every
// UD case. Requester scenarios: ib_write_bw all it reaches, ib_read_bw the READ cases, ib_send_bw
// the RNR cases and the retry report, ibv_rc_pingpong a sample.
func ConformRuns() []ConformRun {
	const (
		perfSrv = " -d rxe0 -x {gid} -p {port} -m 1024 -F"
		perfCli = " -d rxe0 -x {gid} -p {port} -n 20 -s 4096 -m 1024 -F {host}"
	)
	rsp := func(tool conform.Tool, guest, only string, args ...string) ConformRun {
		return ConformRun{Name: "conform/" + string(tool), Tool: tool, Guest: guest, Only: only, Args: args,
			Timeout: conformTimeout, Bound: conformTimeout + 10*time.Second}
	}
	req := func(tool conform.Tool, guest, only string, args ...string) ConformRun {
		// a client that a scenario left running (rxe retries without end with retry_cnt 7,
		// see ConformFindings) is killed well before the next scenario stops waiting for
		// a connection: Bound + restart + the tool's start-up < Timeout
		return ConformRun{Name: "conform/serve/" + string(tool), Tool: tool, Serve: true, Guest: guest, Only: only,
			Args: append([]string{"--peer-iters", "20"}, args...), Timeout: conformTimeout + 3*time.Second, Bound: 10 * time.Second}
	}
	return []ConformRun{
		rsp(conform.IBWriteBW, "ib_write_bw"+perfSrv, ""),
		rsp(conform.IBReadBW, "ib_read_bw"+perfSrv, `^(R-(READ|DUP-READ|BOUNDS-READ|RKEY-READ|WRITE-READBACK)|D-READ-)`),
		rsp(conform.IBAtomicBW, "ib_atomic_bw"+perfSrv, `^R-(ATOMIC|BOUNDS-ATOMIC|RKEY-ATOMIC|DUP-ATOMIC)`),
		rsp(conform.IBSendBW, "ib_send_bw"+perfSrv+" -n 40 -s 3000", `^R-(ACK-SEND|DUP-SEND|OPSEQ-S|OPSEQ-WRITE-IN-SEND|SEND-OVER-PMTU)`,
			"--peer-iters", "40", "--peer-size", "3000"),
		rsp(conform.IBVRCPingpong, "ibv_rc_pingpong -d rxe0 -g {gid} -p {port} -n 12 -m 1024", `^(R-ACK-SEND|R-DUP-SEND|R-SEQ-NAK|R-ACK-COALESCE|D-ICRC|D-PAD)$`,
			"--peer-iters", "12"),
		rsp(conform.IBVUDPingpong, "ibv_ud_pingpong -d rxe0 -g {gid} -p {port} -n 6 -s 512", "", "--peer-iters", "6"),
		req(conform.IBWriteBW, "ib_write_bw"+perfCli, ""),
		req(conform.IBReadBW, "ib_read_bw"+perfCli, `^Q-(IMPLIED|READ-PARTIAL|DUP-READ|RUN$)`),
		req(conform.IBSendBW, "ib_send_bw"+perfCli, `^Q-(RNR|RUN$)`),
		req(conform.IBVRCPingpong, "ibv_rc_pingpong -d rxe0 -g {gid} -p {port} -n 20 -s 4096 -m 1024 {host}", `^Q-(RUN|SEQ-GOBACK|RNR-TIMER|WRITE-PARTIAL)$`),
	}
}

// SelectConform filters runs like Select filters cells: comma-separated substrings of names.
func SelectConform(runs []ConformRun, filter string) []ConformRun {
	if filter == "" {
		return runs
	}
	var out []ConformRun
	for _, r := range runs {
		for _, f := range strings.Split(filter, ",") {
			if f = strings.TrimSpace(f); f != "" && strings.Contains(r.Name, f) {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// Scenarios returns the scenarios the run executes (those its tool reaches in its role, of
// its selection), in the order rxed conform runs them.
func (c ConformRun) Scenarios() []*conform.Scenario {
	var re *regexp.Regexp
	if c.Only != "" {
		re = regexp.MustCompile(c.Only)
	}
	var out []*conform.Scenario
	for _, s := range conform.Select(re) {
		if s.Reaches(c.Tool) && (s.Role == conform.PeerRequester) == c.Serve {
			out = append(out, s)
		}
	}
	return out
}

// RunArgs is the rxed conform command line (after the binary): the run's scenarios by ID, one
// JSON record per scenario, one capture per scenario in pcapDir, the HTML report beside them.
func (c ConformRun) RunArgs(port int, pcapDir, report string, peer string) []string {
	a := []string{"conform", "--addr", HostIP, "--tool", string(c.Tool), "-p", fmt.Sprint(port),
		"--timeout", c.Timeout.String(), "-json", "--pcap-dir", pcapDir, "--report", report}
	// the exact IDs: rxed conform would print a SKIP record for every scenario the tool
	// cannot reach, or that needs the other role
	var ids []string
	for _, s := range c.Scenarios() {
		ids = append(ids, regexp.QuoteMeta(s.ID))
	}
	a = append(a, "-run", "^("+strings.Join(ids, "|")+")$")
	a = append(a, c.Args...)
	if c.Serve {
		return append(a, "--serve")
	}
	return append(a, peer)
}

// GuestCmd is the guest tool's command line.
func (c ConformRun) GuestCmd(gid, port int) string {
	return strings.NewReplacer("{gid}", fmt.Sprint(gid), "{port}", fmt.Sprint(port), "{host}", HostIP).Replace(c.Guest)
}

// GuestLoop is the guest's shell script: the tool again and again, each instance bounded,
// writing the loop shell's pid (its process group: sshd makes every session's shell a group
// leader) to pidfile so the harness can stop the loop and the instance running.
func (c ConformRun) GuestLoop(gid, port int, pidfile string) string {
	pause := "0.1"
	if c.Serve {
		pause = "0.3" // a client before rxed listens fails at once: do not spin
	}
	return fmt.Sprintf("echo $$ > %s; while :; do timeout --foreground -k 2 %d %s; sleep %s; done",
		pidfile, int(c.Bound.Seconds()), c.GuestCmd(gid, port), pause)
}

// Bound is how long the whole rxed conform run may take before the harness calls it hung:
// every scenario at its deadline plus the closing exchange's bound, and start-up.
func (c ConformRun) ProcessBound() time.Duration {
	n := len(c.Scenarios())
	return time.Duration(n)*(c.Timeout+10*time.Second) + 30*time.Second
}
