package mr

// PD is a protection domain. Regions, windows (and, through Hold, the QPs,
// SRQs and address handles other packages create) belong to exactly one PD
// and are only usable from QPs of the same PD.
type PD struct {
	t      *Table
	handle uint32
	users  int  // guarded by t.mu
	dead   bool // guarded by t.mu
}

// AllocPD creates a protection domain (ibv_alloc_pd).
func (t *Table) AllocPD() (*PD, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.numPD >= t.maxPD {
		return nil, wrapf(ErrNoResources, "%d protection domains in use", t.numPD)
	}
	t.nextPD++
	t.numPD++
	return &PD{t: t, handle: t.nextPD}, nil
}

// Handle is a number identifying the PD within its table (never reused).
func (pd *PD) Handle() uint32 { return pd.handle }

// Table returns the table the PD belongs to.
func (pd *PD) Table() *Table { return pd.t }

// Dealloc destroys the PD (ibv_dealloc_pd). It fails with ErrPDBusy while
// regions, windows or holders remain, and with ErrBadPD if already
// deallocated; on failure nothing changes.
func (pd *PD) Dealloc() error {
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd.dead {
		return wrapf(ErrBadPD, "pd %d already deallocated", pd.handle)
	}
	if pd.users > 0 {
		return wrapf(ErrPDBusy, "pd %d has %d users", pd.handle, pd.users)
	}
	pd.dead = true
	t.numPD--
	return nil
}

// Hold records a user of the PD that lives outside this package (a QP, SRQ
// or address handle), so Dealloc fails while it exists. Undo with Unhold.
func (pd *PD) Hold() error {
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd.dead {
		return wrapf(ErrBadPD, "pd %d deallocated", pd.handle)
	}
	pd.users++
	return nil
}

// Unhold releases a Hold.
func (pd *PD) Unhold() {
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd.users <= 0 {
		panic("mr: PD.Unhold without Hold")
	}
	pd.users--
}

// checkPD validates a PD passed to a control operation. t.mu held.
func (t *Table) checkPD(pd *PD) error {
	switch {
	case pd == nil:
		return wrapf(ErrBadPD, "nil pd")
	case pd.t != t:
		return wrapf(ErrBadPD, "pd %d belongs to another device", pd.handle)
	case pd.dead:
		return wrapf(ErrBadPD, "pd %d deallocated", pd.handle)
	}
	return nil
}
