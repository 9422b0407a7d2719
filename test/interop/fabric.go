//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rxed/rxed/internal/netns"
)

// The fabric cells put rxed hosts and the rdma_rxe guest in one fabric: FabricHosts network
// namespaces of their own (rxedfab1..5, as test/fabric's hosts, made with internal/netns), each
// joined by a veth to the lab's bridge rxedbr0 with 10.78.0.(100+i)/24, one rxed process per
// host and tool. In every cell several runs go on at once on the bridge: the guest's tool
// against several rxed hosts (the guest serving them all, or being their client), and rxed
// hosts against each other. Every run is judged as a matrix run is (exit status, output,
// data, rxed's counters), and the guest's rxe counters and kernel log over the whole cell.

// FabricHosts is the number of rxed host namespaces of the fabric cells.
const FabricHosts = 5

// FabricHost is one rxed host of the fabric: a namespace with eth0 on the lab's bridge.
type FabricHost struct {
	Index int // 1-based
	NS    *netns.NS
	IP    string
}

func (h *FabricHost) name() string { return fmt.Sprintf("h%d", h.Index) }

// fabricIP is host i's address (1-based).
func fabricIP(i int) string { return fmt.Sprintf("%s.%d", netPrefix, 100+i) }

// AddFabricHosts creates the fabric's host namespaces on the lab's bridge (link MTU 1500:
// rxed and rxe at active MTU 1024). DeleteFabricHosts removes them.
func (l *Lab) AddFabricHosts(ctx context.Context, n int) ([]*FabricHost, error) {
	if why := netns.Available(); why != "" {
		return nil, fmt.Errorf("fabric hosts: %s", why)
	}
	if err := l.SetMTU(ctx, 1500); err != nil {
		return nil, err
	}
	var hs []*FabricHost
	for i := 1; i <= n; i++ {
		ns, err := netns.Create(fmt.Sprintf("rxedfab%d", i))
		if err != nil {
			DeleteFabricHosts(hs)
			return nil, err
		}
		h := &FabricHost{Index: i, NS: ns, IP: fabricIP(i)}
		hs = append(hs, h)
		port := fmt.Sprintf("rxedfv%d", i) // the bridge port, in the lab's namespace
		steps := [][]string{
			{"ip", "-n", Netns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns.Name},
			{"ip", "-n", Netns, "link", "set", port, "addrgenmode", "none"},
			{"ip", "-n", Netns, "link", "set", port, "master", Bridge, "up"},
			{"ip", "-n", ns.Name, "addr", "add", h.IP + "/24", "dev", "eth0"},
			{"ip", "-n", ns.Name, "link", "set", "eth0", "up"},
			{"ip", "-n", ns.Name, "route", "add", "224.0.0.0/4", "dev", "eth0"},
		}
		for _, s := range steps {
			if _, err := sh(ctx, s[0], s[1:]...); err != nil {
				DeleteFabricHosts(hs)
				return nil, err
			}
		}
	}
	l.logf("fabric: %d rxed hosts rxedfab1..%d on %s, %s..%s", n, n, Bridge, fabricIP(1), fabricIP(n))
	return hs, nil
}

// DeleteFabricHosts deletes the hosts' namespaces (their veths go with them).
func DeleteFabricHosts(hs []*FabricHost) {
	for _, h := range hs {
		_ = h.NS.Delete()
	}
}

// FabricCells are the fabric cells (run by RunFabric, rxed subject only).
func FabricCells() []Cell {
	c := func(name, tool string, size, iters int) Cell {
		return Cell{Name: name, Tool: tool, Size: size, Iters: iters, MTU: 1024, Timeout: 120 * time.Second}
	}
	return []Cell{
		c("fabric/rc_pingpong/rxe-3rxed+rxed-rxed", "rc_pingpong", 4096, 20),
		c("fabric/write_bw/rxe-2rxed+rxed-rxe+rxed-rxed", "write_bw", 65536, 50),
		c("fabric/rping/rxe-2rxed+rxed-rxe+rxed-rxed", "rping", 64, 10),
		c("fabric/mckey/rxe-to-5rxed", "mckey", 100, 5),
	}
}

// fabricRun is one process of a fabric cell: a tool on the guest (host nil) or rxed on a
// fabric host.
type fabricRun struct {
	who      string // "h1 client", "rxe server for h2"
	host     *FabricHost
	cmdline  string
	server   bool
	port     int    // TCP exchange or rdma_cm port (servers)
	ready    string // a line the server prints once ready (rxed rping -d, mckey); "" for a TCP listen
	counters string
	p        *proc
}

// fabricPair is a server and its client.
type fabricPair struct{ srv, cli *fabricRun }

