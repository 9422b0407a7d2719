package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
)

func init() {
	register(&command{
		name:    "demo",
		summary: "two engines over loopback: RDMA WRITE, READ, SEND with immediate and atomics, verified",
		run:     runDemo,
	})
}

// demoPeer is one side of the demo: a device with an RC QP and a buffer.
type demoPeer struct {
	name string
	dev  *ib.Device
	pd   *ib.PD
	cq   *ib.CQ
	qp   *ib.QP
	buf  []byte
	mr   *ib.MR
	addr netip.Addr
}

const demoBufSize = 64 << 10

func openDemoPeer(name string, addr netip.Addr, cfg demoConfig, ephemeral bool, pcap io.Writer) (*demoPeer, error) {
	p, err := openDemoPeerDev(name, addr, cfg, ephemeral, pcap)
	if err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func openDemoPeerDev(name string, addr netip.Addr, cfg demoConfig, ephemeral bool, pcap io.Writer) (*demoPeer, error) {
	dev, err := ib.OpenDevice(ib.Config{Addrs: []netip.Addr{addr}, Port: cfg.port, EphemeralPort: ephemeral,
		Fault: cfg.fault, Pcap: pcap})
	if err != nil {
		port := uint(cfg.port)
		if ephemeral {
			port = 0
		}
		return nil, engineOpenError("engine "+name, addr.String(), port, err)
	}
	p := &demoPeer{name: name, dev: dev, addr: addr}
	if p.pd, err = dev.AllocPD(); err != nil {
		return p, err
	}
	if p.cq, err = dev.CreateCQ(64); err != nil {
		return p, err
	}
	p.buf = make([]byte, demoBufSize)
	if p.mr, err = p.pd.RegMR(p.buf, ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessRemoteRead|ib.AccessRemoteAtomic); err != nil {
		return p, err
	}
	p.qp, err = p.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: p.cq, RecvCQ: p.cq,
		Cap: ib.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	return p, err
}

// connectDemo moves p to RTS towards peer, like the out-of-band exchange
// of ibv_rc_pingpong would.
func (p *demoPeer) connect(peer *demoPeer) error {
	if err := p.qp.Modify(&ib.QPAttr{State: ib.QPSInit, PKeyIndex: 0, PortNum: 1,
		AccessFlags: ib.AccessRemoteWrite | ib.AccessRemoteRead | ib.AccessRemoteAtomic},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags); err != nil {
		return err
	}
	if err := p.qp.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU4096, DestQPN: peer.qp.Num(), RQPSN: 0x1000,
		MaxDestRdAtomic: 4, MinRNRTimer: 12,
		AV: ib.AddrVector{DGID: peer.addr, DestPort: peer.dev.UDPPort(), PortNum: 1}},
		ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer); err != nil {
		return err
	}
	return p.qp.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 0x1000, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4},
		ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic)
}

func (p *demoPeer) close() {
	if p != nil && p.dev != nil {
		p.dev.Close()
	}
}

// sync makes this goroutine's view of p's memory and p's engine's view of
// it agree, as far as Go's memory model (and the race detector) is
// concerned: a query is a round trip through the goroutine that owns p's
// QP. On the wire the ACK order already guarantees it, but the kernel's
// sockets are invisible to the race detector.
func (p *demoPeer) sync() { _, _, _ = p.qp.Query() }

// await waits for one completion of wrID and checks its status and opcode.
func (p *demoPeer) await(wrID uint64, want ib.WCOpcode) (ib.WC, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wcs [1]ib.WC
	n, err := p.cq.WaitPoll(ctx, wcs[:])
	if err != nil {
		return ib.WC{}, &demoStepError{fmt.Errorf("%s: no completion for wr %d: %w", p.name, wrID, err)}
	}
	wc := wcs[:n][0]
	if wc.Status != ib.WCSuccess {
		return wc, &demoStepError{fmt.Errorf("%s: wr %d completed with %s", p.name, wc.ID, wc.Status)}
	}
	if wc.ID != wrID || wc.Opcode != want {
		return wc, &demoCheckError{fmt.Sprintf("%s: got completion %v, want wr %d %s", p.name, wc.String(), wrID, want)}
	}
	return wc, nil
}

