package ib

// Push queues wc on cq as the engine would, for the external tests that
// drive a CQ without traffic. It is not part of the API: only the
// engine completes work.
func Push(cq *CQ, wc WC) error { return cq.c.Push(wc) }

// SpinYielded and SetSpinYielded read and set when cq's spinner last
// yielded (cq_spin.go), in ns since spinEpoch.
func SpinYielded(cq *CQ) int64        { return cq.spin.yielded.Load() }
func SetSpinYielded(cq *CQ, at int64) { cq.spin.yielded.Store(at) }
