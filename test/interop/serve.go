//go:build linux

package interop

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// perftestCycleBuffer is perftest's cycle_buffer (the page size): bandwidth tests with messages
// of at most half of it walk the remote address through its first cycle_buffer bytes in
// cache-line steps (ib_atomic_bw's 8-byte atomics always do), larger messages all land at the
// start of the region.
const perftestCycleBuffer = 4096

// ServeExportSize is the size of the file a Serve cell exports: the part perftest targets and as
// much again behind it, which must stay untouched.
func ServeExportSize(c Cell) int { return 2*max(c.Size, perftestCycleBuffer) + perftestCycleBuffer }

// PrefillByte is the known content the export starts with. No byte is 0 (so no 8-byte word is
// 0, the compare value of perftest's CMP_AND_SWAP), and the pattern does not repeat at the
// cache-line or page strides perftest writes at.
func PrefillByte(i int) byte { return byte(0x80 | (i*37+i>>7)&0x7f) }

// Prefill returns n bytes of PrefillByte.
func Prefill(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = PrefillByte(i)
	}
	return b
}

// CheckServeData judges the export after `runs` clients of Serve cell c ran against it, from its
// content before (Prefill) and after. What perftest does to the server's buffer (4.5 and
// the guest's perftest, exchange version 6.06, alike):
//
//   - ib_read_bw only reads: nothing may change.
//   - ib_write_bw writes its own buffer (rand() bytes, seeded by the time: unknowable), so the
//     target region must have changed almost everywhere and nothing behind it.
//   - ib_atomic_bw FETCH_AND_ADD adds 1 (ATOMIC_ADD_VALUE) per operation to 8-byte words in the
//     first cycle_buffer bytes: the words' increments must sum to exactly runs*iterations (a
//     duplicate request executed twice, or a lost one, shows). Little-endian: both ends are x86.
//   - ib_atomic_bw CMP_AND_SWAP compares with 0 and swaps in 0 (ATOMIC_SWAP_VALUE): no word of
//     the prefill is 0, so every compare fails and nothing may change.
func CheckServeData(c Cell, runs int, before, after []byte) []string {
	if len(after) != len(before) {
		return []string{fmt.Sprintf("export: %d bytes after the run, want %d", len(after), len(before))}
	}
	var problems []string
	changedOutside := func(from int) {
		for i := from; i < len(after); i++ {
			if after[i] != before[i] {
				problems = append(problems, fmt.Sprintf("export: byte %d changed (%#02x→%#02x), outside the region perftest targets [0, %d)",
					i, before[i], after[i], from))
				return
			}
		}
	}
	switch {
	case c.Tool == "read_bw":
		changedOutside(0)
	case c.Tool == "write_bw":
		target := max(c.Size, perftestCycleBuffer)
		changedOutside(target)
		if c.Size > perftestCycleBuffer/2 {
			same := 0
			for i := range c.Size {
				if after[i] == before[i] {
					same++
				}
			}
			// random bytes match the prefill in 1/256 of the places
			if same > c.Size/20 {
				problems = append(problems, fmt.Sprintf("export: %d of the %d written bytes still hold the prefill (a WRITE did not land)", same, c.Size))
			}
		}
	case c.Tool == "atomic_bw" && strings.Contains(c.Args, "CMP_AND_SWAP"):
		changedOutside(0)
	case c.Tool == "atomic_bw":
		changedOutside(perftestCycleBuffer)
		want := uint64(runs * c.Iters)
		var sum uint64
		for off := 0; off+8 <= perftestCycleBuffer; off += 8 {
			d := binary.LittleEndian.Uint64(after[off:]) - binary.LittleEndian.Uint64(before[off:])
			if d > want {
				problems = append(problems, fmt.Sprintf("export: the word at %d moved by %#x, more than the %d adds of the run", off, d, want))
				return problems
			}
			sum += d
		}
		if sum != want {
			problems = append(problems, fmt.Sprintf("export: the FETCH_AND_ADD targets grew by %d in all, want %d (%d clients x %d adds of 1)", sum, want, runs, c.Iters))
		}
	default:
		problems = append(problems, "export: no data check for tool "+c.Tool)
	}
	return problems
}

func (r *Runner) nextPort() int {
	r.port++
	if r.port < 20000 {
		r.port = 20000
	}
	return r.port
}

