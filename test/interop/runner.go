//go:build linux

package interop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Subject is the implementation under test.
type Subject string

const (
	// SubjectRxed tests rxed (run on the host side of the bridge, 10.78.0.1) against guest 1.
	SubjectRxed Subject = "rxed"
	// SubjectRxe puts a second rxe guest (10.78.0.12) in rxed's place: rxe against rxe proves
	// the harness itself.
	SubjectRxe Subject = "rxe"
)

// Result is the outcome of one cell in one direction.
type Result struct {
	Cell      Cell
	Dir       Direction
	Pass      bool
	Metric    string
	BW        float64 // a bandwidth cell's average in MiB/s (perftest's MB/sec), 0 otherwise
	Problems  []string
	Notes     []string // recovery counters that moved (see CheckRxeCounters), not failures
	Elapsed   time.Duration
	ServerCmd string
	ClientCmd string
	ServerOut string
	ClientOut string
	PeerDelta Counters    // the rxe guest's hw_counters change during the run
	Subject   Counters    // rxed's counters (rxed mode), or guest 2's hw_counters change (rxe mode)
	LogPrefix string      // full outputs are in LogPrefix.{server,client}.txt
	Down      []GuestDown // guests found down after a try of this cell (RunRecovering)
}

// Runner runs cells on a booted Lab.
type Runner struct {
	Lab     *Lab
	Subject Subject
	Rxed    string // rxed binary (SubjectRxed)
	LogDir  string
	// Strict fails a cell on recovery counters too (retransmissions, duplicates, RNR) when it
	// adds no loss. Off under TCG, where rxe's retransmit timer fires spuriously.
	Strict bool
	// CrashGuest checks the harness's recovery (guest_down.go): the peer guest's kernel is
	// crashed (sysrq c) just before the first run of the first cell whose name contains it.
	CrashGuest string
	crashed    bool
	// FreezeGuest checks the recovery of a conform run (guest_down_conform.go): the peer
	// guest's qemu is stopped (SIGSTOP) a few seconds into the first conform run whose name
	// contains it, a guest that hangs without a panic.
	FreezeGuest string
	froze       bool
	port        int
}

