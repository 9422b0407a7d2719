package ib_test

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// requireWC waits for the next completion on p's CQ and checks it.
func requireWC(t *testing.T, p *peer, id uint64, status ib.WCStatus) ib.WC {
	t.Helper()
	wc := next(p.cq)
	require.Equal(t, id, wc.ID)
	require.Equal(t, status.String(), wc.Status.String(), "wr %d", id)
	return wc
}

func regMR(fmr *ib.MR, key uint32, iova uint64, n uint64, access ib.Access) ib.SendWR {
	return ib.SendWR{Opcode: ib.WRRegMR, Flags: ib.SendSignaled,
		Reg: ib.RegMRInfo{MRLKey: fmr.LKey(), NewKey: key, IOVA: iova, Length: n, Access: access}}
}

func withID(wr ib.SendWR, id uint64) ib.SendWR { wr.ID = id; return wr }

// A fast-registration region cycles through REG_MR, remote use,
// invalidation (local or by the peer's SEND_WITH_INV) and registration
// under a new key; a stale key is refused every time.
func TestFastRegLifecycle(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	fmr, err := b.pd.AllocMR(8192)
	require.NoError(t, err)
	require.Equal(t, 8192, fmr.MaxLen())
	require.NoError(t, b.pd.MapMR(fmr, b.buf[8192:16384]))
	write := func(id uint64, key uint32, addr uint64, fill byte) {
		for i := range 16 {
			a.buf[i] = fill
		}
		require.NoError(t, qa.PostSend(ib.SendWR{ID: id, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL: []ib.SGE{a.sge(0, 16)}, RemoteAddr: addr, RKey: key}))
	}
	// Before any REG_MR the key is refused.
	write(1, fmr.RKey(), 0, 0xAA)
	requireWC(t, a, 1, ib.WCRemAccessErr)
	require.Equal(t, make([]byte, 8192), b.buf[8192:16384])
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	connectBoth(a, qa, b, qb)

	key := fmr.LKey()
	for round := range 3 {
		old := key
		key = ib.IncRKey(key)
		iova := uint64(0x1000_0000 * (round + 1))
		require.NoError(t, qb.PostSend(withID(regMR(fmr, key, iova, 4096, ib.AccessLocalWrite|ib.AccessRemoteWrite), 10)))
		requireWC(t, b, 10, ib.WCSuccess)
		require.Equal(t, key, fmr.RKey())
		require.Equal(t, iova, fmr.IOVA())
		require.Equal(t, 4096, fmr.Len())

		fill := byte(0x10 + round)
		write(20, key, iova+100, fill)
		requireWC(t, a, 20, ib.WCSuccess)
		require.Equal(t, fill, b.buf[8192+100])
		require.Equal(t, fill, b.buf[8192+115])

		// Past the registered 4096 bytes (though inside the mapped 8192).
		write(21, key, iova+4090, 0xEE)
		requireWC(t, a, 21, ib.WCRemAccessErr)
		require.NotEqual(t, byte(0xEE), b.buf[8192+4090])
		require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
		require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
		connectBoth(a, qa, b, qb)

		// The previous round's key is stale.
		if round > 0 {
			write(22, old, iova+100, 0xEE)
			requireWC(t, a, 22, ib.WCRemAccessErr)
			require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
			require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
			connectBoth(a, qa, b, qb)
		}

		// Invalidate: locally on even rounds, by the peer on odd ones.
		if round%2 == 0 {
			require.NoError(t, qb.PostSend(ib.SendWR{ID: 30, Opcode: ib.WRLocalInv, Flags: ib.SendSignaled, InvalidateRKey: key}))
			requireWC(t, b, 30, ib.WCSuccess)
		} else {
			require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 31, SGL: []ib.SGE{b.sge(0, 64)}}))
			require.NoError(t, qa.PostSend(ib.SendWR{ID: 32, Opcode: ib.WRSendWithInv, Flags: ib.SendSignaled | ib.SendInline,
				Inline: []byte("inv"), InvalidateRKey: key}))
			requireWC(t, a, 32, ib.WCSuccess)
			rwc := requireWC(t, b, 31, ib.WCSuccess)
			require.Equal(t, key, rwc.InvalidatedRKey)
		}
		write(40, key, iova+100, 0xEE)
		requireWC(t, a, 40, ib.WCRemAccessErr)
		require.Equal(t, fill, b.buf[8192+100], "an invalidated key writes nothing")
		require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
		require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
		connectBoth(a, qa, b, qb)
	}
}

