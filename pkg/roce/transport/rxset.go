package transport

// rxSet is a reusable set of receive buffers: one batch worth of
// buffers, sizes and endpoints for a Receive call.
type rxSet struct {
	bufs  [][]byte
	sizes []int
	eps   []Endpoint
}

func newRxSet(n, size int) *rxSet {
	r := &rxSet{bufs: make([][]byte, n), sizes: make([]int, n), eps: make([]Endpoint, n)}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, size)
	}
	return r
}
