package conform

import (
	"context"
	"fmt"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// Short waits: how long a scenario waits for an answer that should come
// at once, and how long it listens for silence.
const (
	answerWait  = 1500 * time.Millisecond
	silenceWait = 300 * time.Millisecond
)

// Hdr is a request header to the peer's QP at our current PSN.
func (c *Conn) Hdr(op wire.Opcode) wire.Headers {
	return wire.Headers{Opcode: op, PKey: DefaultPKey, DestQP: c.PeerQPN, PSN: c.PSN}
}

// next returns the current PSN and advances it by n.
func (c *Conn) next(n int) uint32 {
	p := c.PSN
	c.PSN = psnAdd(c.PSN, n)
	return p
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// WriteOnly sends one RDMA WRITE ONLY of data at the peer buffer's
// offset off, and returns its PSN.
func (c *Conn) WriteOnly(data []byte, off uint64, ackReq bool, note string) (uint32, error) {
	h := c.Hdr(wire.RCWriteOnly)
	h.VA, h.RKey, h.DMALen, h.AckReq = c.VA+off, c.RKey, uint32(len(data)), ackReq
	c.next(1)
	return h.PSN, c.Send(h, data, note)
}

// segments splits n bytes into MTU-sized packets (at least one).
func (c *Conn) segments(n int) int {
	if n == 0 {
		return 1
	}
	return (n + c.MTU - 1) / c.MTU
}

// WriteMsg sends data as FIRST/MIDDLE/LAST (or ONLY) with AckReq on the
// last packet, and returns the first and last PSN.
func (c *Conn) WriteMsg(data []byte, off uint64, note string) (first, last uint32, err error) {
	n := c.segments(len(data))
	if n == 1 {
		p, err := c.WriteOnly(data, off, true, note)
		return p, p, err
	}
	first = c.PSN
	for i := range n {
		seg := data[i*c.MTU : min(len(data), (i+1)*c.MTU)]
		var h wire.Headers
		switch i {
		case 0:
			h = c.Hdr(wire.RCWriteFirst)
			h.VA, h.RKey, h.DMALen = c.VA+off, c.RKey, uint32(len(data))
		case n - 1:
			h = c.Hdr(wire.RCWriteLast)
			h.AckReq = true
		default:
			h = c.Hdr(wire.RCWriteMiddle)
		}
		last = c.next(1)
		if err = c.Send(h, seg, note); err != nil {
			return
		}
	}
	return first, last, nil
}

// SendLen is the length of a SEND to the peer: the tool's message size
// when Config.SendSize is set (rxed perf send checks it), else n.
func (c *Conn) SendLen(n int) int {
	if c.Cfg.SendSize > 0 && c.Tool == IBSendBW {
		return c.Cfg.SendSize
	}
	return n
}

// SendMsg sends data as SEND FIRST/MIDDLE/LAST (or ONLY), AckReq on the
// last packet.
func (c *Conn) SendMsg(data []byte, note string) (first, last uint32, err error) {
	return c.sendMsg(data, true, note)
}

// sendMsg is SendMsg with the last packet's AckReq chosen.
func (c *Conn) sendMsg(data []byte, ackReq bool, note string) (first, last uint32, err error) {
	n := c.segments(len(data))
	first = c.PSN
	for i := range n {
		seg := data[i*c.MTU : min(len(data), (i+1)*c.MTU)]
		op := wire.RCSendMiddle
		switch {
		case n == 1:
			op = wire.RCSendOnly
		case i == 0:
			op = wire.RCSendFirst
		case i == n-1:
			op = wire.RCSendLast
		}
		h := c.Hdr(op)
		h.AckReq = ackReq && i == n-1
		last = c.next(1)
		if err = c.Send(h, seg, note); err != nil {
			return
		}
	}
	return first, last, nil
}

// ReadReq sends an RDMA READ of n bytes at off and returns its PSN; the
// PSN advances by the number of response packets.
func (c *Conn) ReadReq(off uint64, n int, note string) (uint32, error) {
	h := c.Hdr(wire.RCReadRequest)
	h.VA, h.RKey, h.DMALen = c.VA+off, c.RKey, uint32(n)
	c.next(c.segments(n))
	return h.PSN, c.Send(h, nil, note)
}

// Atomic sends a FETCH_ADD (cmp ignored) or COMPARE_SWAP at off.
func (c *Conn) Atomic(op wire.Opcode, off uint64, swapAdd, cmp uint64, note string) (uint32, error) {
	h := c.Hdr(op)
	h.VA, h.RKey, h.SwapAdd, h.Compare = c.VA+off, c.RKey, swapAdd, cmp
	c.next(1)
	return h.PSN, c.Send(h, nil, note)
}

// UDSend sends one UD SEND ONLY with qkey.
func (c *Conn) UDSend(data []byte, qkey uint32, note string) (uint32, error) {
	h := c.Hdr(wire.UDSendOnly)
	h.QKey, h.SrcQP = qkey, c.OurQPN
	c.next(1)
	return h.PSN, c.Send(h, data, note)
}

// ProbeKind is the harmless request a tool accepts, used by scenarios
// that only need "a request the peer executes".
func (c *Conn) probeOp() string {
	switch {
	case c.Tool == IBWriteBW:
		return "WRITE"
	case c.Tool == IBReadBW:
		return "READ"
	case c.Tool == IBAtomicBW:
		return "FETCH_ADD"
	}
	return "SEND"
}

// Probe sends the tool's harmless request (an 8-byte WRITE, READ, a
// FETCH_ADD of 0 or an 8-byte SEND) and returns the PSN whose response
// decides (a SEND of several packets: its last).
func (c *Conn) Probe(note string) (uint32, error) {
	switch c.probeOp() {
	case "WRITE":
		return c.WriteOnly(pattern(8, 1), 0, true, note)
	case "READ":
		return c.ReadReq(0, 8, note)
	case "FETCH_ADD":
		return c.Atomic(wire.RCFetchAdd, 0, 0, 0, note)
	}
	if c.Tool.UD() {
		return c.UDSend(pattern(8, 1), UDQKey, note)
	}
	_, p, err := c.SendMsg(pattern(c.SendLen(8), 1), note)
	return p, err
}

// ProbeHeaders are the headers Probe would send, for scenarios that
// corrupt them before sending; the PSN is not advanced.
func (c *Conn) ProbeHeaders() (wire.Headers, []byte) {
	switch c.probeOp() {
	case "WRITE":
		h := c.Hdr(wire.RCWriteOnly)
		h.VA, h.RKey, h.DMALen, h.AckReq = c.VA, c.RKey, 8, true
		return h, pattern(8, 9)
	case "READ":
		h := c.Hdr(wire.RCReadRequest)
		h.VA, h.RKey, h.DMALen = c.VA, c.RKey, 8
		return h, nil
	case "FETCH_ADD":
		h := c.Hdr(wire.RCFetchAdd)
		h.VA, h.RKey = c.VA, c.RKey
		return h, nil
	}
	if c.Tool.UD() {
		h := c.Hdr(wire.UDSendOnly)
		h.QKey, h.SrcQP = UDQKey, c.OurQPN
		return h, pattern(8, 9)
	}
	h := c.Hdr(wire.RCSendOnly)
	h.AckReq = true
	return h, pattern(8, 9)
}

// IsResponse accepts the peer's responses to our QP (ACK, NAK, RNR, READ
// responses, atomic ACKs), not its own requests.
func (c *Conn) IsResponse(r *Rx) bool {
	return r.Err == nil && r.Pkt.Info.Flags&wire.FlagResponse != 0 && r.Pkt.BTH.DestQP() == c.OurQPN
}

// Response waits for the next response.
func (c *Conn) Response(ctx context.Context, d time.Duration) (*Rx, bool) {
	return c.Next(ctx, d, c.IsResponse)
}

// ResponseTo waits for a response with PSN psn (others are skipped).
func (c *Conn) ResponseTo(ctx context.Context, psn uint32, d time.Duration) (*Rx, bool) {
	return c.Next(ctx, d, func(r *Rx) bool { return c.IsResponse(r) && r.PSN() == psn })
}

// PeerRequest waits for a request the peer itself sends (pingpong echo).
func (c *Conn) PeerRequest(ctx context.Context, d time.Duration) (*Rx, bool) {
	return c.Next(ctx, d, func(r *Rx) bool {
		return r.Err == nil && r.Pkt.Info.Flags&wire.FlagRequest != 0 && r.Pkt.BTH.DestQP() == c.OurQPN
	})
}

// ProbeAnswered sends the probe and checks the peer answers it the way
// the probe's kind requires (ACK, READ response or atomic ACK with the
// probe's PSN; for UD, the echo): "the peer keeps serving". The answer's
// AETH must carry MSN msn (msn < 0: any), the messages the peer has
// completed with the probe. It returns a short description of the
// deciding packet.
func (c *Conn) ProbeAnswered(ctx context.Context, msn int) (string, bool) {
	if c.Tool.UD() {
		before := c.PeerMessages()
		if _, err := c.Probe("probe: a valid request"); err != nil {
			return err.Error(), false
		}
		if !c.waitPeerMessages(ctx, before+1, answerWait) {
			return fmt.Sprintf("no echo to a valid UD SEND (peer sent %d before)", before), false
		}
		return fmt.Sprintf("the valid UD SEND was echoed (peer message %d)", before+1), true
	}
	psn, err := c.Probe("probe: a valid request")
	if err != nil {
		return err.Error(), false
	}
	r, ok := c.ResponseTo(ctx, psn, answerWait)
	if !ok {
		return fmt.Sprintf("no response to the valid probe %s psn=%#x", c.probeOp(), psn), false
	}
	if s := r.Syn(); r.Pkt.AETH != nil && s.Kind() != wire.SynACK {
		return "the valid probe got " + r.String(), false
	}
	if why := msnWrong(r, uint32(msn)); msn >= 0 && why != "" {
		return "the valid probe's answer " + why, false
	}
	return "probe answered: " + r.String(), true
}

// topUp lets a send tool's server reach its iteration count so it ends its
// run: ib_send_bw needs PeerIters messages, a pingpong server as many
// round trips.
func (c *Conn) topUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	iters := c.Cfg.PeerIters
	if c.Tool.Echoes() {
		for c.PeerMessages() < iters {
			if ctx.Err() != nil {
				return fmt.Errorf("the peer did not finish its %d round trips (%d done)", iters, c.PeerMessages())
			}
			if _, err := c.Probe("top-up: lets the peer's tool finish"); err != nil {
				return err
			}
			before := c.PeerMessages()
			c.waitPeerMessages(ctx, before+1, 200*time.Millisecond)
			c.Drain() // the round trip's packets: in the trace, judged by nobody
		}
		return nil
	}
	// ib_send_bw: the ACKs' MSN says how many messages the peer executed;
	// an ACK the link dropped says nothing.
	done := 0
	accepted(c.Trace(), func(p *wire.Packet) {
		if p.AETH != nil && p.AETH.Syndrome().Kind() == wire.SynACK {
			done = max(done, int(p.AETH.MSN()))
		}
	})
	for left := iters - done; left > 0; {
		n := min(left, 32)
		var last uint32
		for i := range n {
			var err error
			if _, last, err = c.sendMsg(pattern(c.SendLen(8), 3), i == n-1, "top-up: lets the peer's tool finish"); err != nil {
				return err
			}
		}
		r, ok := c.Next(ctx, 2*time.Second, func(r *Rx) bool {
			return c.IsResponse(r) && (r.PSN() == last || r.Syn().Kind() != wire.SynACK)
		})
		if !ok || r.Syn().Kind() != wire.SynACK {
			return fmt.Errorf("the peer stopped accepting SENDs (%d of its %d messages done)", iters-left, iters)
		}
		left -= n
	}
	return nil
}
