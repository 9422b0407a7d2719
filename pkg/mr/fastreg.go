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

// FastReg executes a REG_MR work request on behalf of a QP in pd
// (rxe_reg_fast_mr): the free region becomes valid over buf at iova with
// access, under key, which must keep the region's index (only the key part
// may change; IncKey(m.LKey()) is the usual choice). It fails, changing
// nothing, unless the region is a free fast-registration region of pd
// (ErrBadState, ErrPDMismatch), key has its index (ErrKeyMismatch), buf
// fits in MaxLen (ErrRange) and the access and range are acceptable as for
// RegMR. The completion status of a failed REG_MR is LOC_QP_OP_ERR.
func (m *MR) FastReg(pd *PD, key uint32, access Access, buf []byte, iova uint64) error {
	t := m.t
	t.mu.Lock()
	defer t.mu.Unlock()
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
	t.mrs.slotOf(m.index).lastKey = int16(KeyPart(key))
	m.st.Store(st)
	old.put()
	return nil
}
