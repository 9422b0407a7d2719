//go:build linux

package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// guestCMCounters prints the kernel's ib_cm counters of rxe0's port 1 as "cm_tx_msgs/req:N"
// lines: cm_tx_msgs/<msg> (retransmissions included), cm_tx_retries/<msg>, cm_rx_msgs/<msg>,
// cm_rx_duplicates/<msg>. Since Linux 5.13 they are port attributes of the device
// (/sys/class/infiniband/rxe0/ports/1/cm_*), before that under /sys/class/infiniband_cm.
const guestCMCounters = `for d in /sys/class/infiniband/rxe0/ports/1 /sys/class/infiniband_cm/rxe0/1; do
  if [ -d $d/cm_tx_msgs ]; then cd $d && exec grep -H . cm_*/*; fi
done
echo "no ib_cm counters for rxe0 port 1 (is ib_cm loaded? lsmod: $(lsmod | grep -c '^ib_cm'))"; exit 1`

// cmEnd is one process of an rdma_cm run.
type cmEnd struct {
	end
	pcap string // rxed's --pcap file
}

// runCM runs an rdma_cm cell (c.CM): the server, then each step's client one after the other,
// then (rping -P on the guest) the harness stops the persistent server. Judged like Run (exit
// statuses, output, both sides' hw_counters, the guest's kernel log, rxed's drop counters, the
// delivery accounting) plus the tools' own lines (every rping ping's data, ucmatose's and
// udaddy's progress lines and return status, a REJ step's reason 8) and the CM messages each
// side sent: from the guest kernel's ib_cm counters and from rxed's capture (tshark), against
// what the tool's protocol implies (CMSpec.ExpectCM), which shows who sent the DREQ.
//
// Readiness: rdma_cm tools have no TCP port for `ss`. On the guest the harness polls
// `rdma resource show cm_id` for a cm_id in state LISTEN on the run's port (the kernel's own
// listener table, as ss is for TCP); rxed prints a line once it listens (rping -d
// "rdma_listen", "cmatose: starting server", "udaddy: starting server") and the harness waits
// for it. No probe connection is made: it would be a client of its own.
func (r *Runner) runCM(ctx context.Context, c Cell, d Direction) (res Result) {
	t0 := time.Now()
	s := c.CM
	res = Result{Cell: c, Dir: d}
	port := r.nextPort()
	r.nextPort() // port+1 stays unused: WrongPort steps connect there
	if s.Port != 0 {
		port = s.Port
	}
	res.LogPrefix = filepath.Join(r.LogDir, slug(c.Name)+"."+d.Short())
	fail := func(format string, a ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, a...)) }
	defer func() {
		res.Elapsed = time.Since(t0)
		res.Pass = len(res.Problems) == 0
		r.saveLogs(&res)
	}()

	peer := r.peer()
	peerAddr := peer.IP
	if c.IPv6 {
		peerAddr = peer.IP6
	}
	_, subjAddr := r.subjectAddrs(c)
	subjRole, peerRole := Server, Client
	srvVM, srvAddr, cliVM, cliAddr := r.subjectVM(), subjAddr, peer, peerAddr
	if d == SubjectClient {
		subjRole, peerRole = Client, Server
		srvVM, srvAddr, cliVM, cliAddr = peer, peerAddr, r.subjectVM(), subjAddr
	}
	var pcaps, counterFiles []string
	mk := func(role Role, vm *VM, addr string, port int, tag string) cmEnd {
		v := CMVars{Rxed: r.Rxed, Addr: addr, SrvAddr: srvAddr, Port: port}
		if vm != nil {
			tmpl := s.RxeServer
			if role == Client {
				tmpl = s.RxeClient
			}
			// line-buffered stdout: a persistent server's lines survive its SIGTERM, and the
			// lines interleave with stderr as they happened
			return cmEnd{end: end{vm: vm, cmdline: "stdbuf -oL " + RenderCM(tmpl, v)}}
		}
		tmpl := s.RxedServer
		if role == Client {
			tmpl = s.RxedClient
		}
		v.Counters, v.Pcap = res.LogPrefix+"."+tag+".counters.json", res.LogPrefix+"."+tag+".pcap"
		_ = os.Remove(v.Counters)
		_ = os.Remove(v.Pcap)
		pcaps, counterFiles = append(pcaps, v.Pcap), append(counterFiles, v.Counters)
		return cmEnd{end: end{cmdline: RenderCM(tmpl, v), counters: v.Counters}, pcap: v.Pcap}
	}
	srv := mk(Server, srvVM, srvAddr, port, "server")
	clis := make([]cmEnd, len(s.Steps))
	var cliCmds []string
	for i, st := range s.Steps {
		p := port
		if st.WrongPort {
			p = port + 1
		}
		clis[i] = mk(Client, cliVM, cliAddr, p, fmt.Sprintf("client%d", i+1))
		cliCmds = append(cliCmds, clis[i].cmdline)
	}
	res.ServerCmd, res.ClientCmd = srv.cmdline, strings.Join(cliCmds, " ; then ")

	before, err := r.snapshot(ctx)
	if err != nil {
		fail("counters before: %v", err)
		return res
	}
	cmBefore, err := r.cmSnapshot(ctx)
	if err != nil {
		fail("ib_cm counters before: %v", err)
		return res
	}
	hostBefore := r.hostDrops(ctx)

	var wire *wireCapture
	if c.TOS != 0 { // a TOS cell (matrix_tos.go): the wire's view of both directions
		if wire, err = startWire(ctx, peer.Tap, res.LogPrefix+".wire.pcap"); err != nil {
			fail("wire capture: %v", err)
			return res
		}
		defer wire.stop()
	}

	life := time.Duration(len(s.Steps))*c.Timeout + 20*time.Second
	cctx, cancel := context.WithTimeout(ctx, life+10*time.Second)
	defer cancel()
	pidfile := fmt.Sprintf("/tmp/rxed-interop-cm-%d.pid", port)
	sp, err := r.startCM(cctx, srv.end, life, pidfile)
	if err != nil {
		fail("server did not start: %v", err)
		return res
	}
	defer stopProc(sp)
	if err := r.waitCMListen(cctx, srv.end, sp, port, cmReadyLine(s.Prog)); err != nil {
		fail("server: %v", err)
		res.ServerOut = sp.out.String()
		return res
	}

	var outs []string
	goodOuts := make([]string, 0, len(s.Steps))
	for i, st := range s.Steps {
		cp, err := r.startCM(cctx, clis[i].end, c.Timeout, "")
		if err != nil {
			fail("client %d did not start: %v", i+1, err)
			break
		}
		select {
		case <-cp.done:
		case <-sp.done:
			select { // the server died: the client cannot finish
			case <-cp.done:
			case <-time.After(5 * time.Second):
			}
		case <-cctx.Done():
		}
		stopProc(cp)
		out, status := cp.out.String(), cp.exitStatus()
		outs = append(outs, fmt.Sprintf("## client %d (%s): %s\n%s", i+1, clis[i].cmdline, status, out))
		if st.WrongPort {
			switch {
			case status == "exit 0":
				fail("client %d (to port %d, nobody listening): exit 0, want a failure", i+1, port+1)
			case !strings.HasPrefix(status, "exit "), strings.Contains(status, "124"):
				fail("client %d (to port %d, nobody listening): %s", i+1, port+1, status)
			}
			if !ReportsReject8(out) {
				fail("client %d (to port %d, nobody listening) did not report REJ reason 8 (invalid service ID)", i+1, port+1)
			}
		} else {
			if status != "exit 0" {
				fail("client %d: %s", i+1, status)
			}
			goodOuts = append(goodOuts, out)
		}
		if sp.exited() && i < len(s.Steps)-1 {
			fail("server exited after client %d (%s)", i+1, sp.exitStatus())
			break
		}
	}
	if s.Persistent && srv.vm != nil {
		// rping -P serves forever: it must still be there, then the harness stops it by pid
		if sp.exited() {
			fail("persistent server exited after the clients (%s)", sp.exitStatus())
		} else {
			_, _ = r.Lab.Guest(ctx, srv.vm, fmt.Sprintf("kill -TERM $(cat %s)", pidfile), 10*time.Second)
			select {
			case <-sp.done:
			case <-time.After(5 * time.Second):
			}
		}
	} else {
		grace := 20 * time.Second
		if len(res.Problems) > 0 {
			grace = 3 * time.Second
		}
		select {
		case <-sp.done:
		case <-time.After(grace):
		case <-cctx.Done():
		}
		if st := sp.exitStatus(); st != "exit 0" {
			fail("server: %s", st)
		}
	}
	stopProc(sp)
	if srv.vm != nil {
		_, _ = r.Lab.Guest(ctx, srv.vm, "rm -f "+pidfile, 10*time.Second)
	}
	res.ServerOut, res.ClientOut = sp.out.String(), strings.Join(outs, "\n")

	// counters: rxed's files (one per rxed process) summed into one for judgeCounters
	merged := ""
	if len(counterFiles) > 0 {
		merged = res.LogPrefix + ".counters.json"
		if err := mergeCounterFiles(merged, counterFiles); err != nil {
			fail("rxed counters: %v", err)
			merged = ""
		}
	}
	r.judgeCounters(ctx, &res, before, hostBefore, merged, fail)
	r.judgeCMOutput(&res, goodOuts, fail)

	// the CM messages each side sent
	expect := s.ExpectCM()
	judge := func(p, n []string) {
		for _, x := range p {
			fail("%s", x)
		}
		res.Notes = append(res.Notes, n...)
	}
	cmAfter, err := r.cmSnapshot(ctx)
	if err != nil {
		fail("ib_cm counters after: %v", err)
	} else {
		for i := range cmAfter {
			role, who := peerRole, "guest ib_cm"
			if i > 0 {
				role, who = subjRole, "guest2 ib_cm"
			}
			delta := Delta(cmBefore[i], cmAfter[i])
			sent, retries := GuestCMSent(delta)
			rcvd, dups := GuestCMReceived(delta)
			judge(CompareCM(who, sent, expect[role]))
			judge(CompareCM(who+" received: the other side", rcvd, expect[1-role]))
			if n := retries.String(); n != "(none)" {
				res.Notes = append(res.Notes, who+" retransmitted "+n)
			}
			if n := dups.String(); n != "(none)" {
				res.Notes = append(res.Notes, who+" saw duplicates "+n)
			}
			if i == 0 && res.Metric == "" {
				res.Metric = fmt.Sprintf("guest %s: sent %s, rcvd %s", role, sent, rcvd)
			}
		}
	}
	if len(pcaps) > 0 {
		flow, err := cmFlow(ctx, pcaps)
		if err != nil {
			res.Notes = append(res.Notes, "no capture check: "+err.Error())
		} else {
			judge(CompareCM("rxed (its capture)", CountFrom(flow, subjAddr), expect[subjRole]))
			judge(CompareCM("guest (in rxed's capture)", CountFrom(flow, peerAddr), expect[peerRole]))
			for _, m := range flow {
				if m.Attr == AttrREJ && m.Reason != 8 {
					fail("REJ with reason %d from %s, want 8 (invalid service ID)", m.Reason, m.From)
				}
			}
		}
	}
	if wire != nil {
		wire.stop()
		r.judgeTOS(ctx, &res, wire.file, pcaps, subjAddr, peerAddr, fail)
	}
	return res
}

