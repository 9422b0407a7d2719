package rdmacm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// accepted is what the server goroutine of a connection test produced.
type accepted struct {
	req  *rdmacm.Request
	conn *rdmacm.Conn
	err  error
}

// serveOne accepts one request on l with a fresh QP of srv and param p.
func serveOne(ctx context.Context, srv *host, l *rdmacm.Listener, p *rdmacm.ConnParam) <-chan accepted {
	out := make(chan accepted, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			out <- accepted{err: err}
			return
		}
		q, err := srv.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: srv.cq, RecvCQ: srv.cq,
			Cap: ib.QPCap{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			out <- accepted{req: req, err: err}
			return
		}
		// A receive for the client's first SEND, before the RTU can let
		// it arrive: in INIT, where rdma_create_qp leaves a QP.
		if err := ib.InitQP(q, ib.ConnectAttr{}); err != nil {
			out <- accepted{req: req, err: err}
			return
		}
		if err := q.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{srv.sge(0, 1024)}}); err != nil {
			out <- accepted{req: req, err: err}
			return
		}
		c, err := req.Accept(ctx, q, p)
		out <- accepted{req: req, conn: c, err: err}
	}()
	return out
}

// TestDialAccept connects two devices through the CM over IPv4 and IPv6,
// checks what each side learned (addresses, private data, QP attributes
// derived from REQ and REP as the kernel derives them), and moves data
// both ways: SEND, WRITE, and READ (which needs the responder resources
// the REQ offered).
func TestDialAccept(t *testing.T) {
	for _, fam := range []struct {
		name, srv, cli string
		udp            bool
	}{
		{"ipv4", "10.1.0.1", "10.1.0.2", false},
		{"ipv6", "fd01::1", "fd01::2", false},
		{"udp-loopback", "127.0.5.1", "127.0.5.2", true},
	} {
		t.Run(fam.name, func(t *testing.T) {
			var hs []*host
			if fam.udp {
				hs = udpHosts(t, fam.srv, fam.cli)
			} else {
				hs = memHosts(t, nil, fam.srv, fam.cli)
			}
			srv, cli := hs[0], hs[1]
			ctx := testCtx(t)
			laddr := netip.AddrPortFrom(srv.ip, 7174)
			l, err := rdmacm.Listen(srv.dev, laddr, nil)
			require.NoError(t, err)
			defer l.Close()
			got := serveOne(ctx, srv, l, &rdmacm.ConnParam{PrivateData: []byte("welcome")})

			q := cli.qp(ib.RC)
			c, err := rdmacm.Dial(ctx, q, laddr, &rdmacm.ConnParam{PrivateData: []byte("hello"),
				ResponderResources: 4, InitiatorDepth: 2, RetryCount: 7, RNRRetryCount: 6})
			require.NoError(t, err)
			s := <-got
			require.NoError(t, s.err)

			// What the passive side learned from the REQ.
			require.Equal(t, cli.ip, s.req.Remote.Addr())
			require.Equal(t, c.LocalAddr(), s.req.Remote)
			require.Equal(t, laddr, s.req.Local)
			require.Equal(t, uint8(4), s.req.ResponderResources)
			require.Equal(t, uint8(2), s.req.InitiatorDepth)
			require.Equal(t, "hello", string(bytes.TrimRight(s.req.PrivateData, "\x00")))
			require.Len(t, s.req.PrivateData, 56, "a REQ carries 92-36 bytes of user private data")
			require.Equal(t, "welcome", string(bytes.TrimRight(c.PrivateData(), "\x00")))

			// QP attributes, both in RTS and pointing at each other.
			ca, _, err := q.Query()
			require.NoError(t, err)
			sa, _, err := s.conn.QP().Query()
			require.NoError(t, err)
			require.Equal(t, ib.QPSRTS, ca.State)
			require.Equal(t, ib.QPSRTS, sa.State)
			require.Equal(t, s.conn.QP().Num(), ca.DestQPN)
			require.Equal(t, q.Num(), sa.DestQPN)
			// What the request named before Accept is where the QP sends.
			rgid, rqpn := s.req.RemoteQP()
			require.Equal(t, q.Num(), rqpn)
			require.Equal(t, sa.AV.DGID.Unmap(), rgid)
			require.Equal(t, cli.ip, rgid)
			require.Equal(t, ca.SQPSN, sa.RQPSN, "the passive side expects the active side's starting PSN")
			require.Equal(t, sa.SQPSN, ca.RQPSN)
			require.Equal(t, uint8(2), ca.MaxRdAtomic, "active max_rd_atomic = its initiator depth")
			require.Equal(t, uint8(4), ca.MaxDestRdAtomic, "active max_dest_rd_atomic = its responder resources")
			require.Equal(t, uint8(4), sa.MaxRdAtomic, "passive initiator depth defaults to the REQ's responder resources")
			require.Equal(t, uint8(2), sa.MaxDestRdAtomic, "passive responder resources default to the REQ's initiator depth")
			require.Equal(t, uint8(7), ca.RetryCnt)
			require.Equal(t, uint8(7), sa.RetryCnt, "the REQ's retry count is both sides'")
			require.Equal(t, uint8(6), sa.RNRRetry, "the passive side uses the RNR retry count of the REQ")
			require.Equal(t, uint8(19), sa.Timeout, "ACK timeout: the REQ's local ACK timeout (packet life time 18 + 1)")
			require.Equal(t, uint8(19), ca.Timeout)
			require.Equal(t, uint8(0), sa.MinRNRTimer, "the kernel's CM leaves min_rnr_timer 0")
			require.Equal(t, ca.PathMTU, sa.PathMTU)
			require.NotZero(t, ca.AccessFlags&ib.AccessRemoteRead)

			// Data both ways. What the server will READ is written before the
			// client's first post, which orders it before the client engine's
			// reads (over real sockets the race detector cannot see the
			// packets that order it otherwise).
			copy(cli.buf[8192:], "read me back")
			copy(cli.buf[0:], "ping over rdma_cm")
			require.NoError(t, q.PostSend(ib.SendWR{ID: 9, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{cli.sge(0, 17)}}))
			require.Equal(t, ib.WCSuccess, cli.wc(ctx).Status)
			w := srv.wc(ctx)
			require.Equal(t, ib.WCSuccess, w.Status)
			require.Equal(t, "ping over rdma_cm", string(srv.buf[:w.ByteLen]))

			copy(cli.buf[2048:], "written")
			require.NoError(t, q.PostSend(ib.SendWR{ID: 10, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
				SGL: []ib.SGE{cli.sge(2048, 7)}, RemoteAddr: srv.mr.IOVA() + 4096, RKey: srv.mr.RKey()}))
			require.Equal(t, ib.WCSuccess, cli.wc(ctx).Status)
			// A call into the target's worker orders its WRITE before our read.
			_, _, err = s.conn.QP().Query()
			require.NoError(t, err)
			require.Equal(t, "written", string(srv.buf[4096:4103]))

			require.NoError(t, s.conn.QP().PostSend(ib.SendWR{ID: 11, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
				SGL: []ib.SGE{srv.sge(8192, 12)}, RemoteAddr: cli.mr.IOVA() + 8192, RKey: cli.mr.RKey()}))
			require.Equal(t, ib.WCSuccess, srv.wc(ctx).Status)
			require.Equal(t, "read me back", string(srv.buf[8192:8204]))

			// The client disconnects: both ends end, both QPs are in ERR.
			require.NoError(t, c.Disconnect(ctx))
			select {
			case <-s.conn.Done():
			case <-ctx.Done():
				t.Fatal("the passive side never saw the DREQ")
			}
			require.ErrorIs(t, s.conn.Err(), rdmacm.ErrDisconnected)
			require.Equal(t, ib.QPSErr, q.State())
			require.Equal(t, ib.QPSErr, s.conn.QP().State())
			ev := <-s.conn.Events()
			require.Equal(t, rdmacm.EventDisconnected, ev.Type)
		})
	}
}