// demoConfig is what `rxed demo` takes from its flags.
type demoConfig struct {
	addrs []netip.Addr
	port  uint16
	fault *transport.FaultConfig
	pcap  io.Writer
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var addrs addrList
	fs.Var(&addrs, "addr", "local address of an engine (repeatable: first A, then B; default 127.0.0.1 and 127.0.0.2)")
	port := fs.Int("port", transport.RoCEv2Port, "UDP port of both engines (0: ephemeral; a busy 4791 falls back to ephemeral)")
	faultSpec := fs.String("fault", "", "inject faults into both engines: "+faultSpecHelp)
	pcapPath := fs.String("pcap", "", "record engine A's traffic to this pcap file")
	if _, code, ok := parseArgs(fs, args, stderr); !ok {
		return code // one line for a bad flag, usage and 0 for -h
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rxed demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg := demoConfig{addrs: addrs}
	if len(cfg.addrs) > 2 {
		fmt.Fprintln(stderr, "rxed demo: at most two --addr (engine A, engine B)")
		return 2
	}
	def := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}
	cfg.addrs = append(cfg.addrs, def[len(cfg.addrs):]...)
	if a, b := cfg.addrs[0].Unmap(), cfg.addrs[1].Unmap(); a.Is4() != b.Is4() {
		// The QPs' address vectors refuse it: it failed at connect.
		fmt.Fprintf(stderr, "rxed demo: --addr %v and %v: engines A and B need addresses of one family (two IPv4, or two IPv6 such as ::1 and another of lo's)\n", a, b)
		return 2
	}
	if *port < 0 || *port > 65535 {
		fmt.Fprintf(stderr, "rxed demo: --port %d: want 0..65535 (0: ephemeral ports)\n", *port)
		return 2
	}
	cfg.port = uint16(*port)
	if *faultSpec != "" {
		fc, err := transport.ParseFaultSpec(*faultSpec)
		if err != nil {
			fmt.Fprintf(stderr, "rxed demo: --fault: %v (want %s)\n", err, faultSpecHelp)
			return 2
		}
		cfg.fault = &fc
	}
	if *pcapPath != "" {
		f, err := os.Create(*pcapPath)
		if err != nil {
			return failHint(stderr, "demo", fmt.Errorf("--pcap: %w", err), pathHint(err, true))
		}
		defer f.Close()
		cfg.pcap = f
	}
	if err := demo(cfg, stdout); err != nil {
		return failHint(stderr, "demo", fmt.Errorf("FAILED: %w", err), demoNextStep(err, cfg.fault != nil))
	}
	fmt.Fprintln(stdout, "all checks passed")
	return 0
}

