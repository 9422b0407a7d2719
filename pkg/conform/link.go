package conform

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// Dir is the direction of a traced packet.
type Dir uint8

const (
	// Out: from the engine to the peer.
	Out Dir = iota
	// In: from the peer to the engine.
	In
)

// Event is one packet of a scenario's trace.
type Event struct {
	At   time.Duration // since the link opened
	Dir  Dir
	Raw  []byte // the UDP payload, BTH ... ICRC
	Note string // why the engine sent it (Out), or a parse/ICRC problem (In)
	// ipID is the IPv4 Identification solved from an incoming packet's
	// ICRC, so that the capture's frame verifies.
	ipID uint16
	// dropped: an incoming packet a receiver drops (malformed, bad ICRC,
	// another P_Key); Note says why. It answers nothing, so nothing the
	// engine decides later may read it from the trace.
	dropped bool
}

// accepted calls fn with every packet of the peer's in trace that the link
// took (parsed, its ICRC and P_Key good), in order: the packets a verdict
// or the closing may rely on.
func accepted(trace []Event, fn func(p *wire.Packet)) {
	for _, e := range trace {
		var p wire.Packet
		if e.Dir == In && !e.dropped && p.Parse(e.Raw) == nil {
			fn(&p)
		}
	}
}

// droppedEvidence names the peer's packets the link dropped, with the
// reason of each ("" when none was): a FAIL that says "no ACK" when an ACK
// came with a bad ICRC or another P_Key says why it answered nothing.
func droppedEvidence(trace []Event) string {
	const show = 3
	var names []string
	n := 0
	for _, e := range trace {
		if e.Dir != In || !e.dropped {
			continue
		}
		n++
		if len(names) < show {
			names = append(names, e.Label())
		}
	}
	if n == 0 {
		return ""
	}
	s := fmt.Sprintf("the engine dropped %d packet(s) of the peer's: %s", n, strings.Join(names, ", "))
	if n > show {
		s += fmt.Sprintf(" and %d more", n-show)
	}
	return s
}

// Label is the ladder label of e: opcode, PSN and the deciding field.
func (e Event) Label() string {
	var p wire.Packet
	err := p.Parse(e.Raw)
	if p.BTH == nil {
		return fmt.Sprintf("%d bytes (%v)", len(e.Raw), err)
	}
	s := fmt.Sprintf("%s psn=%#x", p.Opcode, p.BTH.PSN())
	if p.BTH.AckReq() && p.Info.Flags&wire.FlagRequest != 0 {
		s += " A"
	}
	if err != nil {
		s += fmt.Sprintf(" (%v)", err)
	} else {
		switch {
		case p.AETH != nil:
			s += " " + synName(p.AETH.Syndrome()) + fmt.Sprintf(" msn=%d", p.AETH.MSN())
		}
		if p.RETH != nil {
			s += fmt.Sprintf(" len=%d", p.RETH.DMALen())
		}
		if p.AtomicAckETH != nil {
			s += fmt.Sprintf(" orig=%#x", p.AtomicAckETH.OrigData())
		}
		if len(p.Payload) > 0 && p.RETH == nil {
			s += fmt.Sprintf(" %dB", len(p.Payload))
		}
	}
	if e.Note != "" {
		s += " [" + e.Note + "]"
	}
	return s
}

// synName names an AETH syndrome: "ACK", "RNR(t=14)", "NAK(PSN seq error)".
func synName(s wire.Syndrome) string {
	switch s.Kind() {
	case wire.SynACK:
		return "ACK"
	case wire.SynRNR:
		return fmt.Sprintf("RNR(t=%d)", s.RNRTimer())
	case wire.SynNAK:
		return "NAK(" + wire.NAKCodeName(s.NAKCode()) + ")"
	}
	return fmt.Sprintf("syndrome(%#x)", uint8(s))
}

// Rx is one packet received from the peer, parsed.
type Rx struct {
	At  time.Duration
	Pkt wire.Packet // valid when Err is nil (BTH set when it could be read)
	Err error       // parse error or bad ICRC
}

// PSN is the packet's BTH PSN.
func (r *Rx) PSN() uint32 { return r.Pkt.BTH.PSN() }