// proc is a running tool: on a guest (over ssh) or on the host (inside the namespace).
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuf
	done chan struct{}
	err  error
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	p := &proc{cmd: cmd, out: &syncBuf{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitStatus renders how the process ended.
func (p *proc) exitStatus() string {
	if !p.exited() {
		return "did not exit (stopped by the harness)"
	}
	if p.err == nil {
		return "exit 0"
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ee.ExitCode() == 124 {
			return "timed out (exit 124)"
		}
		return fmt.Sprintf("exit %d", ee.ExitCode())
	}
	return p.err.Error()
}

// end is one side of a run.
type end struct {
	vm       *VM    // nil: rxed on the host
	cmdline  string // the tool's command line
	counters string // rxed's --counters-out file
}

func (r *Runner) peer() *VM { return r.Lab.VMs[0] }

func (r *Runner) subjectVM() *VM {
	if r.Subject == SubjectRxe {
		return r.Lab.VMs[1]
	}
	return nil
}

// addrs returns the subject's IPv4 address (for the TCP exchange) and its RoCE address.
func (r *Runner) subjectAddrs(c Cell) (tcp, roce string) {
	if vm := r.subjectVM(); vm != nil {
		if c.IPv6 {
			return vm.IP, vm.IP6
		}
		return vm.IP, vm.IP
	}
	if c.IPv6 {
		return HostIP, HostIP6
	}
	return HostIP, HostIP
}

func gidOf(vm *VM, c Cell) int {
	if c.IPv6 {
		return vm.GID6
	}
	return vm.GID4
}

// slug turns a cell name into a file name.
func slug(s string) string {
	return strings.NewReplacer("/", "_", "%", "pct", " ", "_").Replace(s)
}

// Run runs cell c in direction d.
func (r *Runner) Run(ctx context.Context, c Cell, d Direction) (res Result) {
	if c.Serve {
		return r.runServe(ctx, c)
	}
	if c.CM != nil {
		return r.runCM(ctx, c, d)
	}
	if c.Mcast != nil {
		return r.runMcast(ctx, c, d)
	}
	t0 := time.Now()
	res = Result{Cell: c, Dir: d}
	r.nextPort()
	tool := Tools[c.Tool]
	res.LogPrefix = filepath.Join(r.LogDir, slug(c.Name)+"."+d.Short())
	peer := r.peer()
	peerEnd := end{vm: peer, cmdline: Render(tool.Rxe, c, Vars{GID: gidOf(peer, c), Port: r.port})}
	_, subjAddr := r.subjectAddrs(c)
	peerAddr := peer.IP
	if c.IPv6 {
		peerAddr = peer.IP6
	}
	var subj end
	var rxedPcap string
	if vm := r.subjectVM(); vm != nil {
		subj = end{vm: vm, cmdline: Render(tool.Rxe, c, Vars{GID: gidOf(vm, c), Port: r.port})}
	} else {
		subj = end{counters: res.LogPrefix + ".counters.json"}
		subj.cmdline = Render(tool.Rxed, c, Vars{Rxed: r.Rxed, Addr: subjAddr, Port: r.port, Counters: subj.counters})
		_ = os.Remove(subj.counters)
		if c.TOS != 0 { // a TOS cell judges what rxed sent from its capture (runner_tos.go)
			rxedPcap = res.LogPrefix + ".pcap"
			_ = os.Remove(rxedPcap)
			subj.cmdline += " --pcap " + rxedPcap
		}
	}
	srv, cli := subj, peerEnd
	if d == SubjectClient {
		srv, cli = peerEnd, subj
	}
	srvTCP := peer.IP
	if d == SubjectServer {
		srvTCP, _ = r.subjectAddrs(c)
	}
	if c.ClientArgs != "" {
		cli.cmdline += " " + c.ClientArgs
	}
	cli.cmdline += " " + srvTCP
	res.ServerCmd, res.ClientCmd = srv.cmdline, cli.cmdline

	fail := func(format string, a ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, a...)) }
	defer func() {
		res.Elapsed = time.Since(t0)
		res.Pass = len(res.Problems) == 0
		r.saveLogs(&res)
	}()

	before, err := r.snapshot(ctx)
	if err != nil {
		fail("counters before: %v", err)
		return res
	}
	hostBefore := r.hostDrops(ctx)
	if c.LossPct > 0 {
		if err := r.Lab.SetLoss(ctx, c.LossPct); err != nil {
			fail("netem: %v", err)
			return res
		}
		defer func() { _ = r.Lab.SetLoss(context.Background(), 0) }()
	}

	var wire *wireCapture
	if c.TOS != 0 {
		if wire, err = startWire(ctx, peer.Tap, res.LogPrefix+".wire.pcap"); err != nil {
			fail("wire capture: %v", err)
			return res
		}
		defer wire.stop()
	}

	cctx, cancel := context.WithTimeout(ctx, c.Timeout+30*time.Second)
	defer cancel()
	sp, err := r.start(cctx, srv, c.Timeout)
	if err != nil {
		fail("server did not start: %v", err)
		return res
	}
	defer stopProc(sp)
	if err := r.waitServerListen(cctx, c, srv, sp, r.port); err != nil {
		fail("server: %v", err)
		res.ServerOut = sp.out.String()
		return res
	}
	cp, err := r.start(cctx, cli, c.Timeout)
	if err != nil {
		fail("client did not start: %v", err)
		return res
	}
	defer stopProc(cp)
	select {
	case <-cp.done:
	case <-sp.done:
		// the server gave up first: the client cannot finish either, so do not wait out its timeout
		if sp.exitStatus() != "exit 0" {
			select {
			case <-cp.done:
			case <-time.After(5 * time.Second):
				stopProc(cp)
				fail("client stopped by the harness 5s after the server failed")
			case <-cctx.Done():
			}
		} else {
			select {
			case <-cp.done:
			case <-cctx.Done():
			}
		}
	case <-cctx.Done():
	}
	// the server finishes right after a successful client; give it a little time
	grace := 20 * time.Second
	if cp.exitStatus() != "exit 0" {
		grace = 3 * time.Second
	}
	select {
	case <-sp.done:
	case <-time.After(grace):
	case <-cctx.Done():
	}
	res.ServerOut, res.ClientOut = sp.out.String(), cp.out.String()
	if s := sp.exitStatus(); s != "exit 0" {
		fail("server: %s", s)
	}
	if s := cp.exitStatus(); s != "exit 0" {
		fail("client: %s", s)
	}
	stopProc(sp)
	stopProc(cp)

	r.judgeCounters(ctx, &res, before, hostBefore, subj.counters, fail)
	res.Metric = r.judgeOutput(&res, tool, srv, cli, fail)
	if wire != nil {
		wire.stop()
		var pcaps []string
		if rxedPcap != "" {
			pcaps = []string{rxedPcap}
		}
		r.judgeTOS(ctx, &res, wire.file, pcaps, subjAddr, peerAddr, fail)
	}
	if row, ok := ParsePerf(res.ClientOut); ok && tool.Kind == PerfBW {
		res.BW = row["BW average[MB/sec]"]
	}
	return res
}

