package rdmacm_test

import (
	"context"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestAcceptEstablishedByTheFirstRequestWhenTheRTUIsLost: the client's RTU
// is held back (lost, as far as the server knows) and the CM clocks never
// move, so the server's REP is never retransmitted. The client's first
// SEND reaches the server's QP, whose COMM_EST establishes the CM ID
// (ib_cm_notify): Accept returns, the SEND's data is in the receive
// buffer with its completion, and the REP's retransmission timer is gone.
// The RTU arriving after all is a harmless duplicate, and the connection
// carries data both ways.
//
// Bug (CM task, session AG): Accept waited for the REP's retransmission
// (4 s with rdma_cm's timeouts) while the client, connected, had already
// sent; here, with the clock stopped, it waited for good.
func TestAcceptEstablishedByTheFirstRequestWhenTheRTUIsLost(t *testing.T) {
	net := transport.NewMemNetwork()
	tap := &madTap{hold: func(m mad.Message) bool { _, rtu := m.(*mad.RTU); return rtu }}
	srv := openMemHost(t, net, "10.11.0.1", nil)
	cli := openMemHost(t, net, "10.11.0.2", tap)
	fc := cmtest.NewFakeClock(time.Unix(3_000_000, 0))
	require.NoError(t, rdmacm.Enable(srv.dev, &rdmacm.Config{Clock: fc}))
	require.NoError(t, rdmacm.Enable(cli.dev, &rdmacm.Config{Clock: fc}))
	ctx := testCtx(t)

	l, err := rdmacm.Listen(srv.dev, ap("10.11.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	served := serveOne(ctx, srv, l, nil) // posts receive 1 before it accepts

	cq := cli.qp(ib.RC)
	cc, err := rdmacm.Dial(ctx, cq, ap("10.11.0.1:7471"), nil)
	require.NoError(t, err)
	// Dial returns once the CM has handed the RTU to QP 1, which may
	// send it a little later.
	require.Eventually(t, func() bool { return tap.heldCount() == 1 }, 20*time.Second, time.Millisecond,
		"the client's RTU is held back")

	msg := []byte("sent right after a lost RTU")
	copy(cli.buf, msg)
	require.NoError(t, cq.PostSend(ib.SendWR{ID: 7, Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{cli.sge(0, len(msg))}}))

	var sc *rdmacm.Conn
	wait, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	select {
	case a := <-served:
		require.NoError(t, a.err)
		sc = a.conn
	case <-wait.Done():
		t.Fatal("Accept still waits for the RTU: the SEND that arrived did not establish the connection")
	}
	wc := srv.wc(ctx)
	require.Equal(t, ib.WCSuccess.String(), wc.Status.String())
	require.Equal(t, uint64(1), wc.ID)
	require.Equal(t, uint32(len(msg)), wc.ByteLen)
	require.Equal(t, msg, srv.buf[:len(msg)])
	require.Equal(t, ib.WCSuccess.String(), cli.wc(ctx).Status.String())
	require.Zero(t, fc.Pending(), "the REP's retransmission (and every other CM timer) stopped")
	require.Zero(t, rdmacm.Counters(srv.dev)["tx_retries_rep"])

	// The RTU arrives late: a duplicate the CM counts and drops.
	require.NoError(t, tap.release())
	require.Eventually(t, func() bool { return rdmacm.Counters(srv.dev)["rx_dup_rtu"] == 1 },
		20*time.Second, time.Millisecond, "the late RTU never reached the server's CM")
	select {
	case ev := <-sc.Events():
		t.Fatalf("the late RTU gave the server's connection %v", ev.Type)
	case ev := <-cc.Events():
		t.Fatalf("the client's connection got %v", ev.Type)
	default:
	}

	// Both ways still.
	require.NoError(t, cq.PostRecv(ib.RecvWR{ID: 8, SGL: []ib.SGE{cli.sge(1024, 64)}}))
	copy(srv.buf[2048:], "back")
	require.NoError(t, sc.QP().PostSend(ib.SendWR{ID: 9, Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{srv.sge(2048, 4)}}))
	require.Equal(t, ib.WCSuccess.String(), srv.wc(ctx).Status.String())
	wc = cli.wc(ctx)
	require.Equal(t, uint64(8), wc.ID)
	require.Equal(t, "back", string(cli.buf[1024:1028]))
	require.NoError(t, cc.Disconnect(ctx))
}