// A failed local work request completes with rxe's status and moves the
// QP to ERR, flushing what follows; the region is unchanged.
func TestLocalWorkRequestFailures(t *testing.T) {
	cases := []struct {
		name   string
		wr     func(a, b *peer, fmr *ib.MR) ib.SendWR
		status ib.WCStatus
	}{
		{"REG_MR before MapMR", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			other, err := b.pd.AllocMR(64)
			require.NoError(t, err)
			return regMR(other, ib.IncRKey(other.LKey()), 0, 64, ib.AccessLocalWrite)
		}, ib.WCLocQPOpErr},
		{"REG_MR longer than mapped", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			return regMR(fmr, ib.IncRKey(fmr.LKey()), 0, 8192, ib.AccessLocalWrite)
		}, ib.WCLocQPOpErr},
		{"REG_MR changing the key index", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			return regMR(fmr, fmr.LKey()+0x100, 0, 64, ib.AccessLocalWrite)
		}, ib.WCLocQPOpErr},
		{"REG_MR with remote write but no local write", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			return regMR(fmr, ib.IncRKey(fmr.LKey()), 0, 64, ib.AccessRemoteWrite)
		}, ib.WCLocQPOpErr},
		{"REG_MR of a user region", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			return regMR(b.mr, ib.IncRKey(b.mr.LKey()), 0, 64, ib.AccessLocalWrite)
		}, ib.WCLocQPOpErr},
		{"REG_MR of another PD's region", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			pd, err := b.dev.AllocPD()
			require.NoError(t, err)
			other, err := pd.AllocMR(64)
			require.NoError(t, err)
			require.NoError(t, pd.MapMR(other, make([]byte, 64)))
			return regMR(other, ib.IncRKey(other.LKey()), 0, 64, ib.AccessLocalWrite)
		}, ib.WCLocQPOpErr},
		{"LOCAL_INV of a user region", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			return ib.SendWR{Opcode: ib.WRLocalInv, InvalidateRKey: b.mr.LKey()}
		}, ib.WCLocQPOpErr},
		{"LOCAL_INV of an unknown key", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			return ib.SendWR{Opcode: ib.WRLocalInv, InvalidateRKey: ib.IncRKey(fmr.LKey())}
		}, ib.WCLocQPOpErr},
		{"BIND_MW over a region without MW_BIND", func(a, b *peer, fmr *ib.MR) ib.SendWR {
			mw, err := b.pd.AllocMW(ib.MWType2)
			require.NoError(t, err)
			return ib.SendWR{Opcode: ib.WRBindMW, Bind: ib.MWBindInfo{MWRKey: mw.RKey(), NewRKey: ib.IncRKey(mw.RKey()),
				MRLKey: b.mr.LKey(), Addr: b.mr.IOVA(), Length: 64, Access: ib.AccessRemoteRead}}
		}, ib.WCMWBindErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, qa, b, qb := testPair(t)
			connectBoth(a, qa, b, qb)
			fmr, err := b.pd.AllocMR(4096)
			require.NoError(t, err)
			require.NoError(t, b.pd.MapMR(fmr, b.buf[:64]))
			key, userKey := fmr.LKey(), b.mr.LKey()
			wr := c.wr(a, b, fmr)
			wr.ID, wr.Flags = 1, 0 // unsignalled: an error completes anyway
			require.NoError(t, qb.PostSend(wr, ib.SendWR{ID: 2, Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline, Inline: []byte("x")}))
			requireWC(t, b, 1, c.status)
			requireWC(t, b, 2, ib.WCWRFlushErr)
			require.Equal(t, ib.QPSErr, qb.State())
			require.Equal(t, key, fmr.LKey(), "the fast region kept its key")
			require.Equal(t, userKey, b.mr.LKey(), "the user region kept its key")
			require.True(t, b.mr.Valid())
		})
	}
}