// judgeCounters reads the counters after a run and judges both sides' against the snapshot
// taken before it: the rxe guest's hw_counters and kernel log, rxed's counters file (rxed
// mode), and the delivery accounting corrected by what the network measurably dropped.
func (r *Runner) judgeCounters(ctx context.Context, res *Result, before []snap, hostBefore Counters, countersFile string,
	fail func(string, ...any)) {
	c := res.Cell
	after, err := r.snapshot(ctx)
	if err != nil {
		fail("counters after: %v", err)
		return
	}
	host := Delta(hostBefore, r.hostDrops(ctx))
	loss := c.LossPct > 0
	judge := func(who string, p, n []string) {
		for _, x := range p {
			fail("%s%s", who, x)
		}
		for _, x := range n {
			res.Notes = append(res.Notes, who+x)
		}
	}
	res.PeerDelta = Delta(before[0].hw, after[0].hw)
	late := LateAnswers(res.PeerDelta, r.Strict)
	p, n := CheckRxeCounters(res.PeerDelta, loss, r.Strict)
	judge("guest rxe0 ", p, n)
	if len(after) > 1 {
		res.Subject = Delta(before[1].hw, after[1].hw)
		p, n := CheckRxeCounters(res.Subject, loss, r.Strict)
		judge("guest2 rxe0 ", p, n)
	}
	for i := range after {
		if after[i].dmesg > before[i].dmesg {
			if lines := r.kernelLog(ctx, r.Lab.VMs[i], before[i].dmesg); lines != "" {
				fail("vm%d kernel log: %s", i+1, lines)
			}
		}
	}
	if countersFile != "" {
		b, err := os.ReadFile(countersFile)
		if err != nil {
			fail("rxed counters: %v", err)
		} else if cs, err := ParseRxedCounters(b); err != nil {
			fail("%v", err)
		} else {
			res.Subject = cs
			p, n := CheckRxedCounters(cs, loss, r.Strict, late)
			judge("", p, n)
		}
	}
	// packets the network lost on the way (queues of the taps and veths, the receivers' UDP
	// layers): measured, so they never count against the implementations
	peer1 := r.Lab.VMs[0]
	toPeer := host[peer1.Tap+".tx_dropped"] + (after[0].drops - before[0].drops)
	var toSubject uint64
	if len(after) > 1 {
		toSubject = host[r.Lab.VMs[1].Tap+".tx_dropped"] + (after[1].drops - before[1].drops)
	} else {
		toSubject = host[HostPort+".tx_dropped"] + host[HostVeth+".rx_dropped"] + UDPDrops(host)
	}
	if toPeer+toSubject > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("network dropped %d to the guest, %d to %s", toPeer, toSubject, r.Subject))
	}
	if !loss && res.Subject != nil {
		name := string(r.Subject)
		slack := func(cs Counters) uint64 {
			if r.Strict {
				return 0
			}
			return Retransmissions(cs)
		}
		if m := CheckDelivery(name, res.Subject, "guest", res.PeerDelta, toPeer+slack(res.Subject)); m != "" {
			fail("%s (dropped by the guest's rxe)", m)
		}
		if m := CheckDelivery("guest", res.PeerDelta, name, res.Subject, toSubject+slack(res.PeerDelta)+late); m != "" {
			fail("%s (dropped by %s)", m, name)
		}
	}
}

