//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Extra rxed addresses on HostVeth for multicast cells: several rxed receivers on one host,
// each bound to its own address, share UDP 4791 on the group socket ({addr2}, {addr3}).
const (
	HostIP2 = "10.78.0.2"
	HostIP3 = "10.78.0.3"
)

// McastVars are the values substituted into a multicast member's template.
type McastVars struct {
	Rxed, Addr, Group, Counters, Pcap string
}

// RenderMcast expands a member's template. {addr} is the member's host address: the guest's
// for rxe members, HostIP for rxed ones ({addr2}/{addr3} name the extra rxed addresses).
func RenderMcast(tmpl string, v McastVars) string {
	r := strings.NewReplacer("{rxed}", v.Rxed, "{addr}", v.Addr, "{addr2}", HostIP2, "{addr3}", HostIP3,
		"{group}", v.Group, "{counters}", v.Counters, "{pcap}", v.Pcap)
	return strings.Join(strings.Fields(r.Replace(tmpl)), " ")
}

// mcastEnd is one member of a multicast run.
type mcastEnd struct {
	end
	McastMember
	name string // "receiver 1", "sender"
	pcap string
	p    *proc
}

// runMcast runs a multicast cell (c.Mcast): every receiver is started and must print its
// Ready line (it has joined: the guest kernel sent its IGMP report, rxed's group socket is
// bound) before the sender starts; then the sender, then the receivers are waited for.
// A run passes when every member exits 0 and prints its role's Expect lines in order, nothing
// on either side means bad data, the guest's hw_counters and kernel log are clean, rxed's
// drop_* are 0, and the datagrams are accounted for: the sender sent Msgs (its sent_pkts, or
// the guest's), every rxed receiver accepted Msgs (rcvd_pkts), and rxed's captures hold the
// sender's UD SEND_ONLY_IMMs to the group with destination QP 0xFFFFFF (each rxed member's
// capture: Msgs of them).
//
// The members share one guest (rxed mode boots one), so an rxe receiver and an rxe sender in
// one cell are two mckey processes on one rxe0: the sender's datagrams come back to its own
// device by IP multicast loopback.
func (r *Runner) runMcast(ctx context.Context, c Cell, d Direction) (res Result) {
	t0 := time.Now()
	s := c.Mcast
	res = Result{Cell: c, Dir: d}
	res.LogPrefix = filepath.Join(r.LogDir, slug(c.Name)+"."+d.Short())
	fail := func(format string, a ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, a...)) }
	defer func() {
		res.Elapsed = time.Since(t0)
		res.Pass = len(res.Problems) == 0
		r.saveLogs(&res)
	}()
	if r.Subject != SubjectRxed {
		fail("multicast cells run with -subject rxed only")
		return res
	}
	peer := r.peer()
	// the guest has no default route: 224.0.0.0/4 goes out of eth0 (the host side's route is
	// set up with the namespace, SetupNet)
	if out, err := r.Lab.Guest(ctx, peer, "ip route replace 224.0.0.0/4 dev eth0", 10*time.Second); err != nil {
		fail("guest multicast route: %v: %s", err, out)
		return res
	}

	var members []*mcastEnd
	var pcaps, counterFiles []string
	nrecv := 0
	for i, m := range s.Members {
		e := &mcastEnd{McastMember: m, name: "sender"}
		if !m.Sender {
			nrecv++
			e.name = fmt.Sprintf("receiver %d", nrecv)
		}
		tag := strings.ReplaceAll(e.name, " ", "")
		if m.Rxed {
			v := McastVars{Rxed: r.Rxed, Addr: HostIP, Group: s.Group,
				Counters: fmt.Sprintf("%s.m%d-%s.counters.json", res.LogPrefix, i, tag),
				Pcap:     fmt.Sprintf("%s.m%d-%s.pcap", res.LogPrefix, i, tag)}
			_ = os.Remove(v.Counters)
			_ = os.Remove(v.Pcap)
			e.end = end{cmdline: RenderMcast(m.Cmd, v), counters: v.Counters}
			e.pcap = v.Pcap
			pcaps, counterFiles = append(pcaps, v.Pcap), append(counterFiles, v.Counters)
		} else {
			// line-buffered: the ready line must show while mckey waits for data
			e.end = end{vm: peer, cmdline: "stdbuf -oL " + RenderMcast(m.Cmd, McastVars{Addr: peer.IP, Group: s.Group})}
		}
		members = append(members, e)
	}
	var rcvCmds []string
	for _, e := range members {
		if e.Sender {
			res.ClientCmd = e.cmdline
		} else {
			rcvCmds = append(rcvCmds, e.cmdline)
		}
	}
	res.ServerCmd = strings.Join(rcvCmds, " ; and ")

	before, err := r.snapshot(ctx)
	if err != nil {
		fail("counters before: %v", err)
		return res
	}

	cctx, cancel := context.WithTimeout(ctx, c.Timeout+30*time.Second)
	defer cancel()
	defer func() {
		for _, e := range members {
			stopProc(e.p)
		}
	}()
	var sender *mcastEnd
	for _, e := range members {
		if e.Sender {
			sender = e
			continue
		}
		if e.p, err = r.start(cctx, e.end, c.Timeout); err != nil {
			fail("%s did not start: %v", e.name, err)
			return res
		}
		if err := waitLine(cctx, e.p, s.Ready, 60*time.Second); err != nil {
			fail("%s: %v", e.name, err)
			r.collectMcast(&res, members)
			return res
		}
	}
	if sender == nil {
		fail("cell has no sender")
		return res
	}
	if sender.p, err = r.start(cctx, sender.end, c.Timeout); err != nil {
		fail("sender did not start: %v", err)
		return res
	}
	select {
	case <-sender.p.done:
	case <-cctx.Done():
	}
	grace := 20 * time.Second
	if sender.p.exitStatus() != "exit 0" {
		grace = 3 * time.Second
	}
	deadline := time.After(grace)
	for _, e := range members {
		select {
		case <-e.p.done:
		case <-deadline:
		case <-cctx.Done():
		}
	}
	for _, e := range members {
		stopProc(e.p)
	}
	r.collectMcast(&res, members)

	for _, e := range members {
		out := e.p.out.String()
		if st := e.p.exitStatus(); st != "exit 0" {
			fail("%s: %s", e.name, st)
		}
		want := s.ExpectReceiver
		if e.Sender {
			want = s.ExpectSender
		}
		if l := MissingLines(out, want); l != "" {
			fail("%s did not print %q", e.name, l)
		}
		if m := badOutput.FindString(out); m != "" {
			fail("%s output: %q", e.name, strings.TrimSpace(m))
		}
	}
	r.judgeMcastCounters(ctx, &res, before, members, counterFiles, fail)
	r.judgeMcastPcaps(ctx, &res, members, fail)
	return res
}

