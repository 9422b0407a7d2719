package ib_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// udPair opens two peers with a UD QP each in RTS (Q_Key 0x1111).
func udPair(t *testing.T, addrA, addrB string) (*peer, *ib.QP, *peer, *ib.QP) {
	t.Helper()
	a, b := peerPair(t, addrA, addrB)
	qa, qb := a.createQP(ib.UD), b.createQP(ib.UD)
	for _, q := range []*ib.QP{qa, qb} {
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: 0x1111},
			ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 1}, ib.AttrState|ib.AttrSQPSN))
	}
	return a, qa, b, qb
}

// nextEvent waits for p's next asynchronous event.
func nextEvent(t *testing.T, p *peer) ib.AsyncEvent {
	t.Helper()
	select {
	case ev := <-p.dev.Events():
		return ev
	case <-time.After(20 * time.Second):
		t.Fatal("no asynchronous event")
		return ib.AsyncEvent{}
	}
}

// unsendableAV is a path towards peer b that the other peer's device
// cannot send along, with the name of its subtest.
type unsendableAV struct {
	name string
	av   func(b *peer) ib.AddrVector
}

// unsendableAVs are the two unsendable paths the tests below try: a
// source GID index (sgidIndex) outside the sender's GID table, and an
// IPv6 destination from its IPv4 GID.
func unsendableAVs(sgidIndex uint8) []unsendableAV {
	return []unsendableAV{
		{"sgid_index outside the GID table", func(b *peer) ib.AddrVector {
			return ib.AddrVector{DGID: b.addr, SGIDIndex: sgidIndex, DestPort: b.dev.UDPPort(), PortNum: 1}
		}},
		{"IPv6 destination from an IPv4 GID", func(b *peer) ib.AddrVector {
			return ib.AddrVector{DGID: netip.MustParseAddr("fd00::2"), DestPort: b.dev.UDPPort(), PortNum: 1}
		}},
	}
}

// A UD send whose address vector the device cannot send along (built by
// hand, since CreateAH refuses it) used to complete with SUCCESS while
// the engine dropped the packet and counted send_err. Like rdma_rxe when
// its requester cannot send, it now completes with LOC_QP_OP_ERR, the QP
// moves to ERR (QP_FATAL), and the WRs after it are flushed.
//
// Regression test: was TestRegressUDSendUnsendableAVFails in regress_badav_test.go
// (added in commit 7d1552a).
func TestUDSendUnsendableAVFails(t *testing.T) {
	for _, tc := range unsendableAVs(3) {
		t.Run(tc.name, func(t *testing.T) {
			a, qa, b, qb := udPair(t, "10.11.0.1", "10.11.0.2")
			require.Equal(t, ib.EventPortActive, nextEvent(t, a).Type)
			av := tc.av(b)
			_, err := a.pd.CreateAH(av)
			require.ErrorIs(t, err, ib.ErrBadAV, "CreateAH refuses it")

			good, err := a.pd.CreateAH(ib.AHAttr{DGID: b.addr, DestPort: b.dev.UDPPort(), PortNum: 1})
			require.NoError(t, err)
			require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 50, SGL: []ib.SGE{b.sge(0, 40+64)}}))
			sendErr := a.dev.Counters()["send_err"]
			wr := func(id uint64) ib.SendWR {
				w := ib.SendWR{ID: id, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 16)}}
				ib.UDSend(&w, good, qb.Num(), 0x1111)
				return w
			}
			bad := wr(2)
			bad.AV = av
			require.NoError(t, qa.PostSend(wr(1), bad, wr(3)), "rxe checks a UD WR's address when it sends it")
			requireWC(t, a, 1, ib.WCSuccess)
			requireWC(t, a, 2, ib.WCLocQPOpErr)
			requireWC(t, a, 3, ib.WCWRFlushErr)
			require.Equal(t, ib.QPSErr, qa.State())
			ev := nextEvent(t, a)
			require.Equal(t, ib.EventQPFatal, ev.Type)
			require.Equal(t, qa.Num(), ev.QPN)
			require.Equal(t, sendErr+1, a.dev.Counters()["send_err"])
			require.Equal(t, uint64(50), next(b.cq).ID, "the good datagram before it arrived")

			require.NoError(t, qa.PostSend(wr(4)))
			requireWC(t, a, 4, ib.WCWRFlushErr)
		})
	}
}

// A connected QP's path is checked at modify time, as ib_modify_qp does:
// INIT->RTR with an sgid_index outside the GID table, or a destination of
// the other IP family, fails with ErrAttrValue naming IBV_QP_AV, and the
// QP stays in INIT with its attributes unchanged; fixed, it goes through.
//
// Regression test: was TestRegressModifyRTRRefusesUnsendablePath in regress_badav_test.go
// (added in commit 7d1552a).
func TestModifyRTRRefusesUnsendablePath(t *testing.T) {
	for _, typ := range []ib.QPType{ib.RC, ib.UC} {
		for _, tc := range unsendableAVs(1) {
			t.Run(typ.String()+"/"+tc.name, func(t *testing.T) {
				a, b := peerPair(t, "10.12.0.1", "10.12.0.2")
				qa, qb := a.createQP(typ), b.createQP(typ)
				require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1},
					ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
				before, _, err := qa.Query()
				require.NoError(t, err)
				attr := &ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU1024, DestQPN: qb.Num(), RQPSN: 100,
					MaxDestRdAtomic: 1, MinRNRTimer: 1, AV: tc.av(b)}
				mask := ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN
				if typ == ib.RC {
					mask |= ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer
				}
				err = qa.Modify(attr, mask)
				require.ErrorIs(t, err, ib.ErrAttrValue)
				var me *ib.ModifyError
				require.True(t, errors.As(err, &me))
				require.Equal(t, ib.AttrAV, me.Attr, "%v", err)
				require.Equal(t, ib.QPSInit, qa.State())
				after, _, err := qa.Query()
				require.NoError(t, err)
				require.Equal(t, before, after, "a refused modify changes nothing")

				attr.AV = ib.AddrVector{DGID: b.addr, DestPort: b.dev.UDPPort(), PortNum: 1}
				require.NoError(t, qa.Modify(attr, mask))
				require.Equal(t, ib.QPSRTR, qa.State())
			})
		}
	}
}