// TestDisconnectByServer: the passive side disconnects; the active side's
// Done closes and its QP is in ERR.
func TestDisconnectByServer(t *testing.T) {
	hs := memHosts(t, nil, "10.2.0.1", "10.2.0.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("0.0.0.0:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	got := serveOne(ctx, srv, l, nil)
	c, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.2.0.1:7471"), nil)
	require.NoError(t, err)
	s := <-got
	require.NoError(t, s.err)
	require.NoError(t, s.conn.Disconnect(ctx))
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("the active side never saw the DREQ")
	}
	require.Equal(t, ib.QPSErr, c.QP().State())
	require.NoError(t, c.Disconnect(ctx), "disconnecting an ended connection is a no-op")
	// Timewait ends on both sides.
	for _, conn := range []*rdmacm.Conn{c, s.conn} {
		for ev := range conn.Events() {
			if ev.Type == rdmacm.EventTimewaitExit {
				break
			}
		}
	}
}

// TestRejects covers the refusals a Dial can meet, each with the reason
// the kernel gives: the application rejects (28, with its private data),
// nobody listens on the port (8), a listener exists on the port but not
// for the address dialled (28).
func TestRejects(t *testing.T) {
	hs := memHosts(t, nil, "10.3.0.1", "10.3.0.9", "10.3.0.2")
	srv, other, cli := hs[0], hs[1], hs[2]
	_ = other
	ctx := testCtx(t)

	t.Run("by the application", func(t *testing.T) {
		l, err := rdmacm.Listen(srv.dev, ap("10.3.0.1:5000"), nil)
		require.NoError(t, err)
		defer l.Close()
		go func() {
			req, err := l.Accept(ctx)
			if err == nil {
				_ = req.Reject([]byte("go away"))
			}
		}()
		_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.3.0.1:5000"), nil)
		var rej *rdmacm.RejectError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, mad.REJConsumerDefined, rej.Reason)
		require.Equal(t, "go away", string(bytes.TrimRight(rej.PrivateData, "\x00")))
		require.Contains(t, err.Error(), "consumer defined (28)")
	})
	t.Run("no listener on the port", func(t *testing.T) {
		_, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.3.0.1:5001"), nil)
		var rej *rdmacm.RejectError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, mad.REJInvalidServiceID, rej.Reason)
		require.Contains(t, err.Error(), "invalid service ID (8)")
	})
	t.Run("listener for another address", func(t *testing.T) {
		// The REQ goes to srv's GID but names 10.3.0.1 in rdma_cm's header
		// only when dialled so; listen on srv for a port, then dial srv
		// with a listener bound to a different address of nobody: rdma_cm
		// finds no listener for the header's destination.
		l, err := rdmacm.Listen(other.dev, ap("10.3.0.9:5002"), nil)
		require.NoError(t, err)
		defer l.Close()
		l2, err := rdmacm.Listen(srv.dev, ap("10.3.0.1:5003"), nil)
		require.NoError(t, err)
		defer l2.Close()
		_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.3.0.9:5003"), nil)
		var rej *rdmacm.RejectError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, mad.REJInvalidServiceID, rej.Reason, "other listens on 5002, not 5003")
	})
}