// Syn is the AETH syndrome (0 without an AETH).
func (r *Rx) Syn() wire.Syndrome {
	if r.Pkt.AETH == nil {
		return 0
	}
	return r.Pkt.AETH.Syndrome()
}

// MSN is the AETH MSN (0 without an AETH).
func (r *Rx) MSN() uint32 {
	if r.Pkt.AETH == nil {
		return 0
	}
	return r.Pkt.AETH.MSN()
}

// String is the packet's ladder label with its time.
func (r *Rx) String() string {
	return fmt.Sprintf("%s at %v", Event{Raw: r.Pkt.Raw}.Label(), r.At.Round(time.Microsecond))
}

// Link is the engine's own UDP socket towards one peer: it sends packets
// the scenario crafted (sealing their ICRC for the exact header Linux puts
// on them) and hands over what the peer sends, recording both in a trace.
//
// Locking: mu guards trace and the auto-ACK state; the socket is used by
// one receiving goroutine and by the scenario's goroutine for sends.
type Link struct {
	conn  *net.UDPConn
	flow  wire.Flow // local -> peer
	clk   linkClock
	start time.Time
	rx    chan *Rx
	done  chan struct{}

	mu    sync.Mutex
	trace []Event
	// Peer requests (pingpong servers send their own messages): when
	// autoAck is set, every request to ourQPN is acknowledged, in order,
	// with a cumulative MSN, as a plain responder would.
	autoAck  bool
	ourQPN   uint32
	peerQPN  uint32
	ackPSN   uint32 // the next PSN we expect from the peer
	ackMSN   uint32
	peerMsgs int // complete messages received from the peer
	// msgsMore is closed (and replaced) when peerMsgs grows, so that a
	// wait for the peer's messages wakes on the event, not by polling.
	msgsMore chan struct{}
	closeErr error
	closed   bool
}

// OpenLink binds local (address and UDP port) and targets peer.
func OpenLink(local, peer netip.AddrPort) (*Link, error) {
	return openLinkClock(local, peer, realClock{})
}

// openLinkClock is OpenLink on clk's time (tests pass a fake).
func openLinkClock(local, peer netip.AddrPort, clk linkClock) (*Link, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = setSockOpts(int(fd), local.Addr().Unmap().Is4()) })
		if err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp", netip.AddrPortFrom(local.Addr().Unmap(), local.Port()).String())
	if err != nil {
		return nil, fmt.Errorf("binding %s: %v", local, err)
	}
	l := &Link{conn: pc.(*net.UDPConn), flow: wire.Flow{Src: local, Dst: peer}, clk: clk, start: clk.Now(),
		rx: make(chan *Rx, 4096), done: make(chan struct{}), msgsMore: make(chan struct{})}
	go l.receive()
	return l, nil
}

// Close stops the link; the trace stays readable.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return l.closeErr
	}
	l.closed = true
	l.mu.Unlock()
	err := l.conn.Close()
	<-l.done
	return err
}

// Trace returns a copy of the events so far.
func (l *Link) Trace() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.trace...)
}

// Since is the link's clock.
func (l *Link) Since() time.Duration { return l.clk.Now().Sub(l.start) }

// deadline is d from now on the link's clock; left (below) is what
// remains of it. A scenario's waits beyond one Next measure with these, so
// that a test's fake clock drives them too.
func (l *Link) deadline(d time.Duration) time.Time { return l.clk.Now().Add(d) }

// left is how long until t on the link's clock (<= 0: past).
func (l *Link) left(t time.Time) time.Duration { return t.Sub(l.clk.Now()) }

func (l *Link) record(e Event) {
	l.mu.Lock()
	l.trace = append(l.trace, e)
	l.mu.Unlock()
}

// SendRaw sends b (a whole UDP payload, ICRC included and already
// sealed, or deliberately not) and records it with note.
func (l *Link) SendRaw(b []byte, note string) error {
	cp := append([]byte(nil), b...)
	l.record(Event{At: l.Since(), Dir: Out, Raw: cp, Note: note})
	_, err := l.conn.WriteToUDPAddrPort(cp, l.flow.Dst)
	return err
}

