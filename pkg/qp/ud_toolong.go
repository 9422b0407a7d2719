package qp

// A UD message longer than the port's MTU fits no packet. IBA C10-93.1.1
// says the CI shall emit no packet for it and shall not report an error
// for it, and rxe_requester does just that ("fake a successful UD send"):
// the WQE takes one PSN as if its packet had gone, completes with
// SUCCESS, and the QP carries on with the next one. Failing it instead
// (LOC_LEN_ERR) would move the QP to ERR, which rxe never does for it.

// udTooLong reports that w is a UD or GSI message over the port's MTU (a
// SEND_WITH_INV fails first: rxe picks the opcode before it looks at the
// length).
func (q *QP) udTooLong(w *wqe) bool {
	return q.typ.Datagram() && w.length > q.mtu && w.wr.Opcode != WRSendWithInv
}

// completeUnsent is rxe_requester's C10-93.1.1 step for such a message:
// one PSN, no packet, done with SUCCESS (in order, when the completer
// reaches it).
func (q *QP) completeUnsent(w *wqe) {
	psn := q.req.psn
	w.firstPSN, w.lastPSN = psn, psn
	q.req.psn = psn.Next()
	q.req.noteSent()
	q.markStarted()
	w.state = wqeDone
	q.req.idx++
}
