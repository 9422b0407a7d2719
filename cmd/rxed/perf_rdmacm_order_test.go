package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// wireEvent is one datagram a side sent: a CM MAD (attr != 0) or a
// control-connection SEND (its payload length).
type wireEvent struct {
	from string // "server" or "client"
	attr uint16 // the MAD's attribute ID (mad.AttrREQ ...), 0: no MAD
	send int    // RC SEND_ONLY: its payload length; -1: none
}

func (e wireEvent) String() string {
	if e.attr != 0 {
		return fmt.Sprintf("%s MAD 0x%04x", e.from, e.attr)
	}
	return fmt.Sprintf("%s SEND %d", e.from, e.send)
}

// wireOrder records, in one order for both sides, what they send on an
// in-memory network. MemNetwork delivers inside Send, so a datagram is
// recorded before its receiver can react to it: a reaction is always
// recorded after its cause. A SEND is recorded once: its retransmissions
// (same sender, QP and PSN; a loaded machine under -race delays an ACK
// past the retransmit timer) are not new messages.
type wireOrder struct {
	mu     sync.Mutex
	events []wireEvent
	sent   map[sendID]bool
}

// sendID names one RC SEND of a side: its destination QP and PSN.
type sendID struct {
	from     string
	qpn, psn uint32
}

type wireOrderConn struct {
	transport.Conn
	side string
	log  *wireOrder
}

func (c *wireOrderConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	c.log.mu.Lock()
	for _, b := range bufs {
		var p wire.Packet
		if p.Parse(b) != nil {
			continue
		}
		switch p.Opcode {
		case wire.UDSendOnly:
			if h, err := mad.ParseHeader(p.Payload); err == nil {
				c.log.events = append(c.log.events, wireEvent{from: c.side, attr: h.AttrID, send: -1})
			}
		case wire.RCSendOnly:
			id := sendID{c.side, p.BTH.DestQP(), p.BTH.PSN()}
			if c.log.sent[id] {
				continue // a retransmission
			}
			if c.log.sent == nil {
				c.log.sent = map[sendID]bool{}
			}
			c.log.sent[id] = true
			c.log.events = append(c.log.events, wireEvent{from: c.side, send: len(p.Payload)})
		}
	}
	c.log.mu.Unlock()
	return c.Conn.Send(bufs, ep)
}

func (w *wireOrder) snapshot() []wireEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]wireEvent(nil), w.events...)
}

// runPerfOnMem runs rxed perf with args (parsePerf's) on a device of net
// at ip, recording what it sends in log.
func runPerfOnMem(t *testing.T, net *transport.MemNetwork, log *wireOrder, side, ip string, args []string) (stdout, stderr *syncBuffer, done <-chan error) {
	t.Helper()
	stdout, stderr = newSyncBuffer(), newSyncBuffer()
	o, code, ok := parsePerf(append(args, "--addr", ip), stderr)
	require.True(t, ok, "parsePerf %v: code %d: %s", args, code, stderr.String())
	c, err := net.Listen(netip.AddrPortFrom(netip.MustParseAddr(ip), transport.RoCEv2Port))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: &wireOrderConn{Conn: c, side: side, log: log}, Workers: 1})
	require.NoError(t, err)
	// No linger (0): a side's device closes when its run ends, the
	// server's without sitting out the timewait of the DREQs it answered.
	require.NoError(t, rdmacm.Enable(dev, &rdmacm.Config{}))
	r := &perfRun{o: o, en: &engine{dev: dev, flags: &o.ef}, stdout: stdout, stderr: stderr}
	ch := make(chan error, 1)
	go func() {
		err := r.setup()
		if err == nil {
			err = r.rdmaCMSession(context.Background())
		}
		if cerr := closeEngineAndMemory(r.en, r.mr, r.mapm); err == nil {
			err = cerr
		}
		ch <- err
	}()
	return stdout, stderr, ch
}

// TestPerfRDMACMClientDialsTestQPsAfterTheServersAnswer: rxed perf -R's
// client sends its first test REQ only once the server answered the hand
// shake that precedes the test connections (perftest's
// create_rdma_cm_connection: ctx_hand_shake, then rdma_cm_client_connection;
// frames 20-24 of ../shared/pcaps/perftest_write_bw_rc_4096_rdmacm.pcap),
// and rxed's server, whose listener is up from the control connection on,
// answers it with its REP: no REJ on the wire. An interop run (session AJ's
// TOS cells: rxed client against ib_write_bw -R, REJ 8 in frames 24-25) met
// perftest's server, which calls rdma_listen only after that answer, so
// no event tells a client when it listens (perf_rdmacm.go); a server made
// to listen as late (closing its listener after the control connection,
// listening again after the answer) makes this test fail on the REJ.
func TestPerfRDMACMClientDialsTestQPsAfterTheServersAnswer(t *testing.T) {
	t.Parallel()
	net := transport.NewMemNetwork()
	log := &wireOrder{}
	common := []string{"-R", "-s", "4096", "-n", "20", "-q", "2", "--timeout", "20s", "--progress", "0"}
	sout, serr, sdone := runPerfOnMem(t, net, log, "server", "10.9.1.1", append([]string{"write"}, common...))
	sout.waitFor(t, "Waiting for client", 20*time.Second)
	cout, cerr, cdone := runPerfOnMem(t, net, log, "client", "10.9.1.2", append(append([]string{"write"}, common...), "10.9.1.1"))
	var serrV, cerrV error
	require.True(t, testenv.ReturnsWithin(func() { cerrV = <-cdone }, 60*time.Second), "the client did not end: %s", cerr.String())
	require.True(t, testenv.ReturnsWithin(func() { serrV = <-sdone }, 60*time.Second), "the server did not end: %s", serr.String())
	require.NoError(t, cerrV, "client: %s\n%s", cout.String(), cerr.String())
	require.NoError(t, serrV, "server: %s\n%s", sout.String(), serr.String())
	require.Regexp(t, bwRow(4096, 40), cout.String())

	ev := log.snapshot()
	var order strings.Builder
	for i, e := range ev {
		fmt.Fprintf(&order, "%d %v\n", i+1, e)
	}
	// The control connection: the client's REQ, then version, cycle
	// buffer, cache line, MTU and the first hand shake, each the client's
	// SEND answered by the server's.
	reqs := 0
	answers := 0
	for i, e := range ev {
		require.NotEqual(t, uint16(mad.AttrREJ), e.attr, "a REJ on the wire (event %d):\n%s", i+1, order.String())
		if e.from == "server" && e.send >= 0 {
			answers++
		}
		if e.from != "client" || e.attr != mad.AttrREQ {
			continue
		}
		reqs++
		if reqs == 2 {
			// The first test REQ: after the server's fifth SEND, its
			// answer to the hand shake, which must be the 56-byte key.
			require.Equal(t, 5, answers, "the first test REQ (event %d) after %d of the server's SENDs, want 5 (the hand shake's answer):\n%s",
				i+1, answers, order.String())
			require.Equal(t, wireEvent{from: "server", send: 56}, lastSend(ev[:i], "server"), order.String())
		}
	}
	require.Equal(t, 3, reqs, "REQs: the control connection and two test QPs:\n%s", order.String())
	require.False(t, bytes.Contains([]byte(cerr.String()), []byte("rejected")), cerr.String())
}

// lastSend is the last SEND side sent in ev.
func lastSend(ev []wireEvent, side string) wireEvent {
	for i := len(ev) - 1; i >= 0; i-- {
		if ev[i].from == side && ev[i].send >= 0 {
			return ev[i]
		}
	}
	return wireEvent{}
}
