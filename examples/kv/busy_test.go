package kv

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// requireBusyThenClosed requires that the server answers c, a connection
// beyond its cap, with the busy response alone and closes it.
func requireBusyThenClosed(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	b, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a connection beyond the cap: %v after %x, want the busy response and EOF", err, b)
	}
	require.Equal(t, busyResponse, b, "a connection beyond the cap gets one busy response")
}

// A TCP client turned away by the server's connection cap gets
// ErrServerBusy, which is not ErrConnLost: the server answers a
// connection beyond MaxConns with one busy response (status 6, request ID
// 0) before it closes it. The client's connection is closed; a Reconnect
// once a slot is free is served. Bug (workload edges, task N): the server
// closed it without a word, so the client's first call failed with
// ErrConnLost ("server closed, restarted or unreachable"), as from a
// crash.
func TestTCPClientSeesServerBusy(t *testing.T) {
	s := serveTCPForTest(t, bigExtentApp(t), &TCPServerConfig{MaxConns: 1})
	ctx := ctxT(t)
	c1, err := DialTCP(ctx, s.Addr().String())
	require.NoError(t, err)
	require.NoError(t, c1.Put(ctx, []byte("k"), []byte("v")))

	c2, err := DialTCP(ctx, s.Addr().String())
	require.NoError(t, err, "the refusal comes after the handshake")
	defer c2.Close()
	_, err = c2.Get(ctx, []byte("k"))
	t.Log(err)
	require.ErrorIs(t, err, ErrServerBusy)
	require.NotErrorIs(t, err, ErrConnLost)
	require.ErrorContains(t, err, s.Addr().String())
	require.Equal(t, uint64(1), s.Refused())
	require.NoError(t, c2.Close(), "the busy answer closed it")

	require.NoError(t, c1.Close())
	require.Eventually(t, func() bool { return s.connCount() == 0 }, 10*time.Second, time.Millisecond)
	require.NoError(t, c2.Reconnect(ctx))
	v, err := c2.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
}

// gatedListener holds its n-th Accept until gate is closed: the client
// of that connection has written its request before the server takes it.
type gatedListener struct {
	net.Listener
	n     int32
	calls atomic.Int32
	gate  chan struct{}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	if l.calls.Add(1) == l.n {
		<-l.gate
	}
	return l.Listener.Accept()
}

// The busy response reaches a client whose request was already in the
// server's receive buffer when the server refused it: the close with that
// unread request resets the connection (tcp_close, RFC 2525 2.17), after
// the response, which the client reads first. Bug (workload edges, task
// N): as TestTCPClientSeesServerBusy.
func TestTCPServerBusyAnswerSurvivesAReset(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gl := &gatedListener{Listener: ln, n: 2, gate: make(chan struct{})}
	s, err := ServeTCPWith(bigExtentApp(t), gl, &TCPServerConfig{MaxConns: 1})
	require.NoError(t, err)
	defer s.Close()
	defer func() {
		select {
		case <-gl.gate:
		default:
			close(gl.gate)
		}
	}()
	ctx := ctxT(t)
	c1, err := DialTCP(ctx, s.Addr().String())
	require.NoError(t, err)
	defer c1.Close()
	require.NoError(t, c1.Put(ctx, []byte("k"), []byte("v"))) // served: the first Accept

	c2, err := net.Dial("tcp", s.Addr().String()) // in the backlog, not accepted
	require.NoError(t, err)
	defer c2.Close()
	_, err = c2.Write(append(rawRequest(opGet, 1, 1, 0), 'k'))
	require.NoError(t, err)
	close(gl.gate)
	resp, _ := readResponse(t, c2, bufio.NewReader(c2))
	require.Equal(t, statusBusy, resp.status)
	require.Equal(t, ErrServerBusy, resp.status.err())
}

