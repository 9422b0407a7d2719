package rdmacm

import "github.com/rxed/rxed/pkg/ib"

// Counters returns a snapshot of the IB CM counters of dev's connection
// manager (cm.Manager.Counters, under its names: rx_<msg>, tx_<msg>,
// tx_retries_<msg>, rx_dup_<msg> per message type as cm.c's sysfs groups
// cm_rx_msgs, cm_tx_msgs, cm_tx_retries and cm_rx_duplicates, then
// rx_malformed, rej_*, timeouts, timewait_exits and the other drops and
// answers of pkg/cm's counters.go). A counter appears once it has counted
// something: a running manager that has seen nothing returns an empty,
// non-nil map.
//
// It returns nil when dev has no connection manager: nil dev, never
// enabled (Enable, Listen or Dial start it; Counters does not), or closed
// with its device. The counters are the manager's, not rdma_cm's: rdma_cm
// itself (the listener choice by address, the private data header) counts
// nothing of its own; its refusals show as the CM's REJs.
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
	return a.cm.Counters()
}