// A QP that enters ERR by itself raises QP_FATAL with its number.
func TestQPFatalEvent(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	require.Equal(t, ib.EventPortActive, (<-a.dev.Events()).Type)
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.IOVA() + uint64(len(b.buf)), RKey: b.mr.RKey()}))
	requireWC(t, a, 1, ib.WCRemAccessErr)
	select {
	case ev := <-a.dev.Events():
		require.Equal(t, ib.EventQPFatal, ev.Type)
		require.Equal(t, qa.Num(), ev.QPN)
	case <-time.After(20 * time.Second):
		t.Fatal("no QP_FATAL event")
	}
	// A modify to ERR by the application is not an asynchronous event.
	require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState))
	require.Empty(t, unreadEvents(t, a), "unexpected event")
}

// A type 1 window bound with QP.BindMW (ibv_bind_mw) lets the peer in,
// within its range and rights; rebinding retires the old rkey and a zero
// length unbinds it.
func TestBindMWType1(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	region, err := b.pd.RegMR(b.buf[:16<<10], ib.AccessLocalWrite|ib.AccessMWBind)
	require.NoError(t, err)
	mw, err := b.pd.AllocMW(ib.MWType1)
	require.NoError(t, err)
	_, err = qb.BindMW(nil, ib.MWBind{})
	require.Error(t, err)
	mw2, err := b.pd.AllocMW(ib.MWType2)
	require.NoError(t, err)
	_, err = qb.BindMW(mw2, ib.MWBind{MR: region, Addr: region.IOVA(), Length: 8})
	require.Error(t, err, "type 2 windows are bound by work request")

	key1, err := qb.BindMW(mw, ib.MWBind{ID: 1, Flags: ib.SendSignaled, MR: region, Addr: region.IOVA() + 1024,
		Length: 256, Access: ib.AccessRemoteRead})
	require.NoError(t, err)
	requireWC(t, b, 1, ib.WCSuccess)
	require.Equal(t, key1, mw.RKey())
	copy(b.buf[1024:], "window!!")
	read := func(id uint64, key uint32, off uint64) {
		require.NoError(t, qa.PostSend(ib.SendWR{ID: id, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
			SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: region.IOVA() + off, RKey: key}))
	}
	read(2, key1, 1024)
	requireWC(t, a, 2, ib.WCSuccess)
	require.Equal(t, "window!!", string(a.buf[:8]))
	reconnect := func() {
		for _, q := range []*ib.QP{qa, qb} {
			require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
		}
		connectBoth(a, qa, b, qb)
	}
	read(3, key1, 1024+256-4) // straddles the window's end
	requireWC(t, a, 3, ib.WCRemAccessErr)
	reconnect()
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 4, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: region.IOVA() + 1024, RKey: key1}))
	requireWC(t, a, 4, ib.WCRemAccessErr)
	reconnect()

	// Rebind elsewhere: the old rkey is retired.
	key2, err := qb.BindMW(mw, ib.MWBind{ID: 5, Flags: ib.SendSignaled, MR: region, Addr: region.IOVA() + 4096,
		Length: 64, Access: ib.AccessRemoteRead})
	require.NoError(t, err)
	require.NotEqual(t, key1, key2)
	requireWC(t, b, 5, ib.WCSuccess)
	read(6, key1, 1024)
	requireWC(t, a, 6, ib.WCRemAccessErr)
	reconnect()
	read(7, key2, 4096)
	requireWC(t, a, 7, ib.WCSuccess)

	// Zero length unbinds.
	key3, err := qb.BindMW(mw, ib.MWBind{ID: 8, Flags: ib.SendSignaled})
	require.NoError(t, err)
	requireWC(t, b, 8, ib.WCSuccess)
	require.False(t, mw.Bound())
	read(9, key3, 4096)
	requireWC(t, a, 9, ib.WCRemAccessErr)
	reconnect()

	// A region without MW_BIND cannot carry a window: MW_BIND_ERR.
	_, err = qb.BindMW(mw, ib.MWBind{ID: 10, MR: b.mr, Addr: b.mr.IOVA(), Length: 8, Access: ib.AccessRemoteRead})
	require.NoError(t, err)
	requireWC(t, b, 10, ib.WCMWBindErr)
	require.Equal(t, ib.QPSErr, qb.State())
}
