package hostile

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// A world is a target device under attack and its real peer, each on the
// in-memory network of one address family, with:
//   - an RC QP on the target connected to the peer's RC QP, a UC QP
//     connected to the peer's UC QP and a UD QP attached to a multicast
//     group, each with receives posted;
//   - QP 1 answering for an rdma_cm listener that never accepts (a server
//     slow to accept: its requests wait in the backlog);
//   - regions: w (remote read, write and atomic: the one the peer uses),
//     ro (remote read only), loc (local only) and recv (the receives);
//   - attackers: the peer's own socket (peer:4791), the peer's address on
//     another port, and two strangers.
//
// Both engines and the CM run on fake clocks that never move, so nothing
// is sent but what a packet provokes: a world is deterministic up to the
// engines' goroutine scheduling, which the waits below do not depend on.
type world struct {
	tb  testing.TB
	net *transport.MemNetwork
	v6  bool

	tgtAddr, peerAddr, group, barrierAddr netip.Addr
	tgt, peer                             *ib.Device
	tgtTap, peerTap                       *tap

	// Sources, by the fuzzer's selector: srcs[0] is the peer's own
	// socket (through its tap, so its sends are the peer's).
	srcs [4]transport.Conn
	// The barrier: a REQ for a service nobody listens on, from its own
	// address, answered with a REJ after every MAD before it (barrier).
	barrier   transport.Conn
	barrierID uint32

	rc, uc, ud   *ib.QP
	tscq         *ib.CQ // the target RC QP's send completions
	tclock       *roce.FakeClock
	rdBuf        []byte // where the target's own READ lands
	prc, puc     *ib.QP
	pcq          *ib.CQ
	w, ro, loc   *ib.MR
	wBuf, roBuf  []byte
	locBuf       []byte
	peerBuf      []byte
	peerMR       *ib.MR
	unusedQPN    uint32
	listener     *rdmacm.Listener
	epsn         uint32 // the RC responder's ePSN (rqPSN)
	barriersSent uint64
}

const (
	tgtSQPSN  = 0x100000 // the target's first request PSN
	peerSQPSN = 0x200000 // the peer's: the target RC responder's first ePSN
	udQKey    = 0x11111111
	cmPort    = 7471 // ucmatose's port: the seeds' REQs from the captures hit the listener
	wLen      = 64 << 10
	smallLen  = 4 << 10
	recvSlot  = 40 + 4096 + 256
	recvDepth = 16
	// legitOff is where the peer's own WRITE/READ lands in w.
	legitOff = 0x8000
	legitLen = 512
	// The target's own WRITE and READ of reqLen bytes at reqOff in the
	// peer's memory: reqWindow PSNs at path MTU 1024.
	reqOff    = 0x4000
	reqLen    = 2048
	reqWindow = 4
)

var (
	wFill   = byte(0xA5)
	roFill  = byte(0x5A)
	locFill = byte(0x3C)
)