// What a client makes of a server's answer that looks like a refusal:
// only a whole busy header with no value is one; a truncated busy header
// (the server died while writing it) or one claiming a value is a broken
// stream, ErrConnLost, as is any other answer to request 0.
func TestTCPClientBusyResponseBadInput(t *testing.T) {
	lost, busy := ErrConnLost, ErrServerBusy
	withVal := appendResponse(nil, statusBusy, 0, []byte("abc"))
	cases := []struct {
		name   string
		answer []byte
		want   error
	}{
		{"busy", busyResponse, busy},
		{"busy, answering the request's ID", appendResponse(nil, statusBusy, 1, nil), busy},
		{"truncated busy, 1 byte", busyResponse[:1], lost},
		{"truncated busy, 11 bytes", busyResponse[:respHdrLen-1], lost},
		{"busy claiming a value", withVal, lost},
		{"busy claiming a value, cut short", withVal[:respHdrLen], lost},
		{"another status to request 0", appendResponse(nil, statusNotFound, 0, nil), lost},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			served := make(chan struct{})
			go func() {
				defer close(served)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				var req [reqHdrLen + 1]byte
				_, _ = io.ReadFull(c, req[:]) // read, so the close is a FIN
				_, _ = c.Write(tc.answer)
			}()
			ctx := ctxT(t)
			cl, err := DialTCP(ctx, ln.Addr().String())
			require.NoError(t, err)
			defer cl.Close()
			_, err = cl.Get(ctx, []byte("k"))
			t.Log(err)
			require.ErrorIs(t, err, tc.want)
			if tc.want == lost {
				require.NotErrorIs(t, err, busy)
			} else {
				require.NotErrorIs(t, err, lost)
			}
			<-served
		})
	}
}

// An RDMA client refused by the server's cap gets ErrServerBusy too,
// from the same REJ as before on the wire (reason 28, consumer defined,
// private data "kv: too many clients": what rdma_reject sends, so an
// rdma_cm client sees the same), and a freed slot serves it. Bug
// (workload edges, task N): DialRDMA said "rejected: consumer defined
// (28)" and dropped the private data, so a client, and rxed kv get (the
// RejectError alone), could not tell the cap from any other refusal.
func TestRDMAClientSeesServerBusy(t *testing.T) {
	r := newRig(t)
	at := netip.MustParseAddrPort("10.0.0.1:7472")
	s, err := ServeRDMA(r.app, r.srvDev, at, &RDMAServerConfig{MaxConns: 1})
	require.NoError(t, err)
	defer s.Close()
	ctx := ctxT(t)
	c1, err := DialRDMA(ctx, r.cliDev, at, nil)
	require.NoError(t, err)
	_, err = DialRDMA(ctx, r.cliDev, at, nil)
	t.Log(err)
	require.ErrorIs(t, err, ErrServerBusy)
	require.NotErrorIs(t, err, ErrConnLost)
	var rej *rdmacm.RejectError
	require.True(t, errors.As(err, &rej), "the REJ stays in the chain")
	require.Equal(t, mad.REJConsumerDefined, rej.Reason)
	require.ErrorContains(t, err, at.String())

	require.NoError(t, c1.Close())
	require.Eventually(t, func() bool { return s.Conns() == 0 }, 10*time.Second, time.Millisecond)
	c2, err := DialRDMA(ctx, r.cliDev, at, nil)
	require.NoError(t, err)
	require.NoError(t, c2.Close())
}

// Only the cap's own REJ is a busy server: the reason must be consumer
// defined and the private data exactly busyRejectReason, zero padded (a
// REJ's private data is 148 bytes on the wire).
func TestIsBusyReject(t *testing.T) {
	padded := make([]byte, mad.REJPrivateLen)
	copy(padded, busyRejectReason)
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"the cap's REJ", &rdmacm.RejectError{Reason: mad.REJConsumerDefined, PrivateData: padded}, true},
		{"unpadded", &rdmacm.RejectError{Reason: mad.REJConsumerDefined, PrivateData: []byte(busyRejectReason)}, true},
		{"truncated reason", &rdmacm.RejectError{Reason: mad.REJConsumerDefined, PrivateData: []byte(busyRejectReason[:10])}, false},
		{"no private data", &rdmacm.RejectError{Reason: mad.REJConsumerDefined}, false},
		{"other text", &rdmacm.RejectError{Reason: mad.REJConsumerDefined, PrivateData: []byte("kv: too many clients!")}, false},
		{"not listening (REJ 8)", &rdmacm.RejectError{Reason: mad.REJInvalidServiceID, PrivateData: padded}, false},
		{"not a REJ", errors.New(busyRejectReason), false},
		{"nil", nil, false},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, isBusyReject(tc.err), tc.name)
	}
}