// judgeCMOutput checks the tools' lines: nothing that means bad data on either side, and per
// program what a successful run prints (goodOuts: the outputs of the clients that had to
// succeed).
func (r *Runner) judgeCMOutput(res *Result, goodOuts []string, fail func(string, ...any)) {
	s := res.Cell.CM
	for _, o := range []struct{ name, out string }{{"client", res.ClientOut}, {"server", res.ServerOut}} {
		if m := badOutput.FindString(o.out); m != "" {
			fail("%s output: %q", o.name, strings.TrimSpace(m))
		}
	}
	switch s.Prog {
	case Rping:
		if s.ClientV {
			for i, out := range goodOuts {
				for _, p := range CheckRpingPings(fmt.Sprintf("client %d", i+1), ParseRpingPings(out, false), 1, s.Pings, s.Size) {
					fail("%s", p)
				}
			}
		}
		if s.ServerV {
			for _, p := range CheckRpingPings("server", ParseRpingPings(res.ServerOut, true), len(goodOuts), s.Pings, s.Size) {
				fail("%s", p)
			}
		}
	case Ucmatose, Udaddy:
		srvLines, cliLines := CmatoseServerLines, CmatoseClientLines
		if s.Prog == Udaddy {
			srvLines, cliLines = UdaddyServerLines, UdaddyClientLines
		}
		if l := MissingLines(res.ServerOut, srvLines); l != "" {
			fail("server did not print %q", l)
		}
		for i, out := range goodOuts {
			if l := MissingLines(out, cliLines); l != "" {
				fail("client %d did not print %q", i+1, l)
			}
		}
	}
}

