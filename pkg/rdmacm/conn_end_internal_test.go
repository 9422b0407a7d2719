package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// connectedPair dials a listener on a fresh pair of memory devices and
// returns the active Conn, the passive one and the active device.
func connectedPair(t *testing.T, srvIP, cliIP string) (cli, srv *Conn, cliDev *ib.Device) {
	t.Helper()
	net := transport.NewMemNetwork()
	sdev, cdev := MemDevice(t, net, srvIP), MemDevice(t, net, cliIP)
	l, err := Listen(sdev, netip.AddrPortFrom(netip.MustParseAddr(srvIP), 7471), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	newQP := func(dev *ib.Device) *ib.QP { return rcQP(t, dev) }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	accepted := make(chan *Conn, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err != nil {
			accepted <- nil
			return
		}
		c, _ := r.Accept(ctx, newQP(sdev), nil)
		accepted <- c
	}()
	cli, err = Dial(ctx, newQP(cdev), l.Addr(), nil)
	require.NoError(t, err)
	srv = <-accepted
	require.NotNil(t, srv)
	return cli, srv, cdev
}

// rcQP creates an RC QP in RESET on dev, with a PD and a CQ of its own.
func rcQP(t *testing.T, dev *ib.Device) *ib.QP {
	t.Helper()
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(64)
	require.NoError(t, err)
	q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	return q
}

// waitEnded waits for c to end and returns its events so far.
func waitEnded(t *testing.T, c *Conn) []Event {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the connection never ended (CM state %v)", c.id.State())
	}
	var evs []Event
	for {
		select {
		case ev := <-c.events:
			evs = append(evs, ev)
		default:
			return evs
		}
	}
}

// TestStaleConnectionDREQMovesTheQPToError: the peer reuses (CA GUID,
// QPN) of our established connection in a new REQ, so it has forgotten
// the connection (cm_match_req): our CM refuses the REQ (REJ 10) and ends
// the old connection with a DREQ of its own. The Conn must then end as
// every ended connection does, with its QP in ERR, so that the old QP
// stops sending to a QPN that now belongs to another connection.
//
// Bug (found by the CM audit, session AF): onEvent assumed an
// EventDisconnected always answered Conn.Disconnect, which had already
// moved the QP to ERR; the DREQ the CM sends itself (stale connection,
// in onREQ and onREP) ended the Conn with its QP left in RTS, and a later
// Disconnect was a no-op.
func TestStaleConnectionDREQMovesTheQPToError(t *testing.T) {
	cli, srv, cdev := connectedPair(t, "10.0.7.1", "10.0.7.2")
	id := cli.id
	// The server's CA GUID and QPN in a REQ from a new comm ID.
	req := &mad.REQ{LocalCommID: id.RemoteCommID() ^ 0x5a5a5a5a, ServiceID: mad.ServiceID(mad.PortSpaceTCP, 7471),
		LocalCAGUID: id.RemoteCAGUID(), LocalQPN: id.RemoteQPN(), StartingPSN: 1,
		LocalCMResponseTimeout: 20, RemoteCMResponseTimeout: 20, MaxCMRetries: 15, PKey: 0xFFFF, PathMTU: 3,
		Primary: mad.Path{LocalGID: id.RemoteAddr(), RemoteGID: id.LocalAddr(), LocalACKTimeout: 19, HopLimit: 64}}
	b, err := mad.Marshal(0x1234, req)
	require.NoError(t, err)
	running(cdev).cm.HandleMAD(id.RemoteAddr(), id.LocalAddr(), b)

	evs := waitEnded(t, cli)
	require.ErrorIs(t, cli.Err(), ErrDisconnected)
	require.NotEmpty(t, evs)
	require.Equal(t, EventDisconnected, evs[0].Type)
	require.Equal(t, ib.QPSErr, cli.QP().State(), "the stale connection's QP still sends")
	waitEnded(t, srv)
	require.Equal(t, ib.QPSErr, srv.QP().State())
}

