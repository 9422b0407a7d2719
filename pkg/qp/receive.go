package qp

import (
	"net/netip"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// DropReason says why a received packet was discarded. The order of the
// checks (and so which reason a packet with several defects gets) is
// rxe_rcv's: length, header, QP, state, address, P_Key/Q_Key, ICRC.
type DropReason uint8

// Drop reasons; see DropReasonNames for the counter names.
const (
	DropNone      DropReason = iota
	DropLength               // shorter than its headers and ICRC
	DropHeader               // bad transport version, padding or length
	DropBadOpcode            // reserved or unsupported opcode
	DropQP                   // no such QP (or QP0/QP1 here)
	DropType                 // opcode transport does not match the QP type
	DropState                // QP not in a state that accepts the packet
	DropAddress              // source/destination address is not the QP's path
	DropPKey                 // P_Key mismatch
	DropQKey                 // Q_Key mismatch (UD)
	DropICRC                 // invariant CRC mismatch
	DropIPv4ID               // IPv4: the ICRC holds only with an Identification the peer cannot have sent
	DropOverrun              // receive queue full: dropped by the socket buffer or an in-memory queue before the engine saw it
	numDropReasons
)

// DropReasonNames are the counter names of the drop reasons.
var DropReasonNames = [numDropReasons]string{
	DropNone:      "",
	DropLength:    "drop_length",
	DropHeader:    "drop_header",
	DropBadOpcode: "drop_bad_opcode",
	DropQP:        "drop_qp",
	DropType:      "drop_qp_type",
	DropState:     "drop_state",
	DropAddress:   "drop_address",
	DropPKey:      "drop_pkey",
	DropQKey:      "drop_qkey",
	DropICRC:      "drop_icrc",
	DropIPv4ID:    "drop_ipv4_id",
	DropOverrun:   "drop_overrun",
}

// NumDropReasons is the number of DropReason values.
const NumDropReasons = int(numDropReasons)

// String returns the counter name.
func (d DropReason) String() string {
	if int(d) < len(DropReasonNames) {
		return DropReasonNames[d]
	}
	return "drop_unknown"
}

// Check applies the per-QP receive checks (type, state, address, keys) to
// a parsed packet, in rxe's order, without changing anything. local is the
// address the QP's path uses on our side (its SGID); invalid skips that
// half of the address check.
func (q *QP) Check(p *wire.Packet, ri *RecvInfo, local netip.Addr) DropReason {
	switch p.Info.Transport {
	case wire.TransportRC:
		if q.typ != RC {
			return DropType
		}
	case wire.TransportUC:
		if q.typ != UC {
			return DropType
		}
	case wire.TransportUD:
		if !q.typ.Datagram() {
			return DropType
		}
	default:
		return DropType
	}
	st := q.attr.State
	if p.Info.Flags&wire.FlagRequest != 0 {
		if st != RTR && st != RTS && st != SQD {
			return DropState
		}
	} else if st != RTS && st != SQD {
		return DropState
	}
	if q.typ.Connected() {
		if ri.Src.Addr().Unmap() != q.attr.AV.DGID.Unmap() {
			return DropAddress
		}
		if local.IsValid() && ri.Dst.Addr().Unmap() != local.Unmap() {
			return DropAddress
		}
		if q.attr.AV.PinSrcPort && ri.Src.Port() != q.attr.AV.peerPort() {
			return DropAddress // attr.go: between rxed peers only
		}
	}
	if p.BTH.PKey()&0x7FFF != DefaultPKey&0x7FFF {
		return DropPKey
	}
	if q.typ.Datagram() {
		want := q.attr.QKey
		if q.typ == GSI {
			want = GSIQKey
		}
		if p.DETH.QKey() != want {
			return DropQKey
		}
	}
	return DropNone
}

// Receive processes a packet that passed every check (including the
// ICRC): requests go to the responder, responses to the completer. The
// packet's memory may be reused once Receive returns.
func (q *QP) Receive(env Env, p *wire.Packet, ri *RecvInfo, now time.Time) {
	q.ctr.RcvdPkts.Add(1)
	q.ReceiveCopy(env, p, ri, now)
}

// ReceiveCopy is Receive without counting the packet in rcvd_pkts, for
// a QP's copy of a multicast datagram: rxe_rcv counts the datagram once,
// before rxe_rcv_mcast_pkt hands it to the attached QPs, and so does the
// engine.
func (q *QP) ReceiveCopy(env Env, p *wire.Packet, ri *RecvInfo, now time.Time) {
	if p.Info.Flags&wire.FlagRequest != 0 {
		q.handleRequest(env, p, ri)
		return
	}
	q.handleResponse(env, p, now)
}

// SetRemoteInvalidate installs the function that invalidates an rkey for
// SEND_WITH_INV; it returns the receive completion status.
func (q *QP) SetRemoteInvalidate(f func(q *QP, rkey uint32) WCStatus) { q.remoteInv = f }

// AV returns the QP's primary path (owner goroutine only).
func (q *QP) AV() *AddrVector { return &q.attr.AV }

// SendQueueLen returns the number of send WRs posted and not completed.
func (q *QP) SendQueueLen() int { return q.sq.Outstanding() }