// newWorld builds a world of one address family.
func newWorld(tb testing.TB, v6 bool) *world {
	tb.Helper()
	w := &world{tb: tb, net: transport.NewMemNetwork(), v6: v6}
	if v6 {
		w.tgtAddr, w.peerAddr = netip.MustParseAddr("fd00:9::1"), netip.MustParseAddr("fd00:9::2")
		w.group, w.barrierAddr = netip.MustParseAddr("ff0e::9:9"), netip.MustParseAddr("fd00:9::99")
	} else {
		w.tgtAddr, w.peerAddr = netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
		w.group, w.barrierAddr = netip.MustParseAddr("239.9.9.9"), netip.MustParseAddr("10.9.0.99")
	}
	stranger := func(i byte) netip.Addr {
		if v6 {
			return netip.AddrFrom16([16]byte{0xfd, 0, 0, 9, 15: 0x60 + i})
		}
		return netip.AddrFrom4([4]byte{10, 9, 0, 0x60 + i})
	}
	start := time.Unix(1_700_000_000, 0)
	open := func(a netip.Addr, workers int, clk *roce.FakeClock) (*ib.Device, *tap) {
		c, err := w.net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
		must(tb, err)
		var tp *tap
		dev, err := ib.OpenDevice(ib.Config{Conn: c, Workers: workers, IBATimerOnly: true,
			Clock: clk,
			Wrap: func(c transport.Conn) (transport.Conn, error) {
				tp = &tap{Conn: c}
				return tp, nil
			}})
		must(tb, err)
		tb.Cleanup(func() { _ = dev.Close() })
		must(tb, rdmacm.Enable(dev, &rdmacm.Config{Clock: cmtest.NewFakeClock(start)}))
		return dev, tp
	}
	// One worker each: datagrams are handled in arrival order, a
	// multicast datagram whole (its copy to the attached QP included),
	// which settle's markers rely on.
	w.tclock = roce.NewFakeClock(start)
	w.tgt, w.tgtTap = open(w.tgtAddr, 1, w.tclock)
	w.peer, w.peerTap = open(w.peerAddr, 1, roce.NewFakeClock(start))
	w.srcs[0] = w.peerTap.Conn // the peer's socket itself: the tap records only what the peer sends
	for i, ap := range []netip.AddrPort{
		netip.AddrPortFrom(w.peerAddr, 50000),
		netip.AddrPortFrom(stranger(1), transport.RoCEv2Port),
		netip.AddrPortFrom(stranger(2), 50001),
	} {
		c, err := w.net.Listen(ap)
		must(tb, err)
		tb.Cleanup(func() { _ = c.Close() })
		w.srcs[i+1] = c
	}
	var err error
	w.barrier, err = w.net.Listen(netip.AddrPortFrom(w.barrierAddr, transport.RoCEv2Port))
	must(tb, err)
	tb.Cleanup(func() { _ = w.barrier.Close() })

	// The target's memory and QPs.
	pd, err := w.tgt.AllocPD()
	must(tb, err)
	cq, err := w.tgt.CreateCQ(1024)
	must(tb, err)
	w.wBuf, w.roBuf, w.locBuf = bytes.Repeat([]byte{wFill}, wLen), bytes.Repeat([]byte{roFill}, smallLen), bytes.Repeat([]byte{locFill}, smallLen)
	w.w, err = pd.RegMR(w.wBuf, ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessRemoteRead|ib.AccessRemoteAtomic)
	must(tb, err)
	w.ro, err = pd.RegMR(w.roBuf, ib.AccessRemoteRead)
	must(tb, err)
	w.loc, err = pd.RegMR(w.locBuf, ib.AccessLocalWrite)
	must(tb, err)
	recvBuf := make([]byte, 3*recvDepth*recvSlot)
	recv, err := pd.RegMR(recvBuf, ib.AccessLocalWrite)
	must(tb, err)
	mk := func(pd *ib.PD, cq *ib.CQ, typ ib.QPType) *ib.QP {
		q, err := pd.CreateQP(ib.QPInitAttr{Type: typ, SendCQ: cq, RecvCQ: cq,
			Cap: ib.QPCap{MaxSendWR: 64, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
		must(tb, err)
		return q
	}
	w.rc, w.uc, w.ud = mk(pd, cq, ib.RC), mk(pd, cq, ib.UC), mk(pd, cq, ib.UD)
	w.tscq, err = w.tgt.CreateCQ(64)
	must(tb, err)
	must(tb, w.rc.Destroy())
	w.rc, err = pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: w.tscq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 64, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(tb, err)

	// The peer's.
	ppd, err := w.peer.AllocPD()
	must(tb, err)
	w.pcq, err = w.peer.CreateCQ(1024)
	must(tb, err)
	w.peerBuf = make([]byte, wLen)
	for i := range w.peerBuf {
		w.peerBuf[i] = byte(i * 7)
	}
	w.peerMR, err = ppd.RegMR(w.peerBuf, ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessRemoteRead|ib.AccessRemoteAtomic)
	must(tb, err)
	w.prc, w.puc = mk(ppd, w.pcq, ib.RC), mk(ppd, w.pcq, ib.UC)

	acc := ib.AccessRemoteWrite | ib.AccessRemoteRead | ib.AccessRemoteAtomic
	attr := func(psn uint32) ib.ConnectAttr {
		return ib.ConnectAttr{SGIDIndex: -1, PSN: psn, AccessFlags: acc, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
			MinRNRTimer: 1, MaxRdAtomic: 16, MaxDestRdAtomic: 16}
	}
	remote := func(q *ib.QP, gid netip.Addr, psn uint32) ib.RemoteQP {
		return ib.RemoteQP{QPN: q.Num(), PSN: psn, GID: gid, MTU: ib.MTU1024}
	}
	must(tb, ib.ConnectQP(w.rc, remote(w.prc, w.peerAddr, peerSQPSN), attr(tgtSQPSN)))
	must(tb, ib.ConnectQP(w.prc, remote(w.rc, w.tgtAddr, tgtSQPSN), attr(peerSQPSN)))
	must(tb, ib.ConnectQP(w.uc, remote(w.puc, w.peerAddr, peerSQPSN), ib.ConnectAttr{SGIDIndex: -1, PSN: tgtSQPSN, AccessFlags: ib.AccessRemoteWrite}))
	must(tb, ib.ConnectQP(w.puc, remote(w.uc, w.tgtAddr, tgtSQPSN), ib.ConnectAttr{SGIDIndex: -1, PSN: peerSQPSN, AccessFlags: ib.AccessRemoteWrite}))
	must(tb, ib.ConnectQP(w.ud, ib.RemoteQP{}, ib.ConnectAttr{QKey: udQKey}))
	must(tb, w.ud.AttachMcast(w.group, 0))
	for i, q := range []*ib.QP{w.rc, w.uc, w.ud} {
		for j := range recvDepth {
			o := (i*recvDepth + j) * recvSlot
			must(tb, q.PostRecv(ib.RecvWR{ID: uint64(o), SGL: []ib.SGE{{Addr: recv.IOVA() + uint64(o), Length: recvSlot, LKey: recv.LKey()}}}))
		}
	}
	w.epsn = peerSQPSN
	w.listener, err = rdmacm.Listen(w.tgt, netip.AddrPortFrom(w.tgtAddr, cmPort), nil)
	must(tb, err)

	// The target's own WRITE and READ to the peer, whose answers the
	// peer's tap holds back until requesterLegit: the requester has its
	// window (reqWindow PSNs from tgtSQPSN) outstanding while the hostile
	// packets come.
	w.rdBuf = make([]byte, reqLen)
	rd, err := pd.RegMR(w.rdBuf, ib.AccessLocalWrite)
	must(tb, err)
	w.peerTap.setHold(true, w.tgtAddr)
	must(tb, w.rc.PostSend(
		ib.SendWR{ID: 101, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL:        []ib.SGE{{Addr: w.loc.IOVA(), Length: reqLen, LKey: w.loc.LKey()}},
			RemoteAddr: w.peerMR.IOVA() + reqOff, RKey: w.peerMR.RKey()},
		ib.SendWR{ID: 102, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
			SGL:        []ib.SGE{{Addr: rd.IOVA(), Length: reqLen, LKey: rd.LKey()}},
			RemoteAddr: w.peerMR.IOVA() + reqOff, RKey: w.peerMR.RKey()}))
	// The engine sends posted WRs when it gets to them: wait for the
	// three request packets (WRITE FIRST and LAST, READ), so that what
	// a test injects next is not charged with them, then for the peer.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; w.tgtTap.countTo(w.peerAddr, transport.RoCEv2Port) < 3; i++ {
		w.checkDeadline(deadline, "the target's own requests")
		pause(i)
	}
	w.settle(false)
	w.unusedQPN = 0x00ABCDEF
	for _, q := range []*ib.QP{w.rc, w.uc, w.ud} {
		if q.Num() == w.unusedQPN {
			w.unusedQPN++
		}
	}
	return w
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// settle waits until the target has handled everything sent to it so
// far (by the attackers and by the peer), and the peer everything the
// target sent it, answers to answers included, and, when mads, until the
// target's CM has answered everything before a barrier REQ. Each engine
// runs one worker, which handles datagrams in arrival order: a marker
// datagram that does not parse, counted under drop_bad_opcode once
// handled, says that everything before it was handled (and, the counter
// being an atomic, makes its effects on memory visible here). Rounds of
// markers go on until neither engine sent anything during one. The
// deadline only turns a hang into a failure.
func (w *world) settle(mads bool) {
	w.tb.Helper()
	if mads {
		w.sendBarrier()
	}
	deadline := time.Now().Add(20 * time.Second)
	for round := 0; ; round++ {
		if mads {
			for i := 0; w.tgtTap.countTo(w.barrierAddr, 0) < w.barriersSent; i++ {
				w.checkDeadline(deadline, "the CM's answer to the barrier")
				pause(i)
			}
		}
		t0, p0 := w.tgtTap.len(), w.peerTap.len()
		w.marker(w.peer, w.peerAddr, deadline)
		w.marker(w.tgt, w.tgtAddr, deadline)
		// The first round's quiet proves nothing: what a batch provokes
		// leaves when the batch ends, after its last datagram (the
		// marker, perhaps) was counted; a later round's markers come in
		// later batches.
		if round > 0 && w.tgtTap.len() == t0 && w.peerTap.len() == p0 {
			return
		}
	}
}

func (w *world) checkDeadline(deadline time.Time, what string) {
	w.tb.Helper()
	if time.Now().After(deadline) {
		w.tb.Fatalf("hung waiting for %s: target counters %v, peer counters %v", what, nonZero(w.tgt.Counters()), nonZero(w.peer.Counters()))
	}
}

// marker sends dev (at addr) a datagram to a QP number nobody uses from
// the barrier's address and waits until dev counted it under
// drop_bad_opcode: a BTH with opcode 0xFF (reserved: nothing parses it)
// and an ICRC slot, to a QP number nobody uses.
func (w *world) marker(dev *ib.Device, addr netip.Addr, deadline time.Time) {
	w.tb.Helper()
	dq := dev.Counters()["drop_bad_opcode"]
	pkt := make([]byte, wire.BTHLen+wire.ICRCLen)
	bth := wire.BTH(pkt[:wire.BTHLen])
	bth.SetOpcode(0xFF)
	bth.SetPKey(0xFFFF)
	bth.SetDestQP(w.unusedQPN)
	dst := netip.AddrPortFrom(addr, transport.RoCEv2Port)
	must(w.tb, w.barrier.Send([][]byte{pkt}, transport.Endpoint{Remote: dst}))
	for i := 0; dev.Counters()["drop_bad_opcode"] == dq; i++ {
		w.checkDeadline(deadline, "a marker")
		pause(i)
	}
}

// pause is the i-th wait of a polling loop: a yield at first (a marker
// takes microseconds; a sleep would take a timer tick), then sleeps.
func pause(i int) {
	if i < 100 {
		runtime.Gosched()
		return
	}
	time.Sleep(50 * time.Microsecond)
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// sendBarrier sends the target a REQ for a service nobody listens on,
// which its CM answers with a REJ once it has handled every MAD before.
func (w *world) sendBarrier() {
	w.tb.Helper()
	w.barrierID++
	pkt := barrierREQ(w.tb, w.barrierID)
	src := netip.AddrPortFrom(w.barrierAddr, transport.RoCEv2Port)
	dst := netip.AddrPortFrom(w.tgtAddr, transport.RoCEv2Port)
	wire.Flow{Src: src, Dst: dst}.Seal(pkt)
	must(w.tb, w.barrier.Send([][]byte{pkt}, transport.Endpoint{Remote: dst}))
	w.barriersSent++
}

// inject sends pkt from source i to dst (the target's unicast address
// when not valid), waits until the target judged it (and, for QP 1,
// answered it) and returns what the target sent meanwhile, the barrier's
// answers left out.
func (w *world) inject(i int, pkt []byte, dst netip.AddrPort) []sent {
	w.tb.Helper()
	if !dst.IsValid() {
		dst = netip.AddrPortFrom(w.tgtAddr, transport.RoCEv2Port)
	}
	destQP := uint32(0xFFFFFFFF)
	if len(pkt) >= wire.BTHLen {
		destQP = wire.BTH(pkt[:wire.BTHLen]).DestQP()
	}
	before := w.tgtTap.len()
	must(w.tb, w.srcs[i].Send([][]byte{pkt}, transport.Endpoint{Remote: dst}))
	w.settle(destQP == 1)
	var out []sent
	for _, s := range w.tgtTap.since(before) {
		if s.to.Addr() != w.barrierAddr {
			out = append(out, s)
		}
	}
	return out
}

// craft encodes h around payload and seals it as sent from source i to
// dst (the target's unicast address when not valid).
func (w *world) craft(i int, h wire.Headers, payload []byte, dst netip.AddrPort) []byte {
	w.tb.Helper()
	if !dst.IsValid() {
		dst = netip.AddrPortFrom(w.tgtAddr, transport.RoCEv2Port)
	}
	if h.PKey == 0 {
		h.PKey = 0xFFFF
	}
	b := make([]byte, h.Len(len(payload)))
	_, err := h.Encode(b, payload)
	must(w.tb, err)
	wire.Flow{Src: w.srcAddr(i), Dst: dst}.Seal(b)
	return b
}

// seal writes pkt's ICRC for flow f with IPv4 Identification id (IPv4
// flows; wire.Flow.Seal assumes 0, what rxed and Linux send).
func seal(f wire.Flow, pkt []byte, id uint16) {
	if id == 0 || !f.IsIPv4() {
		f.Seal(pkt)
		return
	}
	var hdr [28]byte
	n := f.PutHeaders(hdr[:], len(pkt))
	wire.SetIPv4ID(hdr[:n], id)
	crc := wire.ICRC(hdr[:n], hdr[n:n+8], pkt[:len(pkt)-wire.ICRCLen])
	binary.LittleEndian.PutUint32(pkt[len(pkt)-wire.ICRCLen:], crc)
}

// bytesOf sums the datagrams' lengths.
func bytesOf(out []sent) int {
	n := 0
	for _, s := range out {
		n += s.n
	}
	return n
}

// srcAddr is source i's address and port.
func (w *world) srcAddr(i int) netip.AddrPort { return w.srcs[i].LocalAddrs()[0] }

// rqPSN is the PSN the target's RC responder expects next, as the world
// tracks it (Query reports the attribute the QP was moved to RTR with):
// the peer's WRITE and READ of legit, and the requests in sequence taken
// (took).
func (w *world) rqPSN() uint32 { return w.epsn }

// took advances the tracked ePSN past p if the target took it as a new
// request: p was in sequence and the target neither dropped it nor
// counted it a duplicate or out of sequence, nor NAKed it.
func (w *world) took(p *wire.Packet, before, after map[string]uint64, out []sent) {
	if p.Info == nil || !p.Info.Flags.Has(wire.FlagRequest) || p.BTH.DestQP() != w.rc.Num() || p.BTH.PSN() != w.epsn {
		return
	}
	for k, v := range after {
		if v != before[k] && (strings.HasPrefix(k, "drop_") || k == "duplicate_request" || k == "out_of_seq_request") {
			return
		}
	}
	for _, s := range out {
		if s.op == wire.RCAck && wire.Syndrome(s.syn).Kind() != wire.SynACK {
			return
		}
	}
	n := uint32(1)
	if p.Info.Flags.Has(wire.FlagRead) && p.RETH != nil {
		n = max(1, (p.RETH.DMALen()+1023)/1024) // path MTU 1024
	}
	w.epsn = (w.epsn + n) & 0xFFFFFF
}

// sqPSN is the next PSN the target's RC requester sends: its WRITE and
// READ took reqWindow.
func (w *world) sqPSN() uint32 { return tgtSQPSN + reqWindow }

// inReqWindow reports whether psn is one the target's requester sent and
// has not seen answered.
func inReqWindow(psn uint32) bool { return psn-tgtSQPSN < reqWindow }

// requesterLegit lets the peer's answers through again and moves the
// target's clock on, to each armed deadline in turn, until its requester
// has retried its WRITE and READ: both must complete, the READ with the
// bytes the WRITE put there. A fired timer is the target's worker's to
// handle, and that goroutine may not have run yet (fake time goes as fast
// as this loop): while no timer is armed, the loop waits in real time,
// bounded by a deadline that only turns a hang into a failure.
func (w *world) requesterLegit() error {
	w.peerTap.setHold(false, netip.Addr{})
	wcs := make([]ib.WC, 2)
	got := 0
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		got += w.tscq.Poll(wcs[got:])
		if got == 2 {
			for _, wc := range wcs {
				if wc.Status != ib.WCSuccess {
					return fmt.Errorf("the target's own WR %d completed with %v", wc.ID, wc.Status)
				}
			}
			if !bytes.Equal(w.rdBuf, bytes.Repeat([]byte{locFill}, reqLen)) {
				return fmt.Errorf("the target's READ got other bytes than its WRITE put")
			}
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		if next, armed := w.tclock.NextDeadline(); armed {
			w.tclock.Advance(max(next.Sub(w.tclock.Now()), 0))
			w.settle(false)
			continue
		}
		pause(i)
	}
	return fmt.Errorf("the target's own WRITE and READ did not complete (%d of 2; QP %v; counters %v; peer's %v)",
		got, w.rc.State(), nonZero(w.tgt.Counters()), nonZero(w.peer.Counters()))
}

// legit has the real peer WRITE legitLen bytes into w and READ them back,
// and fails unless both complete with the bytes intact.
func (w *world) legit(seed byte) error {
	w.peerTap.setHold(false, netip.Addr{})
	for i := range legitLen {
		w.peerBuf[i] = seed + byte(i)
	}
	sge := func(off int) []ib.SGE {
		return []ib.SGE{{Addr: w.peerMR.IOVA() + uint64(off), Length: legitLen, LKey: w.peerMR.LKey()}}
	}
	base := w.w.IOVA() + legitOff
	if err := w.prc.PostSend(
		ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled, SGL: sge(0), RemoteAddr: base, RKey: w.w.RKey()},
		ib.SendWR{ID: 2, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled, SGL: sge(legitLen), RemoteAddr: base, RKey: w.w.RKey()}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wcs := make([]ib.WC, 2)
	for got := 0; got < 2; {
		n, err := w.pcq.WaitPoll(ctx, wcs[got:])
		if err != nil {
			return fmt.Errorf("the peer's WRITE and READ did not complete: %w (target counters %v)", err, nonZero(w.tgt.Counters()))
		}
		for _, wc := range wcs[got : got+n] {
			if wc.Status != ib.WCSuccess {
				return fmt.Errorf("the peer's WR %d completed with %v", wc.ID, wc.Status)
			}
		}
		got += n
	}
	w.epsn = (w.epsn + 2) & 0xFFFFFF // one WRITE and one READ packet
	if !bytes.Equal(w.peerBuf[:legitLen], w.peerBuf[legitLen:2*legitLen]) {
		return fmt.Errorf("the peer READ back other bytes than it wrote")
	}
	return nil
}

// tap records what an engine sends: one record per datagram.
type tap struct {
	transport.Conn
	mu  sync.Mutex
	out []sent
	// hold drops (records but does not send) what goes to holdTo: the
	// peer's answers to the target's own requests while the hostile
	// packets come, so that its requester has a window outstanding.
	hold   bool
	holdTo netip.Addr
}

type sent struct {
	to     netip.AddrPort
	n      int
	destQP uint32
	op     wire.Opcode
	syn    byte // an ACK's AETH syndrome
	psn    uint32
}

// Send records the datagrams once sent: a record seen means the datagram
// is in its receiver's queue (MemNetwork delivers synchronously).
func (t *tap) Send(bufs [][]byte, ep transport.Endpoint) error {
	t.mu.Lock()
	hold := t.hold && ep.Remote.Addr().Unmap() == t.holdTo
	t.mu.Unlock()
	var err error
	if !hold {
		err = t.Conn.Send(bufs, ep)
	}
	t.mu.Lock()
	for _, b := range bufs {
		s := sent{to: netip.AddrPortFrom(ep.Remote.Addr().Unmap(), ep.Remote.Port()), n: len(b)}
		if len(b) >= wire.BTHLen {
			s.destQP, s.op, s.psn = wire.BTH(b[:wire.BTHLen]).DestQP(), wire.BTH(b[:wire.BTHLen]).Opcode(), wire.BTH(b[:wire.BTHLen]).PSN()
			if (s.op == wire.RCAck || s.op == wire.RCAtomicAck) && len(b) > wire.BTHLen {
				s.syn = b[wire.BTHLen]
			}
		}
		t.out = append(t.out, s)
	}
	t.mu.Unlock()
	return err
}

// JoinGroup lets the engine join groups through the tap.
func (t *tap) JoinGroup(g netip.Addr) (*transport.Membership, error) {
	return transport.JoinGroup(t.Conn, g)
}

// Stats passes the Conn's counters on (drop_overrun).
func (t *tap) Stats() transport.Stats {
	if sr, ok := t.Conn.(transport.StatsReporter); ok {
		return sr.Stats()
	}
	return transport.Stats{}
}

// countTo counts the datagrams sent to addr (and port, unless 0).
func (t *tap) countTo(addr netip.Addr, port uint16) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n uint64
	for _, s := range t.out {
		if s.to.Addr() == addr.Unmap() && (port == 0 || s.to.Port() == port) {
			n++
		}
	}
	return n
}

// since returns the records from index i on.
func (t *tap) since(i int) []sent {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]sent(nil), t.out[i:]...)
}

func (t *tap) setHold(on bool, to netip.Addr) {
	t.mu.Lock()
	t.hold, t.holdTo = on, to.Unmap()
	t.mu.Unlock()
}

func (t *tap) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.out)
}

// barrierREQ is the REQ of rdmacm_ucmatose.pcap frame 1, a UD SEND to
// QP 1, for service 0x1060001 (rdma_cm's TCP port 1, where nobody
// listens) and with local comm ID id, without its ICRC slot filled.
func barrierREQ(tb testing.TB, id uint32) []byte {
	b := captureREQ(tb)
	d := b[wire.BTHLen+wire.DETHLen+madHeaderLen:]
	binary.BigEndian.PutUint32(d[0:], id)
	binary.BigEndian.PutUint64(d[8:], 0x0000000001060001)
	d[32], d[33], d[34] = 0xBB, byte(id>>8), byte(id) // local QPN: not stale against another barrier
	return b
}

// madHeaderLen is the common MAD header before a CM message's data.
const madHeaderLen = 24
