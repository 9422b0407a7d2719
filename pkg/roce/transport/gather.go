package transport

// Gather is one datagram given as up to three pieces sent back to back
// (headers, a payload left where it lies in registered memory, and a
// trailer with the pad and the ICRC), so a sender need not copy the
// payload next to its headers first. Empty pieces are skipped.
type Gather [3][]byte

// Len is the datagram's length.
func (g *Gather) Len() int { return len(g[0]) + len(g[1]) + len(g[2]) }

// AppendTo appends the datagram, its pieces joined, to b.
func (g *Gather) AppendTo(b []byte) []byte {
	return append(append(append(b, g[0]...), g[1]...), g[2]...)
}

// flattener joins Gather datagrams for a Send that takes them whole, in
// buffers it keeps for the next call. Its owner's lock guards it, and the
// result is valid until the next call: Send reads it during the call
// only. The fault injector (pieces through an inner Conn without
// SendGather, or through faults that need whole datagrams) and the pcap
// recorder (its inner Conn without SendGather) share it.
type flattener struct{ bufs [][]byte }

// flatten returns dgrams, each joined into one of f's buffers.
func (f *flattener) flatten(dgrams []Gather) [][]byte {
	for len(f.bufs) < len(dgrams) {
		f.bufs = append(f.bufs, nil)
	}
	out := f.bufs[:len(dgrams)]
	for i := range dgrams {
		out[i] = dgrams[i].AppendTo(out[i][:0])
	}
	return out
}

// GatherSender is implemented by Conns that send Gather datagrams with
// scatter/gather I/O (UDP: one iovec per piece), so the kernel copies the
// payload straight from where it lies.
type GatherSender interface {
	// SendGather is Send for datagrams in pieces: it reads them during the
	// call only.
	SendGather(dgrams []Gather, ep Endpoint) error
}
