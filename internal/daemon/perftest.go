package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
)

// maxPerftestQPs bounds the QPs one client may set up (perftest's -q).
const maxPerftestQPs = 64

// perftestQP is one QP of a perftest session.
type perftestQP struct {
	qp  *ib.QP
	psn uint32
	key oob.Key
}

// perftestSession plays the server of ib_write_bw / ib_read_bw /
// ib_atomic_bw (all three use the same exchange) against the perftest
// export. The server of those tests idles during the run, so after
// setting up the QPs the daemon only waits for the client's report.
//
// The client's -q is not announced: its address keys are answered one by
// one, each with a fresh QP, until a key equal to the first one arrives,
// which is the first barrier. The QP offered in answer to that barrier is
// not used (the client keeps only the export's address and rkey from it,
// which every QP shares).
func (d *Daemon) perftestSession(ctx context.Context, sess *oob.Session) (err error) {
	log := d.log.With("peer", sess.RemoteAddr())
	cq, err := d.dev.CreateCQ(16)
	if err != nil {
		return err
	}
	var qps []*perftestQP
	defer func() {
		for _, q := range qps {
			_ = q.qp.Destroy()
		}
		_ = cq.Destroy()
		if err != nil {
			_ = sess.CloseWithoutExchange()
		}
	}()
	mtu := d.cfg.MTU
	if mtu == 0 {
		pa, _ := d.dev.QueryPort(1)
		mtu = int(pa.ActiveMTU)
	}
	neg, err := sess.Negotiate(ctx, mtu)
	if err != nil {
		return err
	}
	var remotes []oob.Key
	for {
		q, err := d.newPerftestQP(cq)
		if err != nil {
			return err
		}
		qps = append(qps, q)
		k, err := sess.HandShake(ctx, q.key)
		if err != nil {
			return err
		}
		if len(remotes) > 0 && k == remotes[0] {
			break // the first barrier: the client has connected its QPs
		}
		if len(remotes) == 0 && k.RKey == 0 && k.VAddr == 0 {
			// perftest sends no buffer address in send tests: ib_send_bw and
			// ib_send_lat need a peer that posts receives, not an export.
			return errors.New("the client runs a send test (its key has no buffer address); serve answers ib_write_bw, ib_read_bw and ib_atomic_bw clients (use rxed perf send for send tests)")
		}
		if len(remotes) == maxPerftestQPs {
			return fmt.Errorf("client offered more than %d QPs", maxPerftestQPs)
		}
		remotes = append(remotes, k)
	}
	q0 := qps[0]
	for i, rk := range remotes {
		if err := d.connectPerftestQP(qps[i], rk, neg.MTU); err != nil {
			return fmt.Errorf("connecting QP %#x to the client's QP %#x: %v", qps[i].qp.Num(), rk.QPN, err)
		}
	}
	log.Info("perftest client connected", "version", neg.RemoteVersion, "qps", len(remotes),
		"mtu", oob.MTUBytes(neg.MTU), "export", d.target.Spec.Name, "client_out_reads", remotes[0].OutReads)
	if _, err := sess.HandShake(ctx, q0.key); err != nil {
		return err
	}
	rep, err := sess.Finish(ctx, oob.Test{Verb: oob.VerbWrite}, q0.key, oob.BWReport{})
	if err != nil {
		return err
	}
	log.Info("perftest client done", "size", rep.Size, "iterations", rep.Iters,
		"bw_avg_MBps", fmt.Sprintf("%.2f", rep.BWAvg), "msg_rate_Mpps", fmt.Sprintf("%.6f", rep.MsgRateAvg))
	if err := d.target.Mapping.Sync(); err != nil {
		log.Warn("msync after session failed", "export", d.target.Spec.Name, "err", err)
	}
	return nil
}

func (d *Daemon) newPerftestQP(cq *ib.CQ) (*perftestQP, error) {
	q, err := d.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	access := uint32(ib.QPAccessRemoteRead)
	if !d.target.Spec.ReadOnly {
		access |= ib.QPAccessRemoteWrite | ib.QPAccessRemoteAtomic
	}
	if err := q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: access},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags); err != nil {
		_ = q.Destroy()
		return nil, err
	}
	gid := d.cfg.Addrs[d.cfg.GIDIndex]
	p := &perftestQP{qp: q, psn: rand.Uint32() & 0xffffff}
	p.key = oob.Key{OutReads: 128, QPN: q.Num(), PSN: p.psn, RKey: d.target.MR.RKey(), VAddr: d.target.MR.IOVA(), GID: gid.As16()}
	return p, nil
}

func (d *Daemon) connectPerftestQP(q *perftestQP, rk oob.Key, mtu int) error {
	dgid := netip.AddrFrom16(rk.GID).Unmap()
	if dgid.IsUnspecified() {
		return errors.New("the client sent an all-zero GID")
	}
	av := ib.AddrVector{DGID: dgid, SGIDIndex: uint8(d.cfg.GIDIndex), PortNum: 1, DestPort: d.cfg.Port}
	if err := q.qp.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU(mtu), DestQPN: rk.QPN, RQPSN: ib.PSN(rk.PSN),
		MaxDestRdAtomic: 128, MinRNRTimer: 12, AV: av},
		ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer); err != nil {
		return err
	}
	return q.qp.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: ib.PSN(q.psn), Timeout: d.cfg.QPTimeout, RetryCnt: 7, RNRRetry: 7,
		MaxRdAtomic: uint8(min(max(int(rk.OutReads), 1), 128))},
		ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic)
}
