package qp

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// failEnv is a capEnv whose Transmit refuses the packets fail picks, the
// way the engine refuses an address vector it has no source GID for.
type failEnv struct {
	capEnv
	calls   int // Transmit calls so far, refused ones included
	refused int
	fail    func(call int, av *AddrVector) bool
}

func (e *failEnv) Transmit(n int, av *AddrVector) error {
	e.calls++
	if e.fail(e.calls, av) {
		e.refused++
		return ErrBadAV
	}
	return e.capEnv.Transmit(n, av)
}

// A packet the engine cannot send used to complete its WR with SUCCESS
// (the engine counted send_err and dropped it). As in rxe_requester on an
// rxe_xmit_packet / address vector error, the WR now completes with
// LOC_QP_OP_ERR, the QP moves to ERR, and every later WR, posted before
// or after, is flushed.
//
// Regression test: was TestRegressTransmitFailureFailsWR in regress_badav_test.go
// (added in commit 9a47da2).
func TestTransmitFailureFailsWR(t *testing.T) {
	badSGID := func(_ int, av *AddrVector) bool { return av.SGIDIndex == 7 }
	for _, tc := range []struct {
		name string
		typ  Type
		// wrs are posted in one go; the one with ID 2 is the failing one.
		wrs  func(l *link) []SendWR
		fail func(call int, av *AddrVector) bool
		sent int // packets that left before the failure
	}{
		{name: "UD bad AV", typ: UD, fail: badSGID, sent: 1, wrs: func(l *link) []SendWR {
			ud := func(id uint64, sgid uint8) SendWR {
				return SendWR{ID: id, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 64)},
					RemoteQPN: l.b.q.Num(), RemoteQKey: 0x1234, AV: AddrVector{DGID: l.b.addr.Addr(), SGIDIndex: sgid}}
			}
			return []SendWR{ud(1, 0), ud(2, 7), ud(3, 0)}
		}},
		{name: "UC second packet", typ: UC, sent: 2, // WR 1 (one packet), then WR 2's first of three
			fail: func(call int, _ *AddrVector) bool { return call == 3 },
			wrs: func(l *link) []SendWR {
				w := func(id uint64, n int) SendWR {
					return SendWR{ID: id, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, n)},
						RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()}
				}
				return []SendWR{w(1, 100), w(2, 700), w(3, 10)}
			}},
		{name: "RC first packet", typ: RC, sent: 1,
			fail: func(call int, _ *AddrVector) bool { return call == 2 },
			wrs: func(l *link) []SendWR {
				w := func(id uint64) SendWR {
					return SendWR{ID: id, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)},
						RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()}
				}
				return []SendWR{w(1), w(2), w(3)}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLink(t, tc.typ, 7, 7)
			env := &failEnv{fail: tc.fail}
			fatal := 0
			l.a.q.onErr = func(*QP) { fatal++ }
			psn0 := l.a.q.req.psn
			wrs := tc.wrs(l)
			for i := range wrs {
				require.NoError(t, l.a.q.PostSend(&wrs[i]))
			}
			l.a.q.Run(env, l.now, 1000)
			pkts := env.take()
			require.Len(t, pkts, tc.sent, "nothing is sent after the failure")
			require.Equal(t, 1, env.refused)
			require.Equal(t, uint64(tc.sent), l.a.q.ctr.SentPkts.Load(), "a refused packet is not counted as sent")
			// The refused packet did not take a PSN.
			require.Equal(t, psn0.Add(uint32(tc.sent)), l.a.q.req.psn)
			if tc.typ == RC {
				// WR 1 waits for its ACK; WR 2's error completes in order.
				require.Empty(t, poll(t, l.a.scq))
				require.Equal(t, RTS, l.a.q.State())
				require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 9}))
				l.deliver(l.b, l.a, pkts...)
				l.deliver(l.a, l.b, l.b.env.take()...)
			}
			wcs := poll(t, l.a.scq)
			require.Len(t, wcs, 3)
			for i, want := range []WCStatus{WCSuccess, WCLocQPOpErr, WCWRFlushErr} {
				require.Equal(t, uint64(i+1), wcs[i].ID)
				require.Equal(t, want, wcs[i].Status, "WR %d", i+1)
			}
			require.Equal(t, Err, l.a.q.State())
			require.Equal(t, 1, fatal, "the QP-fatal event fires once")
			require.Zero(t, l.a.q.SendQueueLen())

			// In ERR a new WR is accepted and flushed, never sent.
			more := wrs[0]
			more.ID = 4
			require.NoError(t, l.a.q.PostSend(&more))
			l.a.q.Run(env, l.now, 1000)
			require.Empty(t, env.take())
			wcs = poll(t, l.a.scq)
			require.Len(t, wcs, 1)
			require.Equal(t, uint64(4), wcs[0].ID)
			require.Equal(t, WCWRFlushErr, wcs[0].Status)
		})
	}
}

