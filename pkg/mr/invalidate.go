package mr

// Invalidate executes a LOCAL_INV work request, or the invalidation a
// SEND_WITH_INV asks of the responder, for key on behalf of QP qpn in pd
// (rxe_invalidate_mr / rxe_invalidate_mw). The object returns to the free
// state; its key stays the same but resolves to ErrInvalidated until it is
// registered (REG_MR) or bound (BIND_MW) again.
//
// A region must be a fast-registration region (ErrBadState otherwise),
// named by its current key (ErrInvalidKey), in pd (ErrPDMismatch) and have
// no windows bound (ErrMWBound). A window must be type 2 (o10-37.2.26;
// ErrBadState), bound (ErrInvalidated), named by its current rkey, in pd
// and bound through qpn (ErrBadQP). On failure nothing changes; the engine
// completes a failed local invalidate with LOC_QP_OP_ERR and a failed
// remote one with RemoteInvalidateStatus.
func (t *Table) Invalidate(pd *PD, qpn uint32, key uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if IsMWKey(key) {
		return t.invalidateMW(pd, qpn, key)
	}
	m := t.mrs.get(KeyIndex(key))
	if m == nil {
		return wrapf(ErrInvalidKey, "no region with key %#x", key)
	}
	old := m.st.Load()
	switch {
	case old == nil || old.key != key:
		return wrapf(ErrInvalidKey, "key %#x is not the region's current key", key)
	case old.pd != pd:
		return wrapf(ErrPDMismatch, "region %#x is in another pd", key)
	case m.numMW > 0:
		return wrapf(ErrMWBound, "%d windows bound to region %#x", m.numMW, key)
	case !m.fast:
		return wrapf(ErrBadState, "region %#x is not a fast-registration region", key)
	}
	// The free version keeps the translation for introspection only; it
	// pins nothing (the mapping the next REG_MR's memory lies in is
	// pinned by Map).
	st := &mrState{key: old.key, pd: old.pd, access: old.access, iova: old.iova, buf: old.buf}
	st.refs.Store(1)
	m.st.Store(st)
	old.put()
	return nil
}

func (t *Table) invalidateMW(pd *PD, qpn uint32, key uint32) error {
	w := t.mws.get(KeyIndex(key))
	if w == nil {
		return wrapf(ErrInvalidKey, "no window with rkey %#x", key)
	}
	ws := w.st.Load()
	switch {
	case ws == nil || ws.rkey != key:
		return wrapf(ErrInvalidKey, "rkey %#x is not the window's current key", key)
	case w.typ == MWType1:
		return wrapf(ErrBadState, "type 1 window %#x cannot be invalidated", key)
	case !ws.valid:
		return wrapf(ErrInvalidated, "window %#x is not bound", key)
	case w.pd != pd:
		return wrapf(ErrPDMismatch, "window %#x is in another pd", key)
	case ws.qpn != qpn:
		return wrapf(ErrBadQP, "window %#x is bound to QP %#x, not %#x", key, ws.qpn, qpn)
	}
	w.invalidate(ws)
	return nil
}

// invalidate returns a bound type 2 window, at version ws, to the free
// state: its rkey stays, it no longer counts against its region. t.mu held.
func (w *MW) invalidate(ws *mwState) {
	if ws.mr != nil {
		ws.mr.numMW--
	}
	w.st.Store(&mwState{rkey: ws.rkey, qpn: NoQP})
}

// DetachQP invalidates every type 2 window bound through QP number qpn and
// returns how many there were. Call it when the QP is destroyed: QP numbers
// are reused, and a window must not become reachable from a new QP that
// happens to get the old number.
func (t *Table) DetachQP(qpn uint32) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for ci := range t.mws.chunks {
		c := t.mws.chunks[ci].Load()
		if c == nil {
			continue
		}
		for i := range c {
			w := c[i].p.Load()
			if w == nil {
				continue
			}
			ws := w.st.Load()
			if ws == nil || w.typ != MWType2 || !ws.valid || ws.qpn != qpn {
				continue
			}
			w.invalidate(ws)
			n++
		}
	}
	return n
}