// TestREJOnEstablishedConnectionEndsIt: a REJ for an established
// connection (the passive side gave up in REP_SENT after our RTU was
// lost: an rdma_reject or rdma_destroy_id there sends one) ends the
// connection: cm.c puts the ID in timewait and rdma_cm moves the QP to
// ERR and reports RDMA_CM_EVENT_REJECTED (cma_ib_handler).
//
// Bug (found by the CM audit, session AF): once established, onEvent
// dropped every event but DREQ, DREP and timewait exit; after a REJ the
// Conn stayed up for good, its QP in RTS, while its CM ID went through
// timewait and was gone.
func TestREJOnEstablishedConnectionEndsIt(t *testing.T) {
	cli, _, cdev := connectedPair(t, "10.0.8.1", "10.0.8.2")
	id := cli.id
	rej := &mad.REJ{LocalCommID: id.RemoteCommID(), RemoteCommID: id.LocalCommID(),
		MessageRejected: mad.REJMsgOther, Reason: mad.REJConsumerDefined, PrivateData: []byte("bye")}
	b, err := mad.Marshal(0x77, rej)
	require.NoError(t, err)
	running(cdev).cm.HandleMAD(id.RemoteAddr(), id.LocalAddr(), b)

	evs := waitEnded(t, cli)
	var re *RejectError
	require.True(t, errors.As(cli.Err(), &re), "Err %v", cli.Err())
	require.Equal(t, mad.REJConsumerDefined, re.Reason)
	require.NotEmpty(t, evs)
	require.Equal(t, EventDisconnected, evs[0].Type)
	require.True(t, errors.As(evs[0].Err, &re))
	require.Equal(t, ib.QPSErr, cli.QP().State())
}

// TestFailedAcceptLeavesTheQPInError: an Accept that fails after it moved
// its QP (here: the REP is out and the ctx ends before any RTU) leaves
// the QP in ERR, as rdma_accept's failure path does (cma_modify_qp_err):
// it must not keep sending to a peer that never became connected.
//
// Bug (found by the CM audit, session AF; fixed in the same session): a
// failed handshake ended the Conn and destroyed its CM ID but left the
// QP in RTS, pointed at the peer.
func TestFailedAcceptLeavesTheQPInError(t *testing.T) {
	const srvIP, cliIP = "10.0.9.1", "10.0.9.2"
	net := transport.NewMemNetwork()
	sdev := MemDevice(t, net, srvIP)
	srv, cli := netip.MustParseAddr(srvIP), netip.MustParseAddr(cliIP)
	l, err := Listen(sdev, netip.AddrPortFrom(srv, 7471), nil)
	require.NoError(t, err)
	defer l.Close()
	q := rcQP(t, sdev)

	// A REQ from a peer that will never send the RTU (no device there).
	hdr := mad.CMAHeader{IPVersion: 4, SrcPort: 40000, Src: cli, Dst: srv}
	req := &mad.REQ{LocalCommID: 0x1111, ServiceID: mad.ServiceID(mad.PortSpaceTCP, 7471),
		LocalCAGUID: 0xabcdef, LocalQPN: 0x1234, StartingPSN: 1, ResponderResources: 1, InitiatorDepth: 1,
		LocalCMResponseTimeout: 20, RemoteCMResponseTimeout: 20, MaxCMRetries: 15, PKey: 0xFFFF, PathMTU: 3,
		RetryCount: 7, RNRRetryCount: 7,
		Primary:     mad.Path{LocalGID: netip.AddrFrom16(cli.As16()), RemoteGID: netip.AddrFrom16(srv.As16()), LocalACKTimeout: 19, HopLimit: 64},
		PrivateData: hdr.Append(nil)}
	b, err := mad.Marshal(0x99, req)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	running(sdev).cm.HandleMAD(netip.AddrFrom16(cli.As16()), netip.AddrFrom16(srv.As16()), b)
	r, err := l.Accept(ctx)
	require.NoError(t, err)

	// The wait for the RTU ends once Accept has moved the QP to RTS (an
	// ctx ended before Accept refuses the request without touching it).
	ended, end := context.WithCancel(context.Background())
	defer end()
	go func() {
		for q.State() != ib.QPSRTS && ctx.Err() == nil {
			runtime.Gosched()
		}
		end()
	}()
	c, err := r.Accept(ended, q, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, c)
	require.Equal(t, ib.QPSErr, q.State(), "the QP of a failed Accept still sends to the peer")

	// A QP the handshake never touched is left alone: the Request was
	// answered, so this Accept fails before it moves anything.
	q2 := rcQP(t, sdev)
	_, err = r.Accept(ctx, q2, nil)
	require.ErrorIs(t, err, ErrAnswered)
	require.Equal(t, ib.QPSReset, q2.State())
}
