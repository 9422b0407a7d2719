package conform

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/wire"
)

// fakeResponder is a scripted RC responder on loopback for judging the
// responder scenarios' verdict logic without a peer tool: it plays a
// conformant responder (in-order execution, ACK on AckReq, duplicate
// handling, one sequence NAK) and its knobs make it wrong or slow in one
// way. Connect a scenario to it with fakeConn.
type fakeResponder struct {
	pc   *net.UDPConn
	flow wire.Flow // responder -> engine
	qpn  uint32
	tool Tool

	// knobs
	acceptUC bool          // takes a UC SEND ONLY as an RC SEND ONLY (wrong)
	delay    time.Duration // every response leaves this late (a slow peer)
	msnMode  msnMode       // how it counts its MSN (msnRight unless a test breaks it)
	dupACKAt dupACKAt      // the PSN it ACKs a duplicate SEND or WRITE at
	// dupReadContinues answers a duplicate READ from its first PSN as the
	// continuation of a response sequence (MIDDLE ... LAST: wrong).
	dupReadContinues bool
	// zeroLenKeyChecked checks the R_Key and VA of a zero-length READ or
	// WRITE (wrong: IBA C9-88 says they are not validated).
	zeroLenKeyChecked bool
	pkey              uint16 // the P_Key of its responses (0: DefaultPKey)
	badICRC           bool   // corrupts the ICRC of its responses
	// readLen is what it does with a READ REQUEST whose length does not
	// add up (PadCnt != 0, bytes after its RETH): drops it (right, as
	// rxed's parser), NAKs it invalid request (right too), or executes it
	// (wrong: rdma_rxe's rxe_resp_check_length checks no READ's length).
	readLen readLenMode

	mu        sync.Mutex
	queue     chan delayed // responses sent delay late
	engineQPN uint32
	ePSN      uint32
	msn       uint32
	nakSent   bool
	mem       []byte
	atomics   map[uint32]uint64 // saved results of executed atomics by PSN
	done      chan struct{}
	wg        sync.WaitGroup
}

const (
	fakeVA   = 0x10000
	fakeRKey = 0x1234
)

// dupACKAt is the PSN a fake responder ACKs a duplicate SEND or WRITE at.
type dupACKAt uint8

const (
	dupACKLatest dupACKAt = iota // the latest PSN received, as rxe (right)
	dupACKOwn                    // the duplicate's own PSN (right too)
	dupACKAhead                  // the expected PSN: one never received (wrong)
)

// readLenMode is what a fake responder does with a malformed READ
// REQUEST.
type readLenMode uint8

const (
	readLenDrop    readLenMode = iota // silently dropped (right)
	readLenNAK                        // NAK invalid request, a length error (right)
	readLenExecute                    // answered as a valid READ (wrong)
)

// msnMode is how a fake responder counts its MSN: right, or wrong in one
// of the ways a responder gets it wrong.
type msnMode uint8

const (
	// msnRight counts each completed message once (rdma_rxe: execute's
	// msn++ at a message's last packet, C9-148's at a READ's acceptance,
	// atomic_reply's), so a NAK or a duplicate's answer carries the count
	// before it.
	msnRight msnMode = iota
	// msnFrozen never counts: every AETH carries MSN 0.
	msnFrozen
	// msnPackets counts packets instead of messages: every request packet
	// it takes (FIRST, MIDDLE and LAST, duplicates too) and, for a READ,
	// every response packet it sends.
	msnPackets
	// msnEager counts a message as its last packet arrives, before its
	// PSN, keys or receive are checked: a NAKed, RNR'ed, out-of-sequence
	// or duplicate request counts too.
	msnEager
)

// newFakeResponder binds 127.0.0.2 on a free UDP port; the engine uses
// 127.0.0.1 on the same port.
func newFakeResponder(t *testing.T, tool Tool, tune func(*fakeResponder)) (*fakeResponder, uint16) {
	t.Helper()
	peer := netip.MustParseAddr("127.0.0.2")
	var pc *net.UDPConn
	var port uint16
	for range 20 {
		_, port = freePorts(t)
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, port)))
		if err == nil {
			pc = c
			break
		}
	}
	require.NotNil(t, pc, "binding 127.0.0.2")
	f := &fakeResponder{pc: pc, qpn: 0x1717, tool: tool, ePSN: 0x100, mem: make([]byte, 64<<10), done: make(chan struct{}), atomics: map[uint32]uint64{},
		flow: wire.Flow{Src: netip.AddrPortFrom(peer, port), Dst: netip.AddrPortFrom(loopback, port)}}
	if tune != nil {
		tune(f)
	}
	f.queue = make(chan delayed, 4096)
	f.wg.Add(2)
	go f.serve()
	go f.sendLate()
	t.Cleanup(func() {
		close(f.done)
		_ = pc.Close()
		f.wg.Wait()
	})
	return f, port
}