func demo(cfg demoConfig, out io.Writer) error {
	aAddr, bAddr := cfg.addrs[0], cfg.addrs[1]
	ephemeral := cfg.port == 0
	a, err := openDemoPeer("A", aAddr, cfg, ephemeral, cfg.pcap)
	var b *demoPeer
	if err == nil {
		b, err = openDemoPeer("B", bAddr, cfg, ephemeral, nil)
	}
	if err != nil && !ephemeral {
		// Port 4791 is taken (a kernel rdma_rxe or another rxed): use
		// ephemeral ports; the QPs are told each other's port.
		a.close()
		b.close()
		ephemeral = true
		if a, err = openDemoPeer("A", aAddr, cfg, true, cfg.pcap); err != nil {
			return err
		}
		if b, err = openDemoPeer("B", bAddr, cfg, true, nil); err != nil {
			a.close()
			return err
		}
	} else if err != nil {
		a.close()
		return err
	}
	defer a.close()
	defer b.close()
	fmt.Fprintf(out, "engine A on %v udp/%d, engine B on %v udp/%d%s\n", aAddr, a.dev.UDPPort(), bAddr, b.dev.UDPPort(),
		map[bool]string{true: " (4791 busy: ephemeral ports)", false: ""}[ephemeral])
	if err := a.connect(b); err != nil {
		return fmt.Errorf("connect A: %w", err)
	}
	if err := b.connect(a); err != nil {
		return fmt.Errorf("connect B: %w", err)
	}
	fmt.Fprintf(out, "RC QP %#x (A) <-> %#x (B), path MTU 4096\n", a.qp.Num(), b.qp.Num())
	fmt.Fprintf(out, "B registered %d bytes: addr %#x rkey %#x\n", len(b.buf), b.mr.IOVA(), b.mr.RKey())

	// 1. RDMA WRITE: 40000 bytes of a pattern from A into B.
	const wlen = 40000
	for i := 0; i < wlen; i++ {
		a.buf[i] = byte(i*31 + 7)
	}
	if err := a.qp.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: a.mr.IOVA(), Length: wlen, LKey: a.mr.LKey()}}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
		return err
	}
	if _, err := a.await(1, ib.WCRDMAWrite); err != nil {
		return err
	}
	b.sync()
	if !bytes.Equal(a.buf[:wlen], b.buf[:wlen]) {
		return &demoCheckError{"RDMA WRITE: B's memory does not hold the bytes A wrote"}
	}
	fmt.Fprintf(out, "RDMA WRITE   %6d bytes A -> B           verified: B's memory equals A's pattern\n", wlen)

	// 2. RDMA READ: B fills a region, A reads it into a different offset.
	const rlen, roff = 20000, 40960
	for i := 0; i < rlen; i++ {
		b.buf[roff+i] = byte(i*17 + 3)
	}
	b.sync()
	if err := a.qp.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
		SGL:        []ib.SGE{{Addr: a.mr.IOVA() + roff, Length: rlen, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.IOVA() + roff, RKey: b.mr.RKey()}); err != nil {
		return err
	}
	if _, err := a.await(2, ib.WCRDMARead); err != nil {
		return err
	}
	if !bytes.Equal(a.buf[roff:roff+rlen], b.buf[roff:roff+rlen]) {
		return &demoCheckError{"RDMA READ: A's buffer does not hold B's bytes"}
	}
	fmt.Fprintf(out, "RDMA READ    %6d bytes B -> A           verified: A's buffer equals B's pattern\n", rlen)

	// 3. SEND with immediate: B posts a receive, A sends a message.
	msg := []byte("hello from A over RoCEv2 (rxed)")
	const recvOff = 60000
	if err := b.qp.PostRecv(ib.RecvWR{ID: 30, SGL: []ib.SGE{{Addr: b.mr.IOVA() + recvOff, Length: 4096, LKey: b.mr.LKey()}}}); err != nil {
		return err
	}
	copy(a.buf[recvOff:], msg)
	const imm = 0xC0FFEE42
	if err := a.qp.PostSend(ib.SendWR{ID: 3, Opcode: ib.WRSendWithImm, Flags: ib.SendSignaled, Imm: imm,
		SGL: []ib.SGE{{Addr: a.mr.IOVA() + recvOff, Length: uint32(len(msg)), LKey: a.mr.LKey()}}}); err != nil {
		return err
	}
	if _, err := a.await(3, ib.WCSend); err != nil {
		return err
	}
	rwc, err := b.await(30, ib.WCRecv)
	if err != nil {
		return err
	}
	if rwc.Flags&ib.WCWithImm == 0 || rwc.Imm != imm || rwc.ByteLen != uint32(len(msg)) ||
		!bytes.Equal(b.buf[recvOff:recvOff+len(msg)], msg) {
		return &demoCheckError{fmt.Sprintf("SEND_WITH_IMM: B got %d bytes %q imm %#x flags %#x", rwc.ByteLen,
			b.buf[recvOff:recvOff+int(min(rwc.ByteLen, 64))], rwc.Imm, rwc.Flags)}
	}
	fmt.Fprintf(out, "SEND+IMM     %6d bytes A -> B           verified: %q, imm %#x\n", len(msg), msg, rwc.Imm)

	// 4. Atomics on an 8-byte counter in B's memory.
	const ctrOff, resOff = 64000, 64008
	binary.NativeEndian.PutUint64(b.buf[ctrOff:], 100)
	b.sync()
	if err := a.qp.PostSend(ib.SendWR{ID: 4, Opcode: ib.WRAtomicCmpAndSwp, Flags: ib.SendSignaled,
		CompareAdd: 100, Swap: 500, SGL: []ib.SGE{{Addr: a.mr.IOVA() + resOff, Length: 8, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.IOVA() + ctrOff, RKey: b.mr.RKey()}); err != nil {
		return err
	}
	if _, err := a.await(4, ib.WCCompSwap); err != nil {
		return err
	}
	b.sync()
	orig, now := binary.NativeEndian.Uint64(a.buf[resOff:]), binary.NativeEndian.Uint64(b.buf[ctrOff:])
	b.sync() // our read happens before B's next atomic on the counter
	if orig != 100 || now != 500 {
		return &demoCheckError{fmt.Sprintf("CMP_SWP: original %d (want 100), remote now %d (want 500)", orig, now)}
	}
	fmt.Fprintf(out, "CMP_SWP      compare 100 swap 500       verified: original 100, remote now %d\n", now)

	if err := a.qp.PostSend(ib.SendWR{ID: 5, Opcode: ib.WRAtomicFetchAndAdd, Flags: ib.SendSignaled,
		CompareAdd: 42, SGL: []ib.SGE{{Addr: a.mr.IOVA() + resOff, Length: 8, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.IOVA() + ctrOff, RKey: b.mr.RKey()}); err != nil {
		return err
	}
	if _, err := a.await(5, ib.WCFetchAdd); err != nil {
		return err
	}
	b.sync()
	orig, now = binary.NativeEndian.Uint64(a.buf[resOff:]), binary.NativeEndian.Uint64(b.buf[ctrOff:])
	if orig != 500 || now != 542 {
		return &demoCheckError{fmt.Sprintf("FETCH_ADD: original %d (want 500), remote now %d (want 542)", orig, now)}
	}
	fmt.Fprintf(out, "FETCH_ADD    add 42                     verified: original 500, remote now %d\n", now)

	ca, cb := a.dev.Counters(), b.dev.Counters()
	fmt.Fprintf(out, "counters: A sent_pkts=%d rcvd_pkts=%d; B sent_pkts=%d rcvd_pkts=%d\n",
		ca["sent_pkts"], ca["rcvd_pkts"], cb["sent_pkts"], cb["rcvd_pkts"])
	return nil
}
