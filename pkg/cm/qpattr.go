package cm

// ACKTimeout returns the local ACK timeout (IBA time value) the QP of
// this connection should use: cm.c's av.timeout, which ib_cm_init_qp_attr
// puts in the RTS attributes. Active side: computed from the path's
// packet life time and the REP's target ACK delay; passive side: the
// REQ's local ACK timeout.
func (id *ID) ACKTimeout() uint8 {
	id.m.mu.Lock()
	defer id.m.mu.Unlock()
	return id.avTimeout
}
