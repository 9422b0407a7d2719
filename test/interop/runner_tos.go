//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// wireCapture is dumpcap recording the RoCEv2 traffic (UDP 4791) of the peer guest's tap
// inside the lab's namespace for one TOS run (matrix_tos.go): what the kernel really sent and
// received, which rxed's own capture cannot show for received RC traffic. The peer's tap
// carries both rxed's traffic with it and, in rxe mode, the second guest's.
type wireCapture struct {
	cmd  *exec.Cmd
	file string
	out  *syncBuf
	done chan struct{}
}

// startWire starts the capture on iface and returns once dumpcap says it is capturing.
func startWire(ctx context.Context, iface, file string) (*wireCapture, error) {
	dumpcap, err := exec.LookPath("dumpcap")
	if err != nil {
		return nil, fmt.Errorf("dumpcap not installed (apt-get install tshark)")
	}
	_ = os.Remove(file)
	w := &wireCapture{file: file, out: &syncBuf{}, done: make(chan struct{})}
	// -P: pcap, as rxed's captures; no -q, so it says "Capturing on" once it captures
	w.cmd = exec.CommandContext(ctx, "ip", "netns", "exec", Netns, dumpcap, "-i", iface, "-f", "udp port 4791", "-P", "-w", file)
	w.cmd.SysProcAttr = childAttr()
	w.cmd.Stdout, w.cmd.Stderr = w.out, w.out
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = w.cmd.Wait(); close(w.done) }()
	deadline := time.After(20 * time.Second)
	for !strings.Contains(w.out.String(), "Capturing on") {
		select {
		case <-w.done:
			return nil, fmt.Errorf("dumpcap exited: %s", strings.TrimSpace(w.out.String()))
		case <-deadline:
			w.stop()
			return nil, fmt.Errorf("dumpcap did not start capturing within 20s: %s", strings.TrimSpace(w.out.String()))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return w, nil
}

// stop ends the capture (SIGINT: dumpcap writes what it holds and exits) and waits for it.
func (w *wireCapture) stop() {
	select {
	case <-w.done:
		return
	default:
	}
	_ = w.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
	}
}

// readWire reads a capture's RoCEv2 packets with tshark (WireFields).
func readWire(ctx context.Context, pcap string) ([]WirePacket, error) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		return nil, fmt.Errorf("tshark not installed")
	}
	args := []string{"-r", pcap, "-T", "fields", "-E", "occurrence=f"}
	for _, f := range WireFields {
		args = append(args, "-e", f)
	}
	out, err := exec.CommandContext(ctx, tshark, args...).Output()
	if err != nil {
		return nil, fmt.Errorf("tshark -r %s: %v", pcap, err)
	}
	return ParseWire(string(out)), nil
}

// judgeTOS judges a TOS run's captures (CheckTOS): the wire's both ways, and each of rxed's
// for the packets rxed sent. Every finding goes to the notes (RESULTS.md keeps them), pass
// or fail: they are what the kernel did with the TOS.
func (r *Runner) judgeTOS(ctx context.Context, res *Result, wire string, rxedPcaps []string, subjAddr, peerAddr string,
	fail func(string, ...any)) {
	w := TOSWantOf(res.Cell)
	subj := "rxed"
	if r.Subject == SubjectRxe {
		subj = "guest2"
	}
	w.Names = map[string]string{subjAddr: subj, peerAddr: "guest"}
	ps, err := readWire(ctx, wire)
	if err != nil {
		fail("wire capture: %v", err)
		return
	}
	problems, findings, notes := CheckTOS(ps, w)
	for _, p := range problems {
		fail("wire (%s): %s", wire, p)
	}
	for _, f := range findings {
		res.Notes = append(res.Notes, "wire: "+f)
	}
	for _, n := range notes {
		res.Notes = append(res.Notes, "wire: "+n)
	}
	// rxed's own capture: judged for what rxed sent; what it recorded of the received
	// packets is summarised only (see matrix_tos.go)
	w.JudgeFrom = subjAddr
	for _, p := range rxedPcaps {
		ps, err := readWire(ctx, p)
		if err != nil {
			fail("rxed's capture: %v", err)
			continue
		}
		problems, findings, _ := CheckTOS(ps, w)
		for _, x := range problems {
			fail("rxed's capture (%s): %s", p, x)
		}
		for _, f := range findings {
			res.Notes = append(res.Notes, "rxed's capture: "+f)
		}
	}
}
