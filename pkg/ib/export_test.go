package ib

// Push queues wc on cq as the engine would, for the external tests that
// drive a CQ without traffic. It is not part of the API: only the
// engine completes work.
func Push(cq *CQ, wc WC) error { return cq.c.Push(wc) }
