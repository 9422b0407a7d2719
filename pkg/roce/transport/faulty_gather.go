package transport

// Sending pieces through a Faulty conn.
//
// The engine sends a RoCE packet as a Gather (headers, the payload where it
// lies in registered memory, the ICRC) when its Conn is a GatherSender, and
// otherwise copies the payload next to its headers first. A Faulty that hid
// the inner Conn's SendGather cost every packet of a lossy run that copy.
// With inline faults (loss, corruption) the surviving datagrams go out in
// pieces as they would without the wrapper; a corrupted one goes out as a
// flat copy with its bit flipped (the caller's memory is never modified).
// Faults that hold datagrams back or add some, and an inner Conn without
// SendGather, get flat copies through Send. The draws are Send's, in the
// same order, so a seed picks the same datagrams either way.

// SendGather implements GatherSender.
func (f *Faulty) SendGather(dgrams []Gather, ep Endpoint) error {
	gs := f.gs
	if f.tx == nil && gs != nil {
		return gs.SendGather(dgrams, ep)
	}
	for i := range dgrams {
		if dgrams[i].Len() > MaxDatagramSize {
			return ErrTooLarge
		}
	}
	if f.tx == nil || !f.cfg.inline() || gs == nil {
		return f.sendFlat(dgrams, ep)
	}
	d := f.tx
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return errClosed
	}
	// What the inner sends refused, summed, at the positions in dgrams
	// (keptPos[k] is kept[k]'s), as flushSend's.
	var rf refusals
	kept, keptPos := d.gathers[:0], d.gatherPos[:0]
	sendKept := func() {
		if err := gs.SendGather(kept, ep); err != nil {
			rf.addInner(err, len(kept), func(k int) int { return keptPos[k] })
		}
		kept, keptPos = kept[:0], keptPos[:0]
	}
	for i := range dgrams {
		v := d.decide(dgrams[i].Len())
		switch {
		case v.lost:
		case v.corrupt:
			if len(kept) > 0 {
				sendKept()
			}
			d.flat[0] = dgrams[i].AppendTo(d.flat[0][:0])
			flipBit(d.flat[0], v.bit)
			if err := f.inner.Send(d.flat[:], ep); err != nil {
				rf.addInner(err, 1, func(int) int { return i })
			}
		default:
			kept, keptPos = append(kept, dgrams[i]), append(keptPos, i)
		}
	}
	if len(kept) > 0 {
		sendKept()
	}
	clear(kept)
	d.gathers, d.gatherPos = kept[:0], keptPos[:0]
	return rf.err()
}

// sendFlat sends dgrams through Send as flat copies.
func (f *Faulty) sendFlat(dgrams []Gather, ep Endpoint) error {
	f.flatMu.Lock()
	defer f.flatMu.Unlock()
	return f.Send(f.flat.flatten(dgrams), ep) // copies what it keeps past the call
}
