package ib_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/polltest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// An overflowed CQ says so through its own polls, to a program that
// never reads Device.Events: the completions it kept come first, then
// PollCQ, WaitPoll and Wait return ErrCQOverflow. (issue 15: the only
// report was the async event, lost when nobody read Events.)
func TestCQOverflowReportedByPoll(t *testing.T) {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.9.6.1"), openPeer(net, "10.9.6.2")
	defer a.close()
	defer b.close()
	small, err := a.dev.CreateCQ(2)
	require.NoError(t, err)
	qa, err := a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: small, RecvCQ: a.cq,
		Cap: ib.QPCap{MaxSendWR: 8, MaxSendSGE: 1, MaxRecvWR: 1}})
	require.NoError(t, err)
	qb := b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)
	for i := range 3 {
		require.NoError(t, qa.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}))
	}
	// Nobody polls, so the third completion finds the CQ full.
	require.Eventually(t, small.Overflowed, 20*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wcs [4]ib.WC
	n, err := small.WaitPoll(ctx, wcs[:])
	require.NoError(t, err, "the kept completions come before the error")
	require.Equal(t, 2, n)
	require.Equal(t, []uint64{0, 1}, []uint64{wcs[0].ID, wcs[1].ID})
	n, err = small.WaitPoll(ctx, wcs[:])
	require.ErrorIs(t, err, ib.ErrCQOverflow)
	require.Zero(t, n)
	require.NotContains(t, err.Error(), "qp:", "the error is the verbs layer's")
	n, err = small.PollCQ(wcs[:])
	require.ErrorIs(t, err, ib.ErrCQOverflow, "sticky")
	require.Zero(t, n)
	require.ErrorIs(t, small.Wait(ctx), ib.ErrCQOverflow, "Wait does not sleep on a CQ that lost completions")
}

// WaitPoll receives what the socket holds before it sleeps, as Poll
// does: on a device whose receive goroutine never gets a datagram
// (polltest.Only), a SEND already in its socket completes in WaitPoll.
// (issue 15: WaitPoll only slept, waiting for the receive goroutine.)
func TestCQWaitPollDrivesEngine(t *testing.T) {
	a, b := openUDPPeer(t, "127.0.6.1", nil, ib.AccessLocalWrite), openUDPPeer(t, "127.0.6.2", polltest.Only, ib.AccessLocalWrite)
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 7, SGL: []ib.SGE{b.sge(0, 64)}}))
	before := a.dev.Counters()["sent_pkts"]
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("hello")}))
	// On loopback a sent datagram is in the receiver's socket when the
	// send returns.
	require.Eventually(t, func() bool { return a.dev.Counters()["sent_pkts"] > before }, 20*time.Second, time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wcs [1]ib.WC
	n, err := b.cq.WaitPoll(ctx, wcs[:])
	require.NoError(t, err, "WaitPoll slept with the SEND in its socket")
	require.Equal(t, 1, n)
	require.Equal(t, uint64(7), wcs[0].ID)
	require.Equal(t, "hello", string(b.buf[:wcs[0].ByteLen]))
}

// A WaitPoll that finds its answer before it sleeps (its in-process
// peer's socket first, then its own) never blocks, so it yields now and
// then as a spinner on Poll does: without, the runtime preempted it with
// a signal every 10 ms and a READ round trip's p99 in event mode was
// 1.6x TCP's instead of 1.3x (session O). b's receive goroutine never
// gets a datagram (polltest.Only): only a's waits take b's requests.
func TestWaitPollYieldsWhileItFindsAnswers(t *testing.T) {
	a, b := openUDPPeer(t, "127.0.6.3", nil, ib.AccessLocalWrite), openUDPPeer(t, "127.0.6.4", polltest.Only, ib.AccessLocalWrite|ib.AccessRemoteWrite)
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)
	past := -int64(time.Hour)
	ib.SetSpinYielded(a.cq, past)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wcs [1]ib.WC
	for i := 0; ib.SpinYielded(a.cq) == past; i++ {
		require.Less(t, i, 16, "no yield in 16 waits that found their answer (one clock reading in 16)")
		before := a.dev.Counters()["sent_pkts"]
		require.NoError(t, qa.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled | ib.SendInline,
			Inline: []byte("8 bytes!"), RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}))
		// The WRITE may leave from a's worker goroutine: wait until it is
		// in b's socket, where the wait will find it.
		require.Eventually(t, func() bool { return a.dev.Counters()["sent_pkts"] > before }, 20*time.Second, 100*time.Microsecond)
		n, err := a.cq.WaitPoll(ctx, wcs[:])
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, ib.WCSuccess, wcs[0].Status)
		require.EqualValues(t, i, wcs[0].ID)
	}
	require.Equal(t, "8 bytes!", string(b.buf[:8]))
}

// openUDPPeer opens a peer on a UDP socket at addr (an ephemeral port),
// its Conn wrapped by wrap when not nil, with a 64 KiB buffer registered
// for access; it closes when the test ends, and the test skips when the
// machine has no UDP on loopback.
func openUDPPeer(t *testing.T, addr string, wrap func(transport.Conn) (transport.Conn, error), access ib.Access) *peer {
	t.Helper()
	a := netip.MustParseAddr(addr)
	dev, err := ib.OpenDevice(ib.Config{Addrs: []netip.Addr{a}, EphemeralPort: true, Workers: 1, Wrap: wrap})
	if err != nil {
		t.Skipf("no UDP on loopback: %v", err)
	}
	p := &peer{dev: dev, addr: a, buf: make([]byte, 64<<10)}
	t.Cleanup(p.close)
	p.pd, err = dev.AllocPD()
	require.NoError(t, err)
	p.cq, err = dev.CreateCQ(64)
	require.NoError(t, err)
	p.mr, err = p.pd.RegMR(p.buf, access)
	require.NoError(t, err)
	return p
}
