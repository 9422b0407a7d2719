//go:build linux

package roce

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// rxTrafficSpy is a Conn over a real socket that has the kernel report
// each received datagram's TOS and TTL and records them with its opcode.
type rxTrafficSpy struct {
	transport.Conn
	mu  sync.Mutex
	got []sentTraffic
}

func (s *rxTrafficSpy) Receive(bufs [][]byte, sizes []int, eps []transport.Endpoint) (int, error) {
	n, err := s.Conn.Receive(bufs, sizes, eps)
	s.mu.Lock()
	for i := range n {
		s.got = append(s.got, sentTraffic{wire.Opcode(bufs[i][0]), eps[i].TrafficClass, eps[i].HopLimit})
	}
	s.mu.Unlock()
	return n, err
}

func (s *rxTrafficSpy) received() []sentTraffic {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sentTraffic(nil), s.got...)
}

// udpSide is a side on a loopback UDP socket of address addr (an
// ephemeral port), its received TOS and TTL recorded when spy.
func udpSide(t *testing.T, addr string, typ qp.Type, spy bool) (*side, *rxTrafficSpy, uint16) {
	t.Helper()
	a := netip.MustParseAddr(addr)
	c, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{a}})
	require.NoError(t, err)
	port := c.LocalAddrs()[0].Port()
	if !spy {
		return sideOn(t, c, a, typ, sideCap), nil, port
	}
	s := &rxTrafficSpy{Conn: c}
	require.NoError(t, c.(transport.TrafficReporter).ReportTraffic(true))
	return sideOn(t, s, a, typ, sideCap), s, port
}

// TestKernelCarriesTheAVsTOSAndTTLOverUDP: over real loopback sockets, a
// connection whose AVs have TrafficClass 0x68 / HopLimit 7 (a) and
// 0x28 / 9 (b) puts them in the IP header of every packet, as the
// receiving kernel reports them (IP_RECVTOS, IP_RECVTTL): a's WRITE, READ
// request and SEND, b's ACKs and READ responses. Their ICRCs verify (the
// operations complete). Before: TOS 0 and TTL 64 whatever the AV said.
func TestKernelCarriesTheAVsTOSAndTTLOverUDP(t *testing.T) {
	a, ra, pa := udpSide(t, "127.0.0.1", qp.RC, true)
	b, rb, pb := udpSide(t, "127.0.0.2", qp.RC, true)
	connectAV(t, a, b, qp.AddrVector{DGID: b.addr, DestPort: pb, TrafficClass: 0x68, HopLimit: 7})
	connectAV(t, b, a, qp.AddrVector{DGID: a.addr, DestPort: pa, TrafficClass: 0x28, HopLimit: 9})
	writeReadSend(t, a, b)
	requireEverySideTraffic(t, rb.received(), ra.received(), "the peer's kernel received it")
}

// TestUDGRHCarriesTheReceivedTOSAndTTL: a UD receive's GRH holds the
// received IPv4 header's TOS and TTL (rxe copies the header), with a
// valid checksum: the engine has its Conn report them while a UD QP
// exists. Before: TOS 0 and TTL 64 always.
func TestUDGRHCarriesTheReceivedTOSAndTTL(t *testing.T) {
	a, _, _ := udpSide(t, "127.0.0.1", qp.UD, false)
	b, _, pb := udpSide(t, "127.0.0.2", qp.UD, false)
	udReady(t, a)
	udReady(t, b)
	amr, _ := regMR(t, a, 256)
	bmr, dst := regMR(t, b, 256)
	for i, av := range []qp.AddrVector{
		{DGID: b.addr, DestPort: pb, TrafficClass: 0x68, HopLimit: 7},
		{DGID: b.addr, DestPort: pb}, // the defaults: TOS 0, TTL 64
	} {
		_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: 9, SGL: []qp.SGE{{Addr: bmr.IOVA(), Length: 256, LKey: bmr.LKey()}}}})
		require.NoError(t, err)
		_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRSend, Flags: qp.Signaled,
			SGL:       []qp.SGE{{Addr: amr.IOVA(), Length: 100, LKey: amr.LKey()}},
			RemoteQPN: b.q.Num(), RemoteQKey: 0x1234, AV: av}})
		require.NoError(t, err)
		require.Equal(t, qp.WCSuccess, waitWC(t, a.scq).Status)
		require.Equal(t, qp.WCSuccess, waitWC(t, b.rcq).Status)
		requireGRHTraffic(t, dst, av, i)
	}
}