// runServe runs a Serve cell: rxed serve exporting a pre-filled file, ServeClients runs of the
// rxe perftest client in a row against it, then SIGTERM, after which rxed must exit 0 having
// written its counters. Judged as Run judges (exit statuses, output, both sides' counters,
// delivery accounting) plus the daemon's log and the exported file's content.
func (r *Runner) runServe(ctx context.Context, c Cell) (res Result) {
	t0 := time.Now()
	res = Result{Cell: c, Dir: SubjectServer}
	port := r.nextPort()
	tool := Tools[c.Tool]
	res.LogPrefix = filepath.Join(r.LogDir, slug(c.Name)+"."+SubjectServer.Short())
	fail := func(format string, a ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, a...)) }
	defer func() {
		res.Elapsed = time.Since(t0)
		res.Pass = len(res.Problems) == 0
		r.saveLogs(&res)
	}()
	peer := r.peer()
	tcpAddr, roceAddr := r.subjectAddrs(c)
	export, counters := res.LogPrefix+".export.img", res.LogPrefix+".counters.json"
	_ = os.Remove(counters)
	pre := Prefill(ServeExportSize(c))
	if err := os.WriteFile(export, pre, 0o644); err != nil {
		fail("export file: %v", err)
		return res
	}
	serveCmd := ServeRxed
	if IsRDMACMPerf(c) {
		serveCmd = ServeRxedRDMACM
	}
	srv := end{counters: counters, cmdline: Render(serveCmd, c, Vars{Rxed: r.Rxed, Addr: roceAddr, Port: port, Counters: counters, Export: export})}
	cli := end{vm: peer, cmdline: Render(tool.Rxe, c, Vars{GID: gidOf(peer, c), Port: port}) + " " + tcpAddr}
	res.ServerCmd = srv.cmdline
	res.ClientCmd = fmt.Sprintf("%s (%d times)", cli.cmdline, ServeClients)

	before, err := r.snapshot(ctx)
	if err != nil {
		fail("counters before: %v", err)
		return res
	}
	hostBefore := r.hostDrops(ctx)
	life := time.Duration(ServeClients)*c.Timeout + 20*time.Second
	cctx, cancel := context.WithTimeout(ctx, life+10*time.Second)
	defer cancel()
	sp, err := r.start(cctx, srv, life)
	if err != nil {
		fail("daemon did not start: %v", err)
		return res
	}
	defer stopProc(sp)
	if err := r.waitServerListen(cctx, c, srv, sp, port); err != nil {
		fail("daemon: %v", err)
		res.ServerOut = sp.out.String()
		return res
	}
	var outs, metrics []string
	clientsOK := 0
	for i := 1; i <= ServeClients; i++ {
		cp, err := r.start(cctx, cli, c.Timeout)
		if err != nil {
			fail("client %d did not start: %v", i, err)
			break
		}
		select {
		case <-cp.done:
		case <-sp.done:
			select { // the daemon died: the client cannot finish
			case <-cp.done:
			case <-time.After(5 * time.Second):
			}
		case <-cctx.Done():
		}
		stopProc(cp)
		out, st := cp.out.String(), cp.exitStatus()
		outs = append(outs, fmt.Sprintf("## client %d: %s\n%s", i, st, out))
		if st != "exit 0" {
			fail("client %d: %s", i, st)
		} else {
			clientsOK++
		}
		if row, ok := ParsePerf(out); !ok {
			fail("client %d printed no perftest result table", i)
		} else {
			metrics = append(metrics, row.Metric(tool.Kind))
		}
		if sp.exited() {
			fail("daemon exited after client %d (%s)", i, sp.exitStatus())
			break
		}
		if len(res.Problems) > 0 {
			break
		}
	}
	// SIGTERM (through `timeout`, which passes it on): the daemon drains, writes its counters
	// and exits 0.
	if !sp.exited() {
		_ = sp.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-sp.done:
		case <-time.After(15 * time.Second):
			fail("daemon still running 15s after SIGTERM")
		}
	}
	if st := sp.exitStatus(); st != "exit 0" {
		fail("daemon after SIGTERM: %s", st)
	}
	stopProc(sp)
	res.ServerOut, res.ClientOut = sp.out.String(), strings.Join(outs, "\n")
	res.Metric = strings.Join(metrics, " / ")
	for _, o := range []struct{ name, out string }{{"client", res.ClientOut}, {"daemon", res.ServerOut}} {
		if m := badOutput.FindString(o.out); m != "" {
			fail("%s output: %q", o.name, strings.TrimSpace(m))
		}
	}
	if n := strings.Count(res.ServerOut, `msg="perftest client done"`); n != ServeClients && len(res.Problems) == 0 {
		fail("daemon logged %d finished perftest sessions, want %d", n, ServeClients)
	}
	for _, l := range strings.Split(res.ServerOut, "\n") {
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
			fail("daemon log: %s", strings.TrimSpace(l))
		}
	}
	r.judgeCounters(ctx, &res, before, hostBefore, counters, fail)
	if after, err := os.ReadFile(export); err != nil {
		fail("export: %v", err)
	} else if clientsOK == ServeClients { // after a failed client, what it did is unknown

		for _, p := range CheckServeData(c, ServeClients, pre, after) {
			fail("%s", p)
		}
	}
	return res
}