// RunFabric adds the fabric hosts to the lab, runs the cells and removes the hosts.
func (r *Runner) RunFabric(ctx context.Context, cells []Cell) []Result {
	if len(cells) == 0 || r.Subject != SubjectRxed {
		return nil
	}
	hs, err := r.Lab.AddFabricHosts(ctx, FabricHosts)
	if err != nil {
		var out []Result
		for _, c := range cells {
			out = append(out, Result{Cell: c, Dir: SubjectServer, Problems: []string{"fabric hosts: " + err.Error()}})
		}
		return out
	}
	defer DeleteFabricHosts(hs)
	var out []Result
	for _, c := range cells {
		if ctx.Err() != nil {
			break
		}
		out = append(out, r.runFabricCell(ctx, c, hs))
	}
	return out
}

// plan builds cell c's runs on hosts hs. Pairs: the guest serving hosts 1..k (k = 3 for
// pingpong, else 2), host 4 serving the guest (write_bw, rping), host 3 (or 4) serving host 5.
// mckey: the guest sends, every host receives.
func (r *Runner) fabricPlan(c Cell, hs []*FabricHost, logPrefix string) (pairs []fabricPair, mcast []*fabricRun) {
	vm := r.peer()
	rxedEnd := func(h *FabricHost, role string, tmpl func(counters string) string) *fabricRun {
		f := fmt.Sprintf("%s.%s-%s.counters.json", logPrefix, h.name(), role)
		_ = os.Remove(f)
		return &fabricRun{who: h.name() + " rxed " + role, host: h, cmdline: tmpl(f), counters: f}
	}
	switch c.Tool {
	case "rc_pingpong", "write_bw":
		tool := Tools[c.Tool]
		pair := func(srv, cli *FabricHost) fabricPair {
			port := r.nextPort()
			var s, k *fabricRun
			srvIP := vm.IP
			if srv == nil {
				s = &fabricRun{who: "rxe server for " + cli.name(), cmdline: Render(tool.Rxe, c, Vars{GID: vm.GID4, Port: port})}
			} else {
				srvIP = srv.IP
				s = rxedEnd(srv, "server", func(f string) string {
					return Render(tool.Rxed, c, Vars{Rxed: r.Rxed, Addr: srv.IP, Port: port, Counters: f})
				})
			}
			if cli == nil {
				k = &fabricRun{who: "rxe client of " + srv.name(), cmdline: Render(tool.Rxe, c, Vars{GID: vm.GID4, Port: port})}
			} else {
				k = rxedEnd(cli, "client", func(f string) string {
					return Render(tool.Rxed, c, Vars{Rxed: r.Rxed, Addr: cli.IP, Port: port, Counters: f})
				})
			}
			s.server, s.port = true, port
			k.cmdline += " " + srvIP
			return fabricPair{s, k}
		}
		if c.Tool == "rc_pingpong" {
			return []fabricPair{pair(nil, hs[0]), pair(nil, hs[1]), pair(nil, hs[2]), pair(hs[3], hs[4])}, nil
		}
		return []fabricPair{pair(nil, hs[0]), pair(nil, hs[1]), pair(hs[3], nil), pair(hs[2], hs[4])}, nil
	case "rping":
		spec := rpingSpec(c.Iters, c.Size, true, true, []CMStep{{}})
		pair := func(srv, cli *FabricHost) fabricPair {
			port := r.nextPort()
			v := func(addr, srvAddr string) CMVars {
				return CMVars{Rxed: r.Rxed, Addr: addr, SrvAddr: srvAddr, Port: port}
			}
			var s, k *fabricRun
			srvIP := vm.IP
			if srv == nil {
				s = &fabricRun{who: "rxe server for " + cli.name(), cmdline: RenderCM(spec.RxeServer, v(vm.IP, vm.IP))}
			} else {
				srvIP = srv.IP
				s = rxedEnd(srv, "server", func(f string) string {
					vs := v(srv.IP, srv.IP)
					vs.Counters, vs.Pcap = f, strings.TrimSuffix(f, ".counters.json")+".pcap"
					return RenderCM(spec.RxedServer, vs)
				})
				s.ready = cmReadyLine(Rping)
			}
			if cli == nil {
				k = &fabricRun{who: "rxe client of " + srv.name(), cmdline: RenderCM(spec.RxeClient, v(vm.IP, srvIP))}
			} else {
				k = rxedEnd(cli, "client", func(f string) string {
					vs := v(cli.IP, srvIP)
					vs.Counters, vs.Pcap = f, strings.TrimSuffix(f, ".counters.json")+".pcap"
					return RenderCM(spec.RxedClient, vs)
				})
			}
			s.server, s.port = true, port
			return fabricPair{s, k}
		}
		return []fabricPair{pair(nil, hs[0]), pair(nil, hs[1]), pair(hs[3], nil), pair(hs[2], hs[4])}, nil
	case "mckey":
		spec := McastCells()[0].Mcast // the group, count, size and lines of the mckey cells
		for _, h := range hs {
			run := rxedEnd(h, "receiver", func(f string) string {
				return RenderMcast(McastCells()[0].Mcast.Members[0].Cmd, McastVars{Rxed: r.Rxed, Addr: h.IP, Group: spec.Group,
					Counters: f, Pcap: strings.TrimSuffix(f, ".counters.json") + ".pcap"})
			})
			run.ready = spec.Ready
			mcast = append(mcast, run)
		}
		send := McastCells()[0].Mcast.Members[1].Cmd // the guest's sender
		mcast = append(mcast, &fabricRun{who: "rxe sender", cmdline: "stdbuf -oL " + RenderMcast(send, McastVars{Addr: vm.IP, Group: spec.Group})})
		return nil, mcast
	}
	return nil, nil
}

