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

// judgeTOS judges a TOS run's captures (CheckTOS) both ways: the wire's and each of rxed's. Every finding goes to the notes (RESULTS.md keeps them), pass
// or fail: they are what the kernel did with the TOS.
func (r *Runner) judgeTOS(ctx context.Context, res *Result, wire string, rxedPcaps []string, subjAddr, peerAddr string,
	fail func(string, ...any)) {
	w := TOSWantOf(res.Cell)
	subj := "rxed"
	if r.Subject == SubjectRxe {
		subj = "guest2"
	}
	w.Names = map[string]string{subjAddr: subj, peerAddr: "guest"}
	judge := func(label, path string) {
		ps, err := readWire(ctx, path)
		if err != nil {
			fail("%s: %v", label, err)
			return
		}
		problems, findings, notes := CheckTOS(ps, w)
		for _, p := range problems {
			fail("%s (%s): %s", label, path, p)
		}
		for _, f := range append(findings, notes...) {
			res.Notes = append(res.Notes, label+": "+f)
		}
	}
	judge("wire", wire)
	// rxed's own capture, judged whole: its recorder has the socket report
	// received TOS and TTL for the whole capture, so the kernel's packets
	// show what they arrived with there too (they showed TOS 0 until the
	// recorder asked, session AJ), a second reading of the wire by rxed.
	for _, p := range rxedPcaps {
		judge("rxed's capture", p)
	}
}