// collectMcast puts the members' outputs into the result: the receivers' as ServerOut, the
// sender's as ClientOut.
func (r *Runner) collectMcast(res *Result, members []*mcastEnd) {
	var rcv []string
	for _, e := range members {
		if e.p == nil {
			continue
		}
		out := fmt.Sprintf("## %s (%s): %s\n%s", e.name, e.cmdline, e.p.exitStatus(), e.p.out.String())
		if e.Sender {
			res.ClientOut = out
		} else {
			rcv = append(rcv, out)
		}
	}
	res.ServerOut = strings.Join(rcv, "\n")
}

// judgeMcastCounters: the guest's hw_counters and kernel log as every run, rxed's drop_* per
// process, and the datagram accounting (see runMcast). The guest's rcvd_pkts are not judged
// per member: rxe counts a multicast packet once per device, whatever the number of its QPs.
func (r *Runner) judgeMcastCounters(ctx context.Context, res *Result, before []snap, members []*mcastEnd,
	counterFiles []string, fail func(string, ...any)) {
	s := res.Cell.Mcast
	if !r.judgeGuest(ctx, res, before, fail) {
		return
	}
	var metric []string
	for _, e := range members {
		if !e.Rxed {
			if e.Sender {
				if got := res.PeerDelta["sent_pkts"]; got < uint64(s.Msgs) {
					fail("guest sender: rxe0 sent_pkts +%d, want at least %d", got, s.Msgs)
				}
			}
			continue
		}
		cs, ok := r.judgeRxedCounters(res, e.name, e.counters, false, fail)
		if !ok {
			continue
		}
		if e.Sender {
			if cs["sent_pkts"] != uint64(s.Msgs) {
				fail("rxed sender: sent_pkts %d, want %d", cs["sent_pkts"], s.Msgs)
			}
			metric = append(metric, fmt.Sprintf("rxed sent %d", cs["sent_pkts"]))
		} else {
			if cs["rcvd_pkts"] != uint64(s.Msgs) {
				fail("rxed %s: rcvd_pkts %d, want %d", e.name, cs["rcvd_pkts"], s.Msgs)
			}
			metric = append(metric, fmt.Sprintf("rxed rcvd %d", cs["rcvd_pkts"]))
		}
	}
	metric = append(metric, fmt.Sprintf("guest sent %d rcvd %d", res.PeerDelta["sent_pkts"], res.PeerDelta["rcvd_pkts"]))
	res.Metric = strings.Join(metric, ", ")
	if len(counterFiles) > 0 {
		merged := res.LogPrefix + ".counters.json"
		if err := mergeCounterFiles(merged, counterFiles); err == nil {
			if b, err := os.ReadFile(merged); err == nil {
				res.Subject, _ = ParseRxedCounters(b)
			}
		}
	}
}

