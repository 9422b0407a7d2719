package daemon

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

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
//
// The GID in the client's keys is where every response goes, so it must
// be the client's own (gidcheck.go): a perftest client's must be the
// address of its TCP connection (or --allow-unverified-gid); an rxed
// client's may be any address from which it can echo a nonce the daemon
// RDMA-WRITEs to it, and it learns the export's rkey only then. Until the
// proof, what the daemon may send to the announced address is bounded by
// AmplificationFactor times what the client has sent us.
func (d *Daemon) perftestSession(ctx context.Context, sess *oob.Session, s *session) (err error) {
	log := d.log.With("peer", sess.RemoteAddr())
	cq, err := d.dev.CreateCQ(16)
	if err != nil {
		return err
	}
	var qps []*perftestQP
	var remotes []oob.Key
	defer func() {
		for i, q := range qps {
			if i < len(remotes) {
				d.retireQP(q.qp, s.traffic, netip.AddrFrom16(remotes[i].GID), remotes[i].QPN)
			} else {
				_ = q.qp.Destroy()
			}
		}
		_ = cq.Destroy()
		if err != nil {
			_ = sess.CloseWithoutExchange()
		}
	}()
	// The exchange up to the run has HandshakeTimeout in all: a client
	// that connects and says nothing (or dribbles) loses its slot soon.
	hctx, hcancel := context.WithTimeout(ctx, d.cfg.HandshakeTimeout)
	defer hcancel()
	hdeadline, _ := hctx.Deadline()
	handshaking := true // until the run: a later failure is no handshake timeout
	defer func() {
		// The step's read deadline is the context's: it may fire a moment
		// before the context itself reports it. The deadline is on the
		// wall clock (the context's), not the daemon's injected one.
		if err != nil && handshaking && ctx.Err() == nil && (errors.Is(hctx.Err(), context.DeadlineExceeded) || !time.Now().Before(hdeadline)) {
			d.hsTimeouts.Add(1)
			err = fmt.Errorf("handshake timed out after %v: %w", d.cfg.HandshakeTimeout, err)
		}
	}()
	mtu := d.cfg.MTU
	if mtu == 0 {
		pa, _ := d.dev.QueryPort(1)
		mtu = int(pa.ActiveMTU)
	}
	neg, err := sess.Negotiate(hctx, mtu)
	if err != nil {
		return err
	}
	if len(d.cfg.Token) > 0 && !sess.TokenVerified() {
		return errors.New("token mode: the client proved no token") // Negotiate refuses first; belt and braces
	}
	ext := sess.Ext()
	var gc gidCheck
	for {
		q, err := d.newPerftestQP(cq)
		if err != nil {
			return err
		}
		qps = append(qps, q)
		k, err := sess.Answer(hctx, func(k oob.Key) (oob.Key, error) {
			if len(remotes) == 0 || k != remotes[0] {
				if err := gc.check(k, s.peer, ext, d.cfg.AllowUnverifiedGID); err != nil {
					if errors.Is(err, errUnverifiedGID) { // not a malformed key (the all-zero GID)
						d.refusedGID.Add(1)
					}
					return oob.Key{}, err
				}
			}
			key := q.key
			if ext {
				key.RKey = 0 // granted after the address proof
			}
			return key, nil
		})
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
	st := s.traffic
	if gc.needProof {
		// Until the address answers, it gets a few times what the client
		// sent us, which is room for the nonce and its retries.
		st.txLimit.Store(AmplificationFactor * sess.BytesRead())
	} else if d.cfg.SessionBytes > 0 {
		st.txLimit.Store(d.cfg.SessionBytes)
	}
	for i, rk := range remotes {
		if err := d.traffic.track(st, qps[i].qp.Num(), netip.AddrFrom16(rk.GID), rk.QPN); err != nil {
			return err
		}
		if err := d.connectPerftestQP(qps[i], rk, neg.MTU); err != nil {
			return fmt.Errorf("connecting QP %#x to the client's QP %#x: %v", qps[i].qp.Num(), rk.QPN, err)
		}
	}
	var nonce [16]byte
	var proofErr error
	if gc.needProof {
		nonce, proofErr = d.sendNonce(hctx, q0, cq, remotes[0])
		if proofErr != nil {
			log.Warn("address proof: the nonce did not reach the announced GID", "gid", gc.gid, "err", proofErr)
		}
	}
	log.Info("perftest client connected", "version", neg.RemoteVersion, "qps", len(remotes),
		"mtu", oob.MTUBytes(neg.MTU), "export", d.target.Spec.Name, "client_out_reads", remotes[0].OutReads,
		"gid", gc.gid, "rxed_client", ext, "gid_proof", gc.needProof)
	barrier := q0.key
	if ext {
		barrier.RKey = 0
	}
	if _, err := sess.HandShake(hctx, barrier); err != nil {
		return err
	}
	if ext {
		err := sess.CheckAddress(hctx, func(got [16]byte) (oob.Grant, oob.ExtStatus) {
			if gc.needProof && (proofErr != nil || got != nonce) {
				// Counted here, as refused: a client that leaves before
				// its proof arrives was refused nothing.
				d.refusedGID.Add(1)
				return oob.Grant{}, oob.ExtUnverifiedGID
			}
			// Proved: the amplification bound gives way to the session's
			// before the grant leaves, since the client starts its run the
			// moment it reads the grant; lifted after, the first READ
			// responses fell to the bound and waited out a retransmission.
			st.txLimit.Store(d.cfg.SessionBytes)
			return oob.Grant{RKey: d.target.MR.RKey(), VAddr: d.target.MR.IOVA(), Len: uint64(d.target.MR.Len())}, oob.ExtOK
		})
		if err != nil {
			return err
		}
		if d.afterGrant != nil {
			d.afterGrant()
		}
	}
	handshaking = false
	hcancel()
	d.established(s)
	rep, err := sess.Finish(ctx, oob.Test{Verb: oob.VerbWrite}, q0.key, oob.BWReport{})
	if err != nil {
		return err
	}
	log.Info("perftest client done", "size", rep.Size, "iterations", rep.Iters,
		"bw_avg_MBps", fmt.Sprintf("%.2f", rep.BWAvg), "msg_rate_Mpps", fmt.Sprintf("%.6f", rep.MsgRateAvg),
		"sent_bytes", st.txBytes.Load(), "dropped_by_budget", st.drops.Load())
	if err := d.target.Mapping.Sync(); err != nil {
		log.Warn("msync after session failed", "export", d.target.Spec.Name, "err", err)
	}
	return nil
}

// sendNonce RDMA-WRITEs a fresh nonce into the client's first buffer
// (inline, 16 bytes) and waits for its completion: once the client has
// ACKed it the nonce is in its memory, before our next key message.
func (d *Daemon) sendNonce(ctx context.Context, q *perftestQP, cq *ib.CQ, rk oob.Key) ([16]byte, error) {
	var nonce [16]byte
	_, _ = crand.Read(nonce[:])
	wr := ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled | ib.SendInline, Inline: nonce[:],
		RemoteAddr: rk.VAddr, RKey: rk.RKey}
	if err := q.qp.PostSend(wr); err != nil {
		return nonce, err
	}
	var wc [1]ib.WC
	if _, err := cq.WaitPoll(ctx, wc[:]); err != nil {
		return nonce, fmt.Errorf("no completion: %v", err)
	}
	if wc[0].Status != ib.WCSuccess {
		return nonce, fmt.Errorf("completion status %v", wc[0].Status)
	}
	return nonce, nil
}

func (d *Daemon) newPerftestQP(cq *ib.CQ) (*perftestQP, error) {
	q, err := d.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 16}})
	if err != nil {
		return nil, err
	}
	access := ib.AccessRemoteRead
	if !d.target.Spec.ReadOnly {
		access |= ib.AccessRemoteWrite | ib.AccessRemoteAtomic
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