// Build encodes h and payload into a new sealed packet.
func (l *Link) Build(h wire.Headers, payload []byte) ([]byte, error) {
	b := make([]byte, h.Len(len(payload)))
	if len(b) == 0 {
		return nil, fmt.Errorf("opcode %s cannot be encoded", h.Opcode)
	}
	if _, err := h.Encode(b, payload); err != nil {
		return nil, err
	}
	l.flow.Seal(b)
	return b, nil
}

// Send encodes, seals and sends one packet.
func (l *Link) Send(h wire.Headers, payload []byte, note string) error {
	b, err := l.Build(h, payload)
	if err != nil {
		return err
	}
	return l.SendRaw(b, note)
}

// Reseal recomputes the ICRC of b after a caller changed its bytes.
func (l *Link) Reseal(b []byte) { l.flow.Seal(b) }

// setAutoAck turns on acknowledging the peer's own requests.
func (l *Link) setAutoAck(ourQPN, peerQPN, peerPSN uint32) {
	l.mu.Lock()
	l.autoAck, l.ourQPN, l.peerQPN, l.ackPSN = true, ourQPN, peerQPN, peerPSN
	l.mu.Unlock()
}

// PeerMessages is how many complete messages the peer sent us (counted
// while auto-acknowledging).
func (l *Link) PeerMessages() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peerMsgs
}

func (l *Link) receive() {
	defer close(l.done)
	rev := l.flow.Reverse()
	oob := make([]byte, rxOOBLen)
	kt, stamped := l.clk.(kernelTimed)
	var prevAt time.Duration // the arrival of the peer's packet before
	for {
		buf := make([]byte, 65536)
		n, oobn, _, from, err := l.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if from.Addr().Unmap() != l.flow.Dst.Addr().Unmap() {
			continue // not our peer: nothing to judge
		}
		b := buf[:n:n]
		r := &Rx{At: l.Since()}
		// A packet is timed when it arrived, not when this goroutine got
		// to read it: on a loaded host the read can come tens of
		// milliseconds later, and a verdict that measures the peer's
		// timers between two packets (Q-SEQ-GOBACK's "driven by the NAK,
		// not its timer") was then misjudged (TestArrivalIsStampedByTheKernel).
		// The kernel's stamp is wall clock (arrivedAt bounds it); a
		// test's fake clock has no kernel, and its packets are timed as
		// read.
		if stamped {
			if lag, ok := arrivalLag(oob[:oobn], kt.wallNow()); ok {
				r.At = arrivedAt(r.At, lag, prevAt)
			}
		}
		prevAt = r.At
		ev := Event{At: r.At, Dir: In, Raw: b}
		if err := r.Pkt.Parse(b); err != nil {
			r.Err = err
			ev.Note = err.Error()
		} else if v, id := (wire.Flow{Src: netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), Dst: rev.Dst}).Verify(b); v != wire.ICRCOK {
			r.Err = errors.New("bad ICRC")
			ev.Note = "bad ICRC"
		} else {
			ev.ipID = id
			if pk := r.Pkt.BTH.PKey(); !pkeyMatches(pk) {
				r.Err = fmt.Errorf("P_Key %#x does not match the QP's %#x: dropped", pk, DefaultPKey)
				ev.Note = r.Err.Error()
			}
		}
		ev.dropped = r.Err != nil
		l.record(ev)
		if r.Err == nil {
			l.maybeAck(r)
		}
		select {
		case l.rx <- r:
		default: // a scenario that stopped listening: the trace has it
		}
	}
}

// gotPeerMsg counts one more message of the peer's and wakes its
// waiters; l.mu is held.
func (l *Link) gotPeerMsg() {
	l.peerMsgs++
	close(l.msgsMore)
	l.msgsMore = make(chan struct{})
}

// waitPeerMessages waits up to d on the link's clock (and ctx, and the
// link's closing) until the peer has sent n messages of its own.
func (l *Link) waitPeerMessages(ctx context.Context, n int, d time.Duration) bool {
	var t linkTimer
	for {
		l.mu.Lock()
		got, more := l.peerMsgs, l.msgsMore
		l.mu.Unlock()
		if got >= n {
			return true
		}
		if t == nil {
			// Armed once the count is read: a test's clock that sees it
			// armed knows the wait has begun.
			t = l.clk.NewTimer(d)
			defer t.Stop()
		}
		select {
		case <-more:
		case <-t.C():
			return false
		case <-ctx.Done():
			return false
		case <-l.done:
			return false
		}
	}
}

