package qp

import "github.com/rxed/rxed/pkg/wire"

// grhLen is the room a UD receive buffer gives the GRH.
const grhLen = 40

// writeGRH fills the first 40 bytes of a UD receive buffer as rxe's
// execute does (rxe_resp.c): over IPv6 the packet's IPv6 header, over
// IPv4 20 zero bytes and then the packet's IPv4 header. The header is
// the one the ICRC covered, rebuilt: addresses and lengths from the
// datagram, the Identification and DF flag the ICRC check solved
// (RecvInfo), the TOS and TTL (traffic class, hop limit and IPv6 flow
// label) the transport reported (RecvInfo; it does while a UD or the GSI
// QP exists), and otherwise what the ICRC masks as Linux sends it unless
// told otherwise (TTL / hop limit 64, TOS / traffic class 0, flow label
// 0), with a valid header checksum
// (libibverbs' ibv_init_ah_from_wc tells IPv4 from IPv6 by it). The
// receive has room for it (the caller checked); false means its SGL
// could not take it (malformedRecv).
func (q *QP) writeGRH(ri *RecvInfo, udpPayload int) bool {
	var grh [grhLen]byte
	fl := wire.Flow{Src: ri.Src, Dst: ri.Dst}
	ip := grh[:]
	if fl.IsIPv4() {
		ip = grh[grhLen-20:]
		fl.PutIPHeader(ip, 8+udpPayload)
		wire.SetIPv4Unseen(ip, ri.IPv4ID, ri.IPv4DFClear)
	} else {
		fl.PutIPHeader(ip, 8+udpPayload)
	}
	if ri.HopLimit != 0 {
		wire.SetIPTraffic(ip, ri.TrafficClass, ri.HopLimit, ri.FlowLabel)
	}
	if !q.scatter(q.resp.recv.SGL, grh[:], 0) {
		return false // the caller checked the room: the SGL is malformed
	}
	q.resp.recvOff = len(grh)
	return true
}