// fakeConn opens the engine's side towards f as Dial would after the
// tool's exchange.
func fakeConn(t *testing.T, f *fakeResponder, port uint16) *Conn {
	t.Helper()
	cfg := &Config{Tool: f.tool, Local: loopback, Peer: f.flow.Src.Addr(), RoCEPort: port}
	cfg.defaults()
	l, err := OpenLink(netip.AddrPortFrom(loopback, port), f.flow.Src)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	c := &Conn{Link: l, Cfg: cfg, Tool: f.tool, OurQPN: 0x2323, PeerQPN: f.qpn, PSN: 0x100, RKey: fakeRKey, VA: fakeVA, MTU: 1024, PeerOutReads: 16}
	l.ourQPN, l.peerQPN = c.OurQPN, c.PeerQPN
	f.mu.Lock()
	f.engineQPN = c.OurQPN
	f.mu.Unlock()
	return c
}

// runFake runs scenario id against f.
func runFake(t *testing.T, id string, tool Tool, tune func(*fakeResponder)) Outcome {
	t.Helper()
	s, err := Lookup(id)
	require.NoError(t, err)
	f, port := newFakeResponder(t, tool, tune)
	c := fakeConn(t, f, port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.run(ctx, c)
}

func (f *fakeResponder) serve() {
	defer f.wg.Done()
	for {
		buf := make([]byte, 65536)
		n, _, err := f.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var p wire.Packet
		err = p.Parse(buf[:n])
		if v, _ := f.flow.Reverse().Verify(buf[:n]); v != wire.ICRCOK {
			continue
		}
		f.mu.Lock()
		switch {
		case err == nil:
			f.handle(&p)
		case p.Opcode == wire.RCReadRequest && (errors.Is(err, wire.ErrBadPadding) || errors.Is(err, wire.ErrBadLength)):
			f.malformedRead(buf[:n])
		}
		f.mu.Unlock()
	}
}

// handle runs with f.mu held.
func (f *fakeResponder) handle(p *wire.Packet) {
	if p.BTH.TVer() != 0 || p.BTH.PKey() != DefaultPKey || p.BTH.DestQP() != f.qpn || p.Info.Flags&wire.FlagRequest == 0 {
		return
	}
	flags := p.Info.Flags
	switch {
	case p.Info.Transport == wire.TransportRC:
	case f.acceptUC && p.Opcode == wire.UCSendOnly:
		flags = wire.FlagPayload | wire.FlagOnly | wire.FlagSend | wire.FlagRequest
	default:
		return // another transport's opcode: dropped
	}
	psn := p.BTH.PSN()
	if f.msnMode == msnEager && flags&(wire.FlagOnly|wire.FlagLast|wire.FlagRead|wire.FlagAtomic) != 0 {
		f.msn++
	}
	switch {
	case psn == f.ePSN:
		f.nakSent = false
	case psnBefore(psn, f.ePSN):
		switch {
		case flags&wire.FlagRead != 0:
			f.readResponse(p, psn, f.dupReadContinues)
		case flags&wire.FlagAtomic != 0:
			if orig, ok := f.atomics[psn]; ok {
				f.countPacket()
				f.atomicAck(psn, orig)
			}
		case flags&(wire.FlagSend|wire.FlagWrite) != 0:
			f.countPacket()
			at := psnAdd(f.ePSN, -1)
			switch f.dupACKAt {
			case dupACKOwn:
				at = psn
			case dupACKAhead:
				at = f.ePSN
			}
			f.ack(at, wire.ACKSyndrome(0x1f))
		}
		return
	default:
		if !f.nakSent {
			f.nakSent = true
			f.ack(f.ePSN, wire.NAKSyndrome(wire.NAKPSNSeqErr))
		}
		return
	}
	switch {
	case flags&wire.FlagRead != 0:
		n := int(p.RETH.DMALen())
		if !f.rethOK(p) {
			f.ack(psn, wire.NAKSyndrome(wire.NAKRemoteAccess)) // a refused READ counts none
			return
		}
		f.ePSN = psnAdd(psn, max((n+1023)/1024, 1))
		f.complete()
		f.readResponse(p, psn, false)
	case flags&wire.FlagAtomic != 0:
		a := p.AtomicETH
		off := int(a.VA() - fakeVA)
		if a.RKey() != fakeRKey || off < 0 || off+8 > len(f.mem) {
			f.ack(psn, wire.NAKSyndrome(wire.NAKRemoteAccess))
			return
		}
		if off%8 != 0 {
			f.ack(psn, wire.NAKSyndrome(wire.NAKInvalidRequest))
			return
		}
		f.ePSN = psnAdd(psn, 1)
		orig := binary.LittleEndian.Uint64(f.mem[off:])
		switch {
		case p.Opcode == wire.RCFetchAdd:
			binary.LittleEndian.PutUint64(f.mem[off:], orig+a.SwapAdd())
		case orig == a.Compare():
			binary.LittleEndian.PutUint64(f.mem[off:], a.SwapAdd())
		}
		f.atomics[psn] = orig
		f.countPacket()
		f.complete()
		f.atomicAck(psn, orig)
	case flags&wire.FlagSend != 0:
		if f.tool != IBSendBW && f.tool != IBVRCPingpong {
			f.ack(psn, wire.RNRSyndrome(12))
			return
		}
		f.ePSN = psnAdd(psn, 1)
		f.countPacket()
		if flags&(wire.FlagOnly|wire.FlagLast) != 0 {
			f.complete()
		}
		if p.BTH.AckReq() {
			f.ack(psn, wire.ACKSyndrome(0x1f))
		}
	case flags&wire.FlagWrite != 0:
		f.ePSN = psnAdd(psn, 1)
		if p.RETH != nil {
			if !f.rethOK(p) {
				f.ack(psn, wire.NAKSyndrome(wire.NAKRemoteAccess))
				return
			}
			if n := int(p.RETH.DMALen()); n > 0 {
				copy(f.mem[p.RETH.VA()-fakeVA:], p.Payload)
			}
		}
		f.countPacket()
		if flags&(wire.FlagOnly|wire.FlagLast) != 0 {
			f.complete()
		}
		if p.BTH.AckReq() {
			f.ack(psn, wire.ACKSyndrome(0x1f))
		}
	}
}

// malformedRead handles a READ REQUEST b whose length does not add up,
// as readLen says; f.mu is held.
func (f *fakeResponder) malformedRead(b []byte) {
	bth := wire.BTH(b)
	if bth.DestQP() != f.qpn || bth.PSN() != f.ePSN {
		return
	}
	switch f.readLen {
	case readLenNAK:
		f.ack(bth.PSN(), wire.NAKSyndrome(wire.NAKInvalidRequest))
	case readLenExecute:
		// What a receiver that checks no READ's length sees: BTH and
		// RETH, the rest ignored.
		clean := append(append([]byte(nil), b[:wire.BTHLen+wire.RETHLen]...), make([]byte, wire.ICRCLen)...)
		wire.BTH(clean).SetPadCount(0)
		var p wire.Packet
		if p.Parse(clean) == nil {
			f.handle(&p)
		}
	}
}

// send sends one response, delay late (in order with the others).
func (f *fakeResponder) send(h wire.Headers, payload []byte) {
	if f.pkey != 0 {
		h.PKey = f.pkey
	}
	b := make([]byte, h.Len(len(payload)))
	if _, err := h.Encode(b, payload); err != nil {
		panic(err)
	}
	f.flow.Seal(b)
	if f.badICRC {
		b[len(b)-1] ^= 0x55
	}
	if f.delay == 0 {
		_, _ = f.pc.WriteToUDPAddrPort(b, f.flow.Dst)
		return
	}
	f.queue <- delayed{at: time.Now().Add(f.delay), b: b}
}

type delayed struct {
	at time.Time
	b  []byte
}

// sendLate sends the queued responses in order, each at its time.
func (f *fakeResponder) sendLate() {
	defer f.wg.Done()
	for {
		select {
		case d := <-f.queue:
			select {
			case <-time.After(time.Until(d.at)):
			case <-f.done:
				return
			}
			_, _ = f.pc.WriteToUDPAddrPort(d.b, f.flow.Dst)
		case <-f.done:
			return
		}
	}
}

// rethOK checks the R_Key and bounds of p's RETH; a zero-length one has
// none to check (C9-88) unless zeroLenKeyChecked.
func (f *fakeResponder) rethOK(p *wire.Packet) bool {
	n, off := int(p.RETH.DMALen()), int(p.RETH.VA()-fakeVA)
	if n == 0 && !f.zeroLenKeyChecked {
		return true
	}
	return p.RETH.RKey() == fakeRKey && off >= 0 && off+n <= len(f.mem)
}

// complete counts a completed message (msnRight).
func (f *fakeResponder) complete() {
	if f.msnMode == msnRight {
		f.msn++
	}
}

// countPacket counts a request packet taken (msnPackets).
func (f *fakeResponder) countPacket() {
	if f.msnMode == msnPackets {
		f.msn++
	}
}

func (f *fakeResponder) atomicAck(psn uint32, orig uint64) {
	f.send(wire.Headers{Opcode: wire.RCAtomicAck, PKey: DefaultPKey, DestQP: f.engineQPN, PSN: psn,
		Syndrome: wire.ACKSyndrome(0x1f), MSN: f.msn, OrigData: orig}, nil)
}

func (f *fakeResponder) ack(psn uint32, syn wire.Syndrome) {
	f.send(wire.Headers{Opcode: wire.RCAck, PKey: DefaultPKey, DestQP: f.engineQPN, PSN: psn, Syndrome: syn, MSN: f.msn}, nil)
}

// readResponse answers the READ p (at psn, possibly a duplicate);
// continues sends MIDDLE where FIRST belongs.
func (f *fakeResponder) readResponse(p *wire.Packet, psn uint32, continues bool) {
	if !f.rethOK(p) {
		f.ack(psn, wire.NAKSyndrome(wire.NAKRemoteAccess))
		return
	}
	n, data := int(p.RETH.DMALen()), []byte(nil)
	if n > 0 {
		off := int(p.RETH.VA() - fakeVA)
		data = append(data, f.mem[off:off+n]...)
	}
	segs := max((n+1023)/1024, 1)
	for i := range segs {
		op := wire.RCReadResponseMiddle
		switch {
		case segs == 1:
			op = wire.RCReadResponseOnly
		case i == 0 && !continues:
			op = wire.RCReadResponseFirst
		case i == segs-1:
			op = wire.RCReadResponseLast
		}
		if f.msnMode == msnPackets {
			f.msn++ // per response packet: the READ request itself counts none
		}
		f.send(wire.Headers{Opcode: op, PKey: DefaultPKey, DestQP: f.engineQPN, PSN: psnAdd(psn, i),
			Syndrome: wire.ACKSyndrome(0x1f), MSN: f.msn}, data[i*1024:min(n, (i+1)*1024)])
	}
}

// TestFakeResponderIsConformant: the fake responder passes the scenarios
// the tests below use it for, so that a FAIL there is the knob's doing.
func TestFakeResponderIsConformant(t *testing.T) {
	for _, c := range []struct {
		id   string
		tool Tool
	}{
		{"R-ACK-SEND", IBSendBW},
		{"R-ACK-WRITE", IBWriteBW},
		{"R-DUP-SEND", IBSendBW},
		{"R-SEQ-NAK", IBSendBW},
		{"D-OPCODE-UC", IBSendBW},
		{"D-OPCODE-UC", IBWriteBW},
		{"R-READ-MULTI", IBReadBW},
		{"R-DUP-READ", IBReadBW},
		{"R-DUP-READ-MIDDLE", IBReadBW},
	} {
		t.Run(c.id+"/"+string(c.tool), func(t *testing.T) {
			o := runFake(t, c.id, c.tool, nil)
			require.Equal(t, Pass, o.Verdict, o.Evidence)
		})
	}
}

// TestDropUCOpcodeFailsAPeerThatTakesIt: D-OPCODE-UC against a responder
// that takes a UC SEND ONLY to its RC QP as an RC SEND (with ib_send_bw a
// receive waits for it). Bug (found by the conformance audit, session AF):
// the UC packet had no AckReq, so the peer stayed silent, and the probe
// after it, a duplicate then, was ACKed like a valid request: PASS.
func TestDropUCOpcodeFailsAPeerThatTakesIt(t *testing.T) {
	o := runFake(t, "D-OPCODE-UC", IBSendBW, func(f *fakeResponder) { f.acceptUC = true })
	require.Equal(t, Fail, o.Verdict, o.Evidence)
	require.Contains(t, o.Evidence, "the peer answered")
}
