package roce

import (
	"errors"
	"net/netip"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// parseDrop maps a Parse error to its drop reason.
func parseDrop(err error) qp.DropReason {
	switch {
	case errors.Is(err, wire.ErrTruncated):
		return qp.DropLength
	case errors.Is(err, wire.ErrBadOpcode):
		return qp.DropBadOpcode
	default:
		return qp.DropHeader
	}
}

// handlePacket runs the receive checks and the protocol for one datagram.
// pkt is only borrowed: nothing may keep it (or p.Raw) after the call.
func (w *worker) handlePacket(pkt []byte, ep *transport.Endpoint) {
	e := w.e
	p := &w.pkt
	// Multicast (mcast.go): a datagram to QP 0xFFFFFF goes to every QP
	// attached to its destination group. A CNP may name QP 0xFFFFFF too
	// (the conformance corpus has one): it is counted below.
	if b := wire.BTH(pkt[:wire.BTHLen]); b.DestQP() == McastQPN && b.Opcode() != wire.CNP {
		w.handleMcast(pkt, ep)
		return
	}
	// rxe_chk_dgid: the destination must be one of our GIDs (or a
	// multicast group: mcast.go). A kernel socket only delivers such
	// packets, but a wildcard bind or an injected packet may not be.
	if !e.isLocal(ep.Local.Addr()) && !transport.IsGroup(ep.Local.Addr()) {
		e.drop(qp.DropAddress)
		return
	}
	if err := p.Parse(pkt); err != nil {
		e.drop(parseDrop(err))
		return
	}
	w.ri = qp.RecvInfo{Src: ep.Remote, Dst: ep.Local, TrafficClass: ep.TrafficClass, HopLimit: ep.HopLimit,
		FlowLabel: ep.FlowLabel}
	if p.Opcode == wire.CNP {
		if r := w.checkICRC(p.Raw, ep); r != qp.DropNone {
			e.drop(r)
			return
		}
		w.ctr.CNPRcvd.Add(1)
		return
	}
	ent := w.qps[p.BTH.DestQP()]
	if ent == nil {
		e.drop(qp.DropQP)
		return
	}
	q := ent.q
	var local netip.Addr
	if q.Type().Connected() {
		local = e.gid(q.AV().SGIDIndex)
	}
	if r := q.Check(p, &w.ri, local); r != qp.DropNone {
		e.drop(r)
		return
	}
	if r := w.checkICRC(p.Raw, ep); r != qp.DropNone {
		e.drop(r)
		return
	}
	q.Receive(w, p, &w.ri, w.clockNow())
	if !ent.afterRx {
		ent.afterRx = true
		w.afterRx = append(w.afterRx, ent)
	}
}

// checkICRC verifies the ICRC of a received packet and, over IPv4, that
// the Identification it solved to is one the peer could have sent (see
// ipv4id.go): without that check a corrupted IPv4 packet passes with
// probability 2^-15. The solved Identification and DF flag go to w.ri,
// for the GRH of a UD receive (pkg/qp's grh.go).
func (w *worker) checkICRC(raw []byte, ep *transport.Endpoint) qp.DropReason {
	v, id, dfClear := (wire.Flow{Src: ep.Remote, Dst: ep.Local}).VerifyIPv4(raw)
	if v != wire.ICRCOK {
		return qp.DropICRC
	}
	w.ri.IPv4ID, w.ri.IPv4DFClear = id, dfClear
	src := ep.Remote.Addr()
	if !src.Unmap().Is4() {
		return qp.DropNone
	}
	switch w.e.ids.admit(src, ep.Local.Addr(), id, w.clockNow()) {
	case idReject:
		return qp.DropIPv4ID
	case idResync:
		w.e.idResyncs.Add(1)
	}
	return qp.DropNone
}
