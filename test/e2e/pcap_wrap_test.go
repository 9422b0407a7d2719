package e2e

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"

	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// dropFirst drops the first datagram of one opcode and counts the rest.
type dropFirst struct {
	op              wire.Opcode
	dropped, passed int
}

// pass reports whether a datagram whose BTH starts b goes on.
func (f *dropFirst) pass(b []byte) bool {
	switch {
	case wire.BTH(b).Opcode() != f.op:
		return true
	case f.dropped == 0:
		f.dropped++
		return false
	}
	f.passed++
	return true
}

// dropFirstConn is a Wrap that drops, as the daemon's traffic accounting
// does, the first datagram it is given to send with one opcode and the
// first it receives with another.
type dropFirstConn struct {
	*transport.RxFilterConn
	gs transport.GatherSender

	mu        sync.Mutex
	tx, rx    dropFirst
	sawGather bool
}

func newDropFirstConn(inner transport.Conn, tx, rx wire.Opcode) *dropFirstConn {
	d := &dropFirstConn{tx: dropFirst{op: tx}, rx: dropFirst{op: rx}}
	d.RxFilterConn = transport.NewRxFilterConn(inner, d)
	d.gs, _ = inner.(transport.GatherSender)
	return d
}

func (d *dropFirstConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	d.mu.Lock()
	var keep [][]byte
	for _, b := range bufs {
		if d.tx.pass(b) {
			keep = append(keep, b)
		}
	}
	d.mu.Unlock()
	return d.RxFilterConn.Send(keep, ep)
}

func (d *dropFirstConn) SendGather(dgrams []transport.Gather, ep transport.Endpoint) error {
	d.mu.Lock()
	d.sawGather = true
	var keep []transport.Gather
	for _, g := range dgrams {
		if d.tx.pass(g[0]) {
			keep = append(keep, g)
		}
	}
	d.mu.Unlock()
	if d.gs == nil {
		bufs := make([][]byte, len(keep))
		for i := range keep {
			bufs[i] = keep[i].AppendTo(nil)
		}
		return d.RxFilterConn.Send(bufs, ep)
	}
	return d.gs.SendGather(keep, ep)
}

func (d *dropFirstConn) FilterRx(b transport.RxBatch) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return b.Partition(d.rx.pass)
}

// captureOpcodes reads a device's capture, checks that every frame is
// RoCEv2 with an ICRC that verifies, and counts the opcodes self sent
// and those it received.
func captureOpcodes(t *testing.T, capture []byte, self netip.Addr) (sent, rcvd map[wire.Opcode]int) {
	t.Helper()
	frames, err := wirepcap.NewReader(bytes.NewReader(capture))
	require.NoError(t, err)
	sent, rcvd = map[wire.Opcode]int{}, map[wire.Opcode]int{}
	for {
		fr, err := frames.Next()
		if err != nil {
			break
		}
		var u wirepcap.UDPFrame
		require.NoError(t, wirepcap.DissectUDP(layers.LinkType(fr.LinkType), fr.Data, &u))
		require.Equal(t, uint16(transport.RoCEv2Port), u.Dst.Port())
		require.Equal(t, wire.ICRCOK, wire.VerifyICRC(u.IP, u.UDP, u.Payload), "frame %d", fr.Number)
		var p wire.Packet
		require.NoError(t, p.Parse(u.Payload))
		if u.Src.Addr() == self {
			sent[p.Opcode]++
		} else {
			rcvd[p.Opcode]++
		}
	}
	return sent, rcvd
}

// TestPcapRecordsBeneathWrap: a device's capture sits between Fault and
// Wrap, so it shows what left and what arrived, not what a Wrap refused to
// send. The daemon's Wrap drops what a session's send budget does not
// allow; with the capture outside it, `rxed serve --pcap` recorded those
// datagrams as sent (to a peer the budget was protecting) though none
// left. Here a Wrap drops the first WRITE it is given and the first ACK
// that arrives: the capture holds the WRITEs that left and both ACKs,
// and the engine still sends in pieces through the recorder.
func TestPcapRecordsBeneathWrap(t *testing.T) {
	net := transport.NewMemNetwork()
	a := netip.MustParseAddr("10.2.1.1")
	c, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
	require.NoError(t, err)
	var capture bytes.Buffer
	var wrapped *dropFirstConn
	na := newNode(t, ib.Config{Conn: c, Pcap: &capture, Workers: 2, Wrap: func(inner transport.Conn) (transport.Conn, error) {
		wrapped = newDropFirstConn(inner, wire.RCWriteOnly, wire.RCAck)
		return wrapped, nil
	}}, a, nodeOpts{})
	nb := newMemNode(t, net, "10.2.1.2", nodeOpts{})
	o := qpOpts{mtu: ib.MTU1024, timeout: 8, retry: 7}
	qa, qb := na.createQP(o), nb.createQP(o)
	connectQPs(t, na, qa, nb, qb, o)
	fill(na.buf[:512], 3)
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 0, 512)}, RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()}))
	waitOK(t, na.scq, 1, ib.WCRDMAWrite)
	require.Equal(t, na.buf[:512], nb.buf[:512])
	require.NoError(t, na.dev.Close())

	wrapped.mu.Lock()
	tx, rx, gathered := wrapped.tx, wrapped.rx, wrapped.sawGather
	wrapped.mu.Unlock()
	require.Equal(t, 1, tx.dropped, "the Wrap dropped the first WRITE")
	require.Equal(t, 1, rx.dropped, "the Wrap dropped the first ACK")
	require.True(t, gathered, "the engine sent in pieces through the Wrap and the recorder")

	sent, rcvd := captureOpcodes(t, capture.Bytes(), a)
	require.Equal(t, tx.passed, sent[wire.RCWriteOnly], "WRITEs in the capture (sent) against those that left")
	require.Equal(t, rx.dropped+rx.passed, rcvd[wire.RCAck], "ACKs in the capture (received) against those that arrived")
}