// Without a GID table (protocol tests) Modify checks no paths; with one,
// a connected QP's INIT->RTR is refused when the address vector names a
// source GID the table does not have or a destination of the other IP
// family, naming IBV_QP_AV (or IBV_QP_ALT_PATH), and the QP is left as it
// was.
//
// Regression test: was TestRegressModifyRefusesUnsendablePath in regress_badav_test.go
// (added in commit 9a47da2).
func TestModifyRefusesUnsendablePath(t *testing.T) {
	gids := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}
	v4, v6 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	for _, typ := range []Type{RC, UC} {
		for _, tc := range []struct {
			name string
			av   AddrVector
			alt  bool // put av in the alternate path instead
		}{
			{name: "sgid_index past the table", av: AddrVector{DGID: v4, SGIDIndex: 2}},
			{name: "IPv6 destination from an IPv4 GID", av: AddrVector{DGID: v6, SGIDIndex: 0}},
			{name: "IPv4 destination from an IPv6 GID", av: AddrVector{DGID: v4, SGIDIndex: 1}},
			{name: "IPv4-mapped destination from an IPv6 GID", av: AddrVector{DGID: netip.MustParseAddr("::ffff:10.0.0.2"), SGIDIndex: 1}},
			{name: "alternate path", av: AddrVector{DGID: v4, SGIDIndex: 5}, alt: true},
		} {
			t.Run(typ.String()+"/"+tc.name, func(t *testing.T) {
				e := newEnd(t, typ, 0x21, "10.0.0.1")
				e.q.gids = gids
				now := time.Unix(1000, 0)
				require.NoError(t, e.q.Modify(&Attr{State: Init, PortNum: 1}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags, now))
				before := e.q.Attr()
				a := &Attr{State: RTR, AV: AddrVector{DGID: v4}, PathMTU: MTU1024, DestQPN: 0x99, RQPSN: 5,
					MaxDestRdAtomic: 1, MinRNRTimer: 1}
				mask := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN
				if typ == RC {
					mask |= AttrMaxDestRdAtomic | AttrMinRNRTimer
				}
				want := AttrAV
				if tc.alt {
					a.AltAV, a.AltPortNum = tc.av, 1
					mask |= AttrAltPath
					want = AttrAltPath
				} else {
					a.AV = tc.av
				}
				err := e.q.Modify(a, mask, now)
				require.ErrorIs(t, err, ErrAttrValue)
				var me *ModifyError
				require.True(t, errors.As(err, &me))
				require.Equal(t, want, me.Attr, "%v", err)
				require.Equal(t, Init, e.q.State())
				require.Equal(t, before, e.q.Attr(), "a refused modify changes nothing")

				// The same modify with a usable path goes through.
				a.AV, a.AltAV = AddrVector{DGID: v6, SGIDIndex: 1}, AddrVector{DGID: v4}
				require.NoError(t, e.q.Modify(a, mask, now))
				require.Equal(t, RTR, e.q.State())
				require.Equal(t, v6, e.q.AV().DGID)
			})
		}
	}
}

func TestCheckAVSource(t *testing.T) {
	gids := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}
	for _, tc := range []struct {
		av AddrVector
		ok bool
	}{
		{AddrVector{DGID: netip.MustParseAddr("10.0.0.9")}, true},
		{AddrVector{DGID: netip.MustParseAddr("::ffff:10.0.0.9")}, true},
		{AddrVector{DGID: netip.MustParseAddr("fd00::9"), SGIDIndex: 1}, true},
		{AddrVector{}, false},
		{AddrVector{DGID: netip.MustParseAddr("fd00::9")}, false},
		{AddrVector{DGID: netip.MustParseAddr("10.0.0.9"), SGIDIndex: 1}, false},
		{AddrVector{DGID: netip.MustParseAddr("10.0.0.9"), SGIDIndex: 2}, false},
		{AddrVector{DGID: netip.MustParseAddr("10.0.0.9"), SGIDIndex: 255}, false},
	} {
		err := CheckAVSource(&tc.av, gids)
		if tc.ok {
			require.NoError(t, err, "%+v", tc.av)
		} else {
			require.ErrorIs(t, err, ErrBadAV, "%+v", tc.av)
		}
	}
	require.ErrorIs(t, CheckAVSource(&AddrVector{DGID: netip.MustParseAddr("10.0.0.9")}, nil), ErrBadAV, "empty GID table")
}

// A refusal of a message's first packet: nothing leaves, the requester
// does not try again, and even an unsignaled WR reports its failure.
//
// Regression test: was TestRegressTransmitFailureSendsNothingAfter in regress_badav_test.go
// (added in commit 9a47da2).
func TestTransmitFailureSendsNothingAfter(t *testing.T) {
	l := newLink(t, UC, 7, 7)
	env := &failEnv{fail: func(call int, _ *AddrVector) bool { return call == 1 }}
	wr := SendWR{ID: 1, Opcode: WRRDMAWrite, SGL: []SGE{l.a.sge(0, 600)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()}
	require.NoError(t, l.a.q.PostSend(&wr))
	l.a.q.Run(env, l.now, 1000)
	require.Empty(t, env.take())
	require.Equal(t, 1, env.calls, "the requester stops at the first refusal")
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 1, "an unsignaled WR that fails still completes")
	require.Equal(t, WCLocQPOpErr, wcs[0].Status)
	require.Equal(t, Err, l.a.q.State())
}