// judgeOutput checks the tools' output and returns the headline metric.
func (r *Runner) judgeOutput(res *Result, tool Tool, srv, cli end, fail func(string, ...any)) string {
	outs := []struct {
		name, out string
		rxe       bool
	}{{"client", res.ClientOut, cli.vm != nil}, {"server", res.ServerOut, srv.vm != nil}}
	for _, o := range outs {
		if m := badOutput.FindString(o.out); m != "" {
			fail("%s output: %q", o.name, strings.TrimSpace(m))
		}
	}
	switch tool.Kind {
	case Pingpong:
		metric := ""
		for _, o := range outs {
			pr, ok := ParsePingpong(o.out)
			if !ok {
				fail("%s printed no pingpong result", o.name)
				continue
			}
			if pr.Iters != res.Cell.Iters {
				fail("%s: %d iterations, want %d", o.name, pr.Iters, res.Cell.Iters)
			}
			if metric == "" {
				metric = pr.Metric()
			}
		}
		return metric
	default:
		metric := ""
		for _, o := range outs {
			if row, ok := ParsePerf(o.out); ok && metric == "" {
				metric = row.Metric(tool.Kind)
			}
		}
		// perftest's client always prints the table (its server does only for some tests)
		if _, ok := ParsePerf(res.ClientOut); !ok {
			fail("client printed no perftest result table")
		}
		return metric
	}
}

// badOutput matches lines that mean a failure even when the exit status is 0 (ibv_*_pingpong's
// -c check only prints "Invalid data").
var badOutput = regexp.MustCompile(`(?im)^.*(invalid data|data mismatch|validation failed|completion with error|bad ICRC).*$`)

func (r *Runner) start(ctx context.Context, e end, timeout time.Duration) (*proc, error) {
	secs := int(timeout.Seconds())
	if e.vm != nil {
		return startProc(r.Lab.guestCmd(ctx, e.vm, fmt.Sprintf("exec timeout %d %s", secs, e.cmdline)))
	}
	argv := strings.Fields(e.cmdline)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", Netns, "timeout", strconv.Itoa(secs)}, argv...)...)
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = 2 * time.Second
	return startProc(cmd)
}