// TestDialSilentPeer: a REQ to an address where no device answers ends
// with the caller's deadline (the CM would retry for about a minute).
func TestDialSilentPeer(t *testing.T) {
	hs := memHosts(t, nil, "10.4.0.2")
	cli := hs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.4.0.1:7174"), nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// ConnParam.Timeout bounds it too.
	_, err = rdmacm.Dial(context.Background(), cli.qp(ib.RC), ap("10.4.0.1:7174"), &rdmacm.ConnParam{Timeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestMisuse: every misuse of the API is a clear error, before anything
// goes on the wire.
func TestMisuse(t *testing.T) {
	hs := memHosts(t, nil, "10.5.0.1", "10.5.0.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	_, err := rdmacm.Listen(srv.dev, ap("10.5.0.1:0"), nil)
	require.ErrorContains(t, err, "port is required")
	_, err = rdmacm.Listen(srv.dev, ap("10.5.0.7:80"), nil)
	require.ErrorContains(t, err, "not an address of the device")
	l, err := rdmacm.Listen(srv.dev, ap("10.5.0.1:80"), nil)
	require.NoError(t, err)
	_, err = rdmacm.Listen(srv.dev, ap("10.5.0.1:80"), nil)
	require.ErrorIs(t, err, rdmacm.ErrAddrInUse)
	require.NoError(t, l.Close())
	_, err = l.Accept(ctx)
	require.ErrorIs(t, err, rdmacm.ErrClosed)

	_, err = rdmacm.Dial(ctx, cli.qp(ib.UD), ap("10.5.0.1:80"), nil)
	require.ErrorContains(t, err, "connections are RC or UC")
	_, err = rdmacm.Dial(ctx, nil, ap("10.5.0.1:80"), nil)
	require.ErrorContains(t, err, "nil QP")
	_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.5.0.1:80"), &rdmacm.ConnParam{PrivateData: make([]byte, 57)})
	require.ErrorContains(t, err, "at most 56")
	_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.5.0.1:80"), &rdmacm.ConnParam{RetryCount: 8})
	require.ErrorContains(t, err, "at most 7")
	_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("[fd00::1]:80"), nil)
	require.ErrorContains(t, err, "no local address")
	_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("0.0.0.0:80"), nil)
	require.ErrorContains(t, err, "invalid address")
	q := cli.qp(ib.RC)
	require.NoError(t, ib.ConnectQP(q, ib.RemoteQP{QPN: 0x99, GID: srv.ip}, ib.ConnectAttr{SGIDIndex: -1}))
	_, err = rdmacm.Dial(ctx, q, ap("10.5.0.1:80"), nil)
	require.ErrorContains(t, err, "must be in RESET or INIT")
}

// TestAcceptTwice: a request is answered once.
func TestAcceptTwice(t *testing.T) {
	hs := memHosts(t, nil, "10.6.0.1", "10.6.0.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.6.0.1:9"), nil)
	require.NoError(t, err)
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		_, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.6.0.1:9"), nil)
		done <- err
	}()
	req, err := l.Accept(ctx)
	require.NoError(t, err)
	_, err = req.Accept(ctx, srv.qp(ib.RC), nil)
	require.NoError(t, err)
	require.NoError(t, <-done)
	_, err = req.Accept(ctx, srv.qp(ib.RC), nil)
	require.ErrorIs(t, err, rdmacm.ErrAnswered)
	require.ErrorIs(t, req.Reject(nil), rdmacm.ErrAnswered)
	require.ErrorContains(t, req.AcceptUD(srv.qp(ib.UD), 1, nil), "not a UD request")
}