// maybeAck acknowledges a peer request when auto-ACK is on.
func (l *Link) maybeAck(r *Rx) {
	p := &r.Pkt
	l.mu.Lock()
	if !l.autoAck || p.Info.Flags&wire.FlagRequest == 0 || p.BTH.DestQP() != l.ourQPN {
		l.mu.Unlock()
		return
	}
	psn := p.BTH.PSN()
	if p.Info.Transport == wire.TransportUD {
		l.gotPeerMsg()
		l.mu.Unlock()
		return
	}
	var ack bool
	switch {
	case psn == l.ackPSN:
		l.ackPSN = (psn + 1) & 0xffffff
		if p.Info.Flags&(wire.FlagLast|wire.FlagOnly) != 0 {
			l.ackMSN = (l.ackMSN + 1) & 0xffffff
			l.gotPeerMsg()
		}
		ack = p.BTH.AckReq() || p.Info.Flags&(wire.FlagLast|wire.FlagOnly) != 0
	case psnBefore(psn, l.ackPSN):
		ack = true // a duplicate: re-acknowledge
		psn = (l.ackPSN - 1) & 0xffffff
	}
	msn := l.ackMSN
	peer := l.peerQPN
	l.mu.Unlock()
	if ack {
		h := wire.Headers{Opcode: wire.RCAck, PKey: DefaultPKey, DestQP: peer, PSN: psn,
			Syndrome: wire.ACKSyndrome(0x1f), MSN: msn}
		_ = l.Send(h, nil, "auto-ACK of the peer's own message")
	}
}

// Next waits up to d (and ctx, and the link's closing) for the first
// packet match accepts; other packets are dropped from the queue (they
// stay in the trace).
func (l *Link) Next(ctx context.Context, d time.Duration, match func(*Rx) bool) (*Rx, bool) {
	// What is queued first, without a timer: the timer is armed only when
	// the scenario has to wait, so a test's clock that sees it armed knows
	// the scenario has read everything that arrived.
	for queued := true; queued; {
		select {
		case r := <-l.rx:
			if match == nil || match(r) {
				return r, true
			}
		default:
			queued = false
		}
	}
	t := l.clk.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case r := <-l.rx:
			if match == nil || match(r) {
				return r, true
			}
		case <-t.C():
			return nil, false
		case <-ctx.Done():
			return nil, false
		case <-l.done:
			// Closed (by the runner, past the deadline): what was queued,
			// then nothing more will come.
			select {
			case r := <-l.rx:
				if match == nil || match(r) {
					return r, true
				}
				continue
			default:
			}
			return nil, false
		}
	}
}

// Collect gathers every packet match accepts for d (or until ctx ends).
func (l *Link) Collect(ctx context.Context, d time.Duration, match func(*Rx) bool) []*Rx {
	var out []*Rx
	t := l.clk.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case r := <-l.rx:
			if match == nil || match(r) {
				out = append(out, r)
			}
		case <-t.C():
			return out
		case <-ctx.Done():
			return out
		case <-l.done:
			for {
				select {
				case r := <-l.rx:
					if match == nil || match(r) {
						out = append(out, r)
					}
				default:
					return out
				}
			}
		}
	}
}

// Drain discards queued packets.
func (l *Link) Drain() {
	for {
		select {
		case <-l.rx:
		default:
			return
		}
	}
}

// pkeyMatches reports whether a packet with P_Key pk is for a QP of the
// tools' full-member P_Key 0xffff: the low 15 bits must be equal (a
// limited member 0x7fff matches a full one). A receiver drops any other
// (IBA 9.6.1.1.3; rxe_recv.c check_keys, pkey_match), so a peer's response
// with another P_Key answers nothing, whatever it says.
func pkeyMatches(pk uint16) bool { return pk&0x7fff == DefaultPKey&0x7fff }

// psnBefore reports a < b in 24-bit serial arithmetic.
func psnBefore(a, b uint32) bool {
	d := (b - a) & 0xffffff
	return d != 0 && d < 1<<23
}

// psnAdd is a + n modulo 2^24.
func psnAdd(a uint32, n int) uint32 { return uint32(int64(a)+int64(n)) & 0xffffff }