// startCM starts an rdma_cm tool; a guest tool writes its pid (that of `timeout`, which passes
// SIGTERM on) to pidfile when one is given, so the harness can stop exactly it.
func (r *Runner) startCM(ctx context.Context, e end, timeout time.Duration, pidfile string) (*proc, error) {
	if e.vm == nil || pidfile == "" {
		return r.start(ctx, e, timeout)
	}
	return startProc(r.Lab.guestCmd(ctx, e.vm, fmt.Sprintf("echo $$ > %s; exec timeout %d %s", pidfile, int(timeout.Seconds()), e.cmdline)))
}

// Lines rxed prints once its perftest -R server (rxed perf -R) or serve's rdma_cm listener
// (--rdma-cm-port, a slog line) listens.
const (
	perfCMReadyLine  = "Waiting for client to connect"
	serveCMReadyLine = `msg="perftest rdma_cm exchange"`
)

// waitServerListen waits for a perftest or serve server: its TCP port, or for the -R cells of
// matrix_rdmacm_perf.go (no TCP at all; serve keeps its TCP listener too) its rdma_cm listener.
func (r *Runner) waitServerListen(ctx context.Context, c Cell, e end, p *proc, port int) error {
	if !IsRDMACMPerf(c) {
		return r.waitListen(ctx, e, p, port)
	}
	ready := perfCMReadyLine
	if c.Serve {
		ready = serveCMReadyLine
	}
	return r.waitCMListen(ctx, e, p, port, ready)
}