// judgeMcastPcaps counts, in each rxed member's capture, the UD SEND_ONLY_IMM packets
// (opcode 0x65) to the group with destination QP 0xFFFFFF: the sender's own Msgs, or the
// Msgs each receiver got.
func (r *Runner) judgeMcastPcaps(ctx context.Context, res *Result, members []*mcastEnd, fail func(string, ...any)) {
	s := res.Cell.Mcast
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		res.Notes = append(res.Notes, "no capture check: tshark not installed")
		return
	}
	for _, e := range members {
		if !e.Rxed {
			continue
		}
		n, err := countMcastSends(ctx, tshark, e.pcap, s.Group)
		if err != nil {
			fail("%s: %v", e.name, err)
			continue
		}
		// A sender is a member of its group too: its capture also holds
		// the copies the kernel loops back to it while it is joined (how
		// many depends on when it leaves), so it must show at least its
		// own Msgs and at most twice that; its sent_pkts counter (checked
		// with the counters) is the exact count.
		if e.Sender && n >= s.Msgs && n <= 2*s.Msgs {
			continue
		}
		if n != s.Msgs {
			fail("%s: its capture has %d UD SEND_ONLY_IMM to %s QP 0xffffff, want %d", e.name, n, s.Group, s.Msgs)
		}
	}
}

// countMcastSends counts the UD SEND_ONLY_IMMs to group's QP 0xFFFFFF in a capture.
func countMcastSends(ctx context.Context, tshark, pcap, group string) (int, error) {
	out, err := exec.CommandContext(ctx, tshark, "-r", pcap, "-Y",
		fmt.Sprintf("ip.dst == %s && infiniband.bth.opcode == 0x65 && infiniband.bth.destqp == 0xffffff", group),
		"-T", "fields", "-e", "frame.number").Output()
	if err != nil {
		return 0, fmt.Errorf("tshark -r %s: %v", pcap, err)
	}
	return len(strings.Fields(string(out))), nil
}

// waitLine waits until p prints line (a substring of its output).
func waitLine(ctx context.Context, p *proc, line string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if strings.Contains(p.out.String(), line) {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("exited before %q (%s)", line, p.exitStatus())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("no %q after %s", line, limit)
}