// stopProc ends a tool the harness started (by its pid): SIGTERM, then SIGKILL.
func stopProc(p *proc) {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitListen waits until the server listens on its TCP port (a test connection would consume
// the tools' single accept, so look at the socket table instead).
func (r *Runner) waitListen(ctx context.Context, e end, p *proc, port int) error {
	deadline := time.Now().Add(60 * time.Second)
	probe := fmt.Sprintf("ss -ltnH 'sport = :%d' | grep -q LISTEN", port)
	for time.Now().Before(deadline) {
		var err error
		if e.vm != nil {
			_, err = r.Lab.Guest(ctx, e.vm, probe, 10*time.Second)
		} else {
			var out string
			out, err = nsh(ctx, "ss", "-ltnH", fmt.Sprintf("sport = :%d", port))
			if err == nil && !strings.Contains(out, "LISTEN") {
				err = errors.New("not listening")
			}
		}
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("exited before listening (%s)", p.exitStatus())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
	return fmt.Errorf("not listening on TCP %d after 60s", port)
}

type snap struct {
	hw    Counters // rxe0 hw_counters
	dmesg uint64   // kernel log lines
	drops uint64   // eth0 rx_dropped + UDP InErrors/RcvbufErrors: packets lost before rxe saw them
}

// snapshot reads every guest's hw_counters, kernel log length and receive-path drops in one ssh
// call per guest.
func (r *Runner) snapshot(ctx context.Context) ([]snap, error) {
	var out []snap
	for _, vm := range r.Lab.VMs {
		s, err := r.Lab.Guest(ctx, vm, `cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . *
echo "dmesg_lines:$(dmesg | wc -l)"; echo "eth0_rx_dropped:$(cat /sys/class/net/eth0/statistics/rx_dropped)"
grep '^Udp:' /proc/net/snmp`, 20*time.Second)
		if err != nil {
			return nil, fmt.Errorf("%w: %s", err, s)
		}
		c := ParseHWCounters(s)
		sn := snap{dmesg: c["dmesg_lines"], drops: c["eth0_rx_dropped"] + UDPDrops(ParseSNMP(s))}
		delete(c, "dmesg_lines")
		delete(c, "eth0_rx_dropped")
		sn.hw = c
		out = append(out, sn)
	}
	return out, nil
}

// hostDrops reads, inside the namespace, the drop counters of the bridge ports and rxed's veth
// ("<dev>.tx_dropped", "<dev>.rx_dropped") and the namespace's UDP counters.
func (r *Runner) hostDrops(ctx context.Context) Counters {
	devs := []string{HostVeth, HostPort}
	for _, vm := range r.Lab.VMs {
		devs = append(devs, vm.Tap)
	}
	script := "for d in " + strings.Join(devs, " ") + `; do for k in tx_dropped rx_dropped; do
echo "$d.$k:$(cat /sys/class/net/$d/statistics/$k)"; done; done; grep '^Udp:' /proc/net/snmp`
	s, _ := nsh(ctx, "sh", "-c", script)
	c := ParseHWCounters(s)
	for k, v := range ParseSNMP(s) {
		c[k] = v
	}
	return c
}

// kernelLog returns the guest's kernel messages after line `from` that concern RDMA.
func (r *Runner) kernelLog(ctx context.Context, vm *VM, from uint64) string {
	s, _ := r.Lab.Guest(ctx, vm, fmt.Sprintf("dmesg | tail -n +%d | grep -iE 'rxe|icrc|infiniband|rdma' | tail -5", from+1), 10*time.Second)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " | ")), " ")
}

func (r *Runner) saveLogs(res *Result) {
	if r.LogDir == "" {
		return
	}
	w := func(name, cmd, out string) {
		_ = os.WriteFile(res.LogPrefix+"."+name+".txt", []byte("# "+cmd+"\n"+out), 0o644)
	}
	w("server", res.ServerCmd, res.ServerOut)
	w("client", res.ClientCmd, res.ClientOut)
}

// judgeRxedCounters reads the counters an rxed process wrote to file
// (--counters-out) and judges them (CheckRxedCounters): problems fail the
// cell as who's, notes go to the result. ok is false when the file could
// not be read or parsed (failed too).
func (r *Runner) judgeRxedCounters(res *Result, who, file string, loss bool, fail func(string, ...any)) (Counters, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		fail("%s: rxed counters: %v", who, err)
		return nil, false
	}
	cs, err := ParseRxedCounters(b)
	if err != nil {
		fail("%s: %v", who, err)
		return nil, false
	}
	p, n := CheckRxedCounters(cs, loss, r.Strict, 0)
	for _, x := range p {
		fail("%s: %s", who, x)
	}
	for _, x := range n {
		res.Notes = append(res.Notes, who+": "+x)
	}
	return cs, true
}

// judgeGuest takes the first guest's counters after a run without loss
// and judges them against before (CheckRxeCounters) with its kernel log;
// false when the counters could not be read (failed).
func (r *Runner) judgeGuest(ctx context.Context, res *Result, before []snap, fail func(string, ...any)) bool {
	after, err := r.snapshot(ctx)
	if err != nil {
		fail("counters after: %v", err)
		return false
	}
	res.PeerDelta = Delta(before[0].hw, after[0].hw)
	p, n := CheckRxeCounters(res.PeerDelta, false, r.Strict)
	for _, x := range p {
		fail("guest rxe0 %s", x)
	}
	for _, x := range n {
		res.Notes = append(res.Notes, "guest rxe0 "+x)
	}
	if after[0].dmesg > before[0].dmesg {
		if lines := r.kernelLog(ctx, r.Lab.VMs[0], before[0].dmesg); lines != "" {
			fail("vm1 kernel log: %s", lines)
		}
	}
	return true
}