func (r *Runner) startFabric(ctx context.Context, f *fabricRun, timeout time.Duration) error {
	var err error
	if f.host == nil {
		f.p, err = r.start(ctx, end{vm: r.peer(), cmdline: f.cmdline}, timeout)
		return err
	}
	argv := append([]string{"timeout", strconv.Itoa(int(timeout.Seconds()))}, strings.Fields(f.cmdline)...)
	cmd := f.host.NS.Command(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = 2 * time.Second
	f.p, err = startProc(cmd)
	return err
}

// waitFabricReady waits until a server can take its client: a TCP listener on its port (the
// tools' exchange), an rdma_cm listener (the guest's rping), or its ready line (rxed rping -d,
// mckey's "joined").
func (r *Runner) waitFabricReady(ctx context.Context, c Cell, f *fabricRun) error {
	switch {
	case f.host == nil && c.Tool == "rping":
		return r.waitCMListen(ctx, end{vm: r.peer()}, f.p, f.port, "")
	case f.host == nil:
		return r.waitListen(ctx, end{vm: r.peer()}, f.p, f.port)
	case f.ready != "":
		return waitLine(ctx, f.p, f.ready, 60*time.Second)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		out, err := sh(ctx, "ip", "netns", "exec", f.host.NS.Name, "ss", "-ltnH", fmt.Sprintf("sport = :%d", f.port))
		if err == nil && strings.Contains(out, "LISTEN") {
			return nil
		}
		if f.p.exited() {
			return fmt.Errorf("exited before listening (%s)", f.p.exitStatus())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
	return fmt.Errorf("not listening on TCP %d after 60s", f.port)
}

// runFabricCell starts every server (each must be ready), then every client at once, waits
// for all, and judges each run and the guest's counters over the cell.
func (r *Runner) runFabricCell(ctx context.Context, c Cell, hs []*FabricHost) (res Result) {
	t0 := time.Now()
	res = Result{Cell: c, Dir: SubjectServer, LogPrefix: filepath.Join(r.LogDir, slug(c.Name))}
	fail := func(format string, a ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, a...)) }
	pairs, mcast := r.fabricPlan(c, hs, res.LogPrefix)
	var all, first, second []*fabricRun
	for _, p := range pairs {
		first, second = append(first, p.srv), append(second, p.cli)
	}
	for _, m := range mcast { // receivers first, the sender last
		if m.host != nil {
			first = append(first, m)
		} else {
			second = append(second, m)
		}
	}
	all = append(append(all, first...), second...)
	defer func() {
		for _, f := range all {
			stopProc(f.p)
		}
		var srv, cli []string
		for _, f := range first {
			srv = append(srv, fmt.Sprintf("## %s: %s\n", f.who, f.cmdline)+procOut(f.p))
		}
		for _, f := range second {
			cli = append(cli, fmt.Sprintf("## %s: %s\n", f.who, f.cmdline)+procOut(f.p))
		}
		res.ServerCmd, res.ClientCmd = fmt.Sprintf("%d processes", len(first)), fmt.Sprintf("%d processes", len(second))
		res.ServerOut, res.ClientOut = strings.Join(srv, "\n"), strings.Join(cli, "\n")
		res.Elapsed = time.Since(t0)
		res.Pass = len(res.Problems) == 0
		r.saveLogs(&res)
	}()
	if c.Tool == "mckey" {
		if out, err := r.Lab.Guest(ctx, r.peer(), "ip route replace 224.0.0.0/4 dev eth0", 10*time.Second); err != nil {
			fail("guest multicast route: %v: %s", err, out)
			return res
		}
	}
	before, err := r.snapshot(ctx)
	if err != nil {
		fail("counters before: %v", err)
		return res
	}
	cctx, cancel := context.WithTimeout(ctx, c.Timeout+30*time.Second)
	defer cancel()
	for _, f := range first {
		if err := r.startFabric(cctx, f, c.Timeout); err != nil {
			fail("%s did not start: %v", f.who, err)
			return res
		}
	}
	for _, f := range first {
		if err := r.waitFabricReady(cctx, c, f); err != nil {
			fail("%s: %v", f.who, err)
			return res
		}
	}
	for _, f := range second {
		if err := r.startFabric(cctx, f, c.Timeout); err != nil {
			fail("%s did not start: %v", f.who, err)
			return res
		}
	}
	for _, f := range all {
		select {
		case <-f.p.done:
		case <-cctx.Done():
		}
	}
	r.judgeFabric(ctx, &res, before, pairs, mcast, fail)
	return res
}

func procOut(p *proc) string {
	if p == nil {
		return "(not started)\n"
	}
	return p.exitStatus() + "\n" + p.out.String()
}

// judgeFabric judges every process (exit 0, its tool's output and data, rxed's counters) and
// the guest's counters and kernel log over the cell.
func (r *Runner) judgeFabric(ctx context.Context, res *Result, before []snap, pairs []fabricPair, mcast []*fabricRun, fail func(string, ...any)) {
	c := res.Cell
	var runs []*fabricRun
	for _, p := range pairs {
		runs = append(runs, p.srv, p.cli)
	}
	runs = append(runs, mcast...)
	var metrics []string
	rxedSent, rxedRcvd := uint64(0), uint64(0)
	for _, f := range runs {
		out := f.p.out.String()
		if st := f.p.exitStatus(); st != "exit 0" {
			fail("%s: %s", f.who, st)
		}
		if m := badOutput.FindString(out); m != "" {
			fail("%s output: %q", f.who, strings.TrimSpace(m))
		}
		switch c.Tool {
		case "rc_pingpong":
			pr, ok := ParsePingpong(out)
			if !ok {
				fail("%s printed no pingpong result", f.who)
			} else if pr.Iters != c.Iters {
				fail("%s: %d iterations, want %d", f.who, pr.Iters, c.Iters)
			} else if !f.server {
				metrics = append(metrics, f.who+": "+pr.Metric())
			}
		case "write_bw":
			if row, ok := ParsePerf(out); ok && !f.server {
				metrics = append(metrics, f.who+": "+row.Metric(PerfBW))
			} else if !ok && !f.server {
				fail("%s printed no perftest result table", f.who)
			}
		case "rping":
			for _, p := range CheckRpingPings(f.who, ParseRpingPings(out, f.server), 1, c.Iters, c.Size) {
				fail("%s", p)
			}
		case "mckey":
			spec := McastCells()[0].Mcast
			want := spec.ExpectReceiver
			if f.host == nil {
				want = spec.ExpectSender
			}
			if l := MissingLines(out, want); l != "" {
				fail("%s did not print %q", f.who, l)
			}
		}
		if f.counters == "" {
			continue
		}
		cs, ok := r.judgeRxedCounters(res, f.who, f.counters, false, fail)
		if !ok {
			continue
		}
		if c.Tool == "mckey" && cs["rcvd_pkts"] != uint64(c.Iters) {
			fail("%s: rcvd_pkts %d, want %d", f.who, cs["rcvd_pkts"], c.Iters)
		}
		rxedSent += cs["sent_pkts"]
		rxedRcvd += cs["rcvd_pkts"]
	}
	if !r.judgeGuest(ctx, res, before, fail) {
		return
	}
	if c.Tool == "mckey" && res.PeerDelta["sent_pkts"] < uint64(c.Iters) {
		fail("guest sender: rxe0 sent_pkts +%d, want at least %d", res.PeerDelta["sent_pkts"], c.Iters)
	}
	res.Subject = Counters{"sent_pkts": rxedSent, "rcvd_pkts": rxedRcvd}
	res.Metric = strings.Join(metrics, "; ")
	if res.Metric == "" {
		res.Metric = fmt.Sprintf("%d processes", len(runs))
	}
}

// FabricLine is a fabric result's progress line (as the matrix prints its runs).
func FabricLine(res Result) string {
	st := "PASS"
	if !res.Pass {
		st = "FAIL " + strings.Join(res.Problems, "; ")
	}
	if len(res.Notes) > 0 {
		st += " (" + strings.Join(res.Notes, ", ") + ")"
	}
	return fmt.Sprintf("%-28s fab %5.1fs %-30s %s", res.Cell.Name, res.Elapsed.Seconds(), res.Metric, st)
}