// cmReadyLine is the line rxed prints once its server listens.
func cmReadyLine(p CMProg) string {
	switch p {
	case Ucmatose:
		return "cmatose: starting server"
	case Udaddy:
		return "udaddy: starting server"
	}
	return "rdma_listen" // rping -d
}

// waitCMListen waits until the server listens on its rdma_cm port (see runCM): on a guest
// a cm_id in state LISTEN on port, for rxed the line ready in its output.
func (r *Runner) waitCMListen(ctx context.Context, e end, p *proc, port int, ready string) error {
	deadline := time.Now().Add(60 * time.Second)
	probe := fmt.Sprintf(`rdma resource show cm_id | grep 'state LISTEN' | grep -qE 'src-addr [^ ]+:%d( |$)'`, port)
	for time.Now().Before(deadline) {
		if e.vm != nil {
			if _, err := r.Lab.Guest(ctx, e.vm, probe, 10*time.Second); err == nil {
				return nil
			}
		} else if strings.Contains(p.out.String(), ready) {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("exited before listening (%s)", p.exitStatus())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("no rdma_cm listener on port %d after 60s", port)
}

// cmSnapshot reads every guest's ib_cm counters.
func (r *Runner) cmSnapshot(ctx context.Context) ([]Counters, error) {
	var out []Counters
	for _, vm := range r.Lab.VMs {
		s, err := r.Lab.Guest(ctx, vm, guestCMCounters, 20*time.Second)
		if err != nil {
			return nil, fmt.Errorf("%w: %s", err, s)
		}
		out = append(out, ParseHWCounters(s))
	}
	return out, nil
}

// cmFlow reads the CM MADs of rxed's captures with tshark, in capture order per file.
func cmFlow(ctx context.Context, pcaps []string) ([]CMMsg, error) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		return nil, fmt.Errorf("tshark not installed")
	}
	var flow []CMMsg
	for _, p := range pcaps {
		out, err := exec.CommandContext(ctx, tshark, "-r", p, "-Y", "infiniband.mad", "-T", "fields",
			"-e", "ip.src", "-e", "ipv6.src", "-e", "infiniband.mad.attributeid", "-e", "infiniband.cm.rej.reason").Output()
		if err != nil {
			return nil, fmt.Errorf("tshark -r %s: %v", p, err)
		}
		flow = append(flow, ParseCMFlow(string(out))...)
	}
	return flow, nil
}

// mergeCounterFiles sums rxed's counters files (one per process of a run) into one file.
func mergeCounterFiles(dst string, files []string) error {
	sum := Counters{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		cs, err := ParseRxedCounters(b)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for k, v := range cs {
			sum[k] += v
		}
	}
	b, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
