package rdmacm

import "github.com/rxed/rxed/pkg/ib"

// Counters returns a snapshot of the IB CM counters of dev's connection
// manager (cm.Manager.Counters, under its names: rx_<msg>, tx_<msg>,
// tx_retries_<msg>, rx_dup_<msg> per message type as cm.c's sysfs groups
// cm_rx_msgs, cm_tx_msgs, cm_tx_retries and cm_rx_duplicates, then
// rx_malformed, rej_*, timeouts, timewait_exits and the other drops and
// answers of pkg/cm's counters.go), and rdma_cm's own: rej_src_mismatch,
// the requests refused because rdma_cm's header names another source
// address than the one they came from (source.go); req_evicted, the
// queued requests a full backlog refused to make room for a lighter
// source, and req_source_full, the requests turned away because their
// source held the cap ListenOptions.MaxPerSource set it
// (listen_backlog.go); req_expired,
// the queued requests refused because their peer's retries were over or
// they had waited 2 minutes (REJ 28; SIDR_REP REJECT for a SIDR_REQ
// after 65.5 s) (listen_expiry.go). A counter appears once
// it has counted something: a running manager that has seen nothing
// returns an empty, non-nil map.
//
// It returns nil when dev has no connection manager: nil dev, never
// enabled (Enable, Listen or Dial start it; Counters does not), or closed
// with its device. rdma_cm's other refusals (no listener for the header's
// address, a malformed header) count nothing of their own: they show as
// the CM's REJs; the REQs a full backlog drops count as the manager's
// req_dropped (cm.ID.DestroyNoReject), those over their source's cap
// too (and in req_source_full).
//
// Safe for concurrent use with everything else on dev; the snapshot is
// the caller's to keep.
func Counters(dev *ib.Device) map[string]uint64 {
	if dev == nil {
		return nil
	}
	a := running(dev)
	if a == nil {
		return nil
	}
	// The Manager has its own lock; a manager closed since the lookup
	// still answers with its last counts.
	c := a.cm.Counters()
	if n := a.srcMismatch.Load(); n > 0 {
		c[cntRejSrcMismatch] = n
	}
	if n := a.reqEvicted.Load(); n > 0 {
		c[cntReqEvicted] = n
	}
	if n := a.reqSourceFull.Load(); n > 0 {
		c[cntReqSourceFull] = n
	}
	if n := a.reqExpired.Load(); n > 0 {
		c[cntReqExpired] = n
	}
	return c
}