// TestManyConnectionsLossy connects eight QP pairs at once over a network
// that loses, duplicates and reorders packets (CM MADs included): every
// connection is established exactly once and carries its SEND.
func TestManyConnectionsLossy(t *testing.T) {
	fc := &transport.FaultConfig{Loss: 0.1, Dup: 0.05, Reorder: 0.05, Seed: 42}
	hs := memHosts(t, fc, "10.7.0.1", "10.7.0.2")
	srv, cli := hs[0], hs[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := rdmacm.Listen(srv.dev, ap("10.7.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	const n = 8
	srvErr := make(chan error, n)
	go func() {
		for i := 0; i < n; i++ {
			req, err := l.Accept(ctx)
			if err != nil {
				srvErr <- err
				return
			}
			go func() {
				_, err := req.Accept(ctx, srv.qp(ib.RC), &rdmacm.ConnParam{ACKTimeout: 14})
				srvErr <- err
			}()
		}
	}()
	conns := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			c, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.7.0.1:7471"), &rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7, ACKTimeout: 14,
				PrivateData: []byte(fmt.Sprint(i))})
			if err == nil && c.QP().State() != ib.QPSRTS {
				err = errors.New("not in RTS")
			}
			conns <- err
		}()
	}
	for i := 0; i < n; i++ {
		require.NoError(t, <-conns)
		require.NoError(t, <-srvErr)
	}
}

// TestUDResolve: SIDR resolves a UD service to its QPN and Q_Key, and a
// datagram sent there arrives; no listener is a SIDR status error.
func TestUDResolve(t *testing.T) {
	hs := memHosts(t, nil, "10.8.0.1", "10.8.0.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.8.0.1:7174"), &rdmacm.ListenOptions{PortSpace: mad.PortSpaceUDP})
	require.NoError(t, err)
	defer l.Close()
	const qkey = 0x01234567
	uq := srv.qp(ib.UD)
	require.NoError(t, ib.ConnectQP(uq, ib.RemoteQP{}, ib.ConnectAttr{QKey: qkey}))
	require.NoError(t, uq.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{srv.sge(0, 1024)}}))
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			_ = req.AcceptUD(uq, qkey, []byte("ud ok"))
		}
	}()
	r, err := rdmacm.DialUD(ctx, cli.dev, ap("10.8.0.1:7174"), &rdmacm.ConnParam{PrivateData: []byte("hi")})
	require.NoError(t, err)
	require.Equal(t, uq.Num(), r.QPN)
	require.Equal(t, uint32(qkey), r.QKey)
	require.Equal(t, "ud ok", string(bytes.TrimRight(r.PrivateData, "\x00")))

	cq := cli.qp(ib.UD)
	require.NoError(t, ib.ConnectQP(cq, ib.RemoteQP{}, ib.ConnectAttr{QKey: 7}))
	av := ib.AddrVector{DGID: r.GID, PortNum: 1}
	copy(cli.buf, "datagram")
	require.NoError(t, cq.PostSend(ib.SendWR{ID: 3, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{cli.sge(0, 8)},
		AV: av, RemoteQPN: r.QPN, RemoteQKey: r.QKey}))
	require.Equal(t, ib.WCSuccess, cli.wc(ctx).Status)
	w := srv.wc(ctx)
	require.Equal(t, ib.WCSuccess, w.Status)
	require.Equal(t, "datagram", string(srv.buf[40:48]), "after the 40-byte GRH")

	_, err = rdmacm.DialUD(ctx, cli.dev, ap("10.8.0.1:7175"), nil)
	var se *rdmacm.SIDRError
	require.ErrorAs(t, err, &se)
	require.Equal(t, mad.SIDRUnsupported, se.Status)
}
