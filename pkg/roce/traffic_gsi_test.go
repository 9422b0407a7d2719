package roce

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// reportSpy records the ReportTraffic calls its Conn is asked.
type reportSpy struct {
	transport.Conn
	mu    sync.Mutex
	calls []bool
}

func (s *reportSpy) ReportTraffic(on bool) error {
	s.mu.Lock()
	s.calls = append(s.calls, on)
	s.mu.Unlock()
	return s.Conn.(transport.TrafficReporter).ReportTraffic(on)
}

func (s *reportSpy) taken() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bool(nil), s.calls...)
}

// TestGSIAsksForReceivedTrafficOnlyOnIPv6: QP 1 has the Conn report
// received traffic only on a device with an IPv6 GID, where the CM
// answers an IPv6 peer's MADs with their traffic class; an IPv4-only
// device, whose answers take class 0 whatever arrived, keeps every
// datagram free of the control messages (review of the session's IPv6
// change, which had every rdma_cm device's RC traffic pay for them). UD
// QPs ask on either.
func TestGSIAsksForReceivedTrafficOnlyOnIPv6(t *testing.T) {
	for _, tc := range []struct {
		addr string
		typ  qp.Type
		want []bool
	}{
		{"10.0.0.1", qp.GSI, nil},
		{"fd00::1", qp.GSI, []bool{true, false}},
		{"10.0.0.1", qp.UD, []bool{true, false}},
	} {
		t.Run(tc.addr+"/"+tc.typ.String(), func(t *testing.T) {
			mn := transport.NewMemNetwork()
			a := netip.MustParseAddr(tc.addr)
			c, err := mn.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
			require.NoError(t, err)
			spy := &reportSpy{Conn: c}
			s := sideOn(t, spy, a, qp.RC, sideCap)
			cfg := qp.Config{Type: tc.typ, PD: s.pd, SendCQ: s.scq, RecvCQ: s.rcq, Cap: sideCap}
			if tc.typ == qp.GSI {
				cfg.Num = 1
			}
			q, err := s.e.CreateQP(cfg)
			require.NoError(t, err)
			require.NoError(t, s.e.DestroyQP(q))
			require.Equal(t, tc.want, spy.taken())
		})
	}
}
