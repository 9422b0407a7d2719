package mr

// AllocFastMR creates a fast-registration region (ib_alloc_mr with
// IB_MR_TYPE_MEM_REG) in pd: it has keys but is in the free state, so they
// resolve to ErrInvalidated until a REG_MR work request (FastReg) maps up to
// maxLen bytes.
func (t *Table) AllocFastMR(pd *PD, maxLen int) (*MR, error) {
	if maxLen <= 0 {
		return nil, wrapf(ErrInvalidArgument, "fast region of %d bytes", maxLen)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkPD(pd); err != nil {
		return nil, err
	}
	key, sl, err := t.mrs.allocKey(t)
	if err != nil {
		return nil, err
	}
	st := &mrState{key: key, pd: pd}
	st.refs.Store(1)
	m := &MR{t: t, index: KeyIndex(key), fast: true, maxLn: maxLen}
	m.st.Store(st)
	sl.p.Store(m)
	pd.users++
	return m, nil
}

// MaxLen is the capacity of a fast-registration region (0 for others).
func (m *MR) MaxLen() int { return m.maxLn }

// Map sets the memory the next REG_MR work request of the
// fast-registration region m registers (ib_map_mr_sg): buf, at most
// MaxLen bytes. Memory in a Mapping keeps it open (Close fails with
// ErrMappingBusy) until the region maps other memory or is deregistered.
// It fails, changing nothing, on a region that is not a
// fast-registration one (ErrNotFastMR; ErrDeregistered after Dereg), an
// empty buf (ErrEmptyBuffer) or one longer than MaxLen (ErrMapTooBig). It
// does not affect a registration already executed.
func (m *MR) Map(buf []byte) error {
	t := m.t
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case m.dead:
		return wrapf(ErrDeregistered, "mr index %#x", m.index)
	case !m.fast:
		return wrapf(ErrNotFastMR, "lkey %#x", m.LKey())
	case len(buf) == 0:
		return wrapf(ErrEmptyBuffer, "nothing to map")
	case len(buf) > m.maxLn:
		return wrapf(ErrMapTooBig, "%d > %d", len(buf), m.maxLn)
	}
	// A REG_MR registers this memory later: the mapping it lies in must
	// not be unmapped meanwhile (the REG_MR would then find no mapping
	// to pin and make the region valid over unmapped memory).
	mp := mappingOf(buf)
	if mp != nil {
		if err := mp.pin(buf); err != nil {
			return err
		}
	}
	m.setMapped(buf, mp)
	return nil
}

// setMapped replaces what the next REG_MR maps, buf in the pinned mapping
// mp (nil: none), letting the previous one's mapping go. t.mu held.
func (m *MR) setMapped(buf []byte, mp *Mapping) {
	if m.mappedPin != nil {
		m.mappedPin.unpin()
	}
	m.mapped, m.mappedPin = buf, mp
}

// RegMapped executes a REG_MR work request on behalf of a QP in pd for
// the fast-registration region whose current lkey is lkey: FastReg of
// the first length bytes of the memory given to Map (all of it when
// length is 0). Besides FastReg's failures it fails with ErrKeyMismatch
// when lkey is not a region's current key, ErrBadState before Map and
// ErrMapTooBig when length exceeds what was mapped.
func (t *Table) RegMapped(pd *PD, lkey, key uint32, access Access, length, iova uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var m *MR
	if !IsMWKey(lkey) {
		m = t.mrs.get(KeyIndex(lkey))
	}
	switch {
	case m == nil || m.LKey() != lkey:
		return wrapf(ErrKeyMismatch, "no region with lkey %#x", lkey)
	case m.mapped == nil:
		return wrapf(ErrBadState, "REG_MR of region %#x before Map", lkey)
	case length > uint64(len(m.mapped)):
		return wrapf(ErrMapTooBig, "REG_MR of %d bytes, %d mapped", length, len(m.mapped))
	}
	if length == 0 {
		length = uint64(len(m.mapped))
	}
	return m.fastReg(pd, key, access, m.mapped[:length], iova)
}

// FastReg executes a REG_MR work request on behalf of a QP in pd
// (rxe_reg_fast_mr): the free region becomes valid over buf at iova with
// access, under key, which must keep the region's index (only the key part
// may change; IncKey(m.LKey()) is the usual choice). It fails, changing
// nothing, unless the region is a free fast-registration region of pd
// (ErrBadState, ErrPDMismatch), key has its index (ErrKeyMismatch), buf
// fits in MaxLen (ErrRange) and the access and range are acceptable as for
// RegMR. The completion status of a failed REG_MR is LOC_QP_OP_ERR.
func (m *MR) FastReg(pd *PD, key uint32, access Access, buf []byte, iova uint64) error {
	m.t.mu.Lock()
	defer m.t.mu.Unlock()
	return m.fastReg(pd, key, access, buf, iova)
}

// fastReg is FastReg with t.mu held.
func (m *MR) fastReg(pd *PD, key uint32, access Access, buf []byte, iova uint64) error {
	if m.dead {
		return wrapf(ErrDeregistered, "mr index %#x", m.index)
	}
	old := m.st.Load()
	switch {
	case !m.fast:
		return wrapf(ErrBadState, "REG_MR on a user region")
	case old.valid:
		return wrapf(ErrBadState, "REG_MR on region %#x which is not free", old.key)
	case pd != old.pd:
		return wrapf(ErrPDMismatch, "QP pd and region pd differ")
	case KeyIndex(key) != m.index:
		return wrapf(ErrKeyMismatch, "key %#x has another index than region %#x", key, old.key)
	case len(buf) > m.maxLn:
		return wrapf(ErrRange, "%d bytes exceed the region's %d", len(buf), m.maxLn)
	}
	st, err := newState(pd, buf, access, &regConfig{iova: iova, hasIOVA: true})
	if err != nil {
		return err
	}
	st.key = key
	m.t.mrs.slotOf(m.index).lastKey = int16(KeyPart(key))
	m.st.Store(st)
	old.put()
	return nil
}
