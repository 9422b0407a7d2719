package mr

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// MR is a memory region: a buffer registered in a PD under an lkey/rkey.
// Its translation (buffer, IOVA), PD, access and keys may change through
// Rereg, fast registration and invalidation; every change publishes a new
// immutable snapshot, so lookups never see a half-updated region.
type MR struct {
	t     *Table
	index uint32
	fast  bool // allocated with AllocFastMR (IB_MR_TYPE_MEM_REG)
	maxLn int  // fast: largest buffer a REG_MR may map

	mapped []byte // fast: what the next REG_MR maps (Map); t.mu
	// mappedPin is the open mapping mapped lies in, pinned while the
	// region keeps mapped for a REG_MR (Map to Dereg); t.mu.
	mappedPin *Mapping

	st    atomic.Pointer[mrState] // nil once deregistered
	numMW int                     // windows bound to the region; t.mu
	dead  bool                    // t.mu
}

// mrState is one immutable version of a region. Regions handed out by
// Lookup hold a reference on the version they were resolved in; the
// version's resources (a mapping pin) go when the last reference does.
type mrState struct {
	refs    atomic.Int64 // 1 while current + 1 per live Region
	key     uint32       // lkey; rxe makes the rkey equal to it
	pd      *PD
	access  Access
	iova    uint64
	buf     []byte
	mapping *Mapping
	valid   bool // false: a fast-registration region in the FREE state
}

func (s *mrState) tryGet() bool {
	for {
		n := s.refs.Load()
		if n <= 0 {
			return false
		}
		if s.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (s *mrState) put() {
	switch n := s.refs.Add(-1); {
	case n == 0:
		if s.mapping != nil {
			s.mapping.unpin()
		}
	case n < 0:
		panic("mr: region released more often than acquired")
	}
}

// rangeOf returns the offset of [va, va+length) in the region, rejecting
// any access that is not fully inside without overflowing on values near
// 2^64. length > 0.
func (s *mrState) rangeOf(va, length uint64) (uint64, bool) {
	n := uint64(len(s.buf))
	if va < s.iova {
		return 0, false
	}
	off := va - s.iova
	if off >= n || length > n-off {
		return 0, false
	}
	return off, true
}

// RegOption modifies a registration (RegMR, Rereg with ReregTranslation).
type RegOption func(*regConfig)

type regConfig struct {
	iova    uint64
	hasIOVA bool
	mapping *Mapping
}

// WithIOVA sets the address peers use for the first byte of the buffer
// (ibv_reg_mr_iova). Without it the IOVA is the buffer's virtual address,
// as ibv_reg_mr. WithIOVA(0) gives a zero-based region.
func WithIOVA(iova uint64) RegOption {
	return func(c *regConfig) { c.iova, c.hasIOVA = iova, true }
}

// WithMapping declares that the buffer lies in m (ErrNotInMapping if not).
// A region over a mapping pins it: m.Close fails with ErrMappingBusy until
// the region is deregistered and every Region over it released. Regions
// over open mappings are found and pinned without this option too; it
// documents intent and checks containment. FlushPersistent access needs a
// writable file mapping.
func WithMapping(m *Mapping) RegOption {
	return func(c *regConfig) { c.mapping = m }
}

// RegMR registers buf in pd with the given access (ibv_reg_mr). The buffer
// must stay reachable and must not be resized while registered; the region
// refers to it, it does not copy it.
func (t *Table) RegMR(pd *PD, buf []byte, access Access, opts ...RegOption) (*MR, error) {
	var cfg regConfig
	for _, o := range opts {
		o(&cfg)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkPD(pd); err != nil {
		return nil, err
	}
	st, err := newState(pd, buf, access, &cfg)
	if err != nil {
		t.debug("reg_mr rejected", "err", err)
		return nil, err
	}
	key, sl, err := t.mrs.allocKey(t)
	if err != nil {
		st.dropMapping()
		return nil, err
	}
	st.key = key
	m := &MR{t: t, index: KeyIndex(key)}
	m.st.Store(st)
	sl.p.Store(m)
	pd.users++
	return m, nil
}

// newState validates a translation and builds a current (refs 1) state
// with its mapping pinned. The key is filled in by the caller.
func newState(pd *PD, buf []byte, access Access, cfg *regConfig) (*mrState, error) {
	if len(buf) == 0 {
		return nil, wrapf(ErrEmptyBuffer, "cannot register a zero-length buffer")
	}
	if err := checkMRAccess(access); err != nil {
		return nil, err
	}
	iova := uint64(uintptr(unsafe.Pointer(&buf[0])))
	if cfg.hasIOVA {
		iova = cfg.iova
	}
	if uint64(len(buf))-1 > ^uint64(0)-iova {
		return nil, wrapf(ErrIOVAOverflow, "iova %#x + length %d passes 2^64", iova, len(buf))
	}
	if cfg.mapping == nil {
		cfg.mapping = mappingOf(buf)
	}
	if access&FlushPersistent != 0 && (cfg.mapping == nil || !cfg.mapping.persistable()) {
		return nil, wrapf(ErrUnsupportedAccess, "FLUSH_PERSISTENT needs a region over a writable file mapping")
	}
	if cfg.mapping != nil {
		if err := cfg.mapping.pin(buf); err != nil {
			return nil, err
		}
	}
	st := &mrState{pd: pd, access: access, iova: iova, buf: buf, mapping: cfg.mapping, valid: true}
	st.refs.Store(1)
	return st, nil
}

// dropMapping undoes newState's pin for a state that never became current.
func (s *mrState) dropMapping() {
	if s.mapping != nil {
		s.mapping.unpin()
	}
}

// LKey is the region's local key (0 after Dereg).
func (m *MR) LKey() uint32 {
	if st := m.st.Load(); st != nil {
		return st.key
	}
	return 0
}

// RKey is the region's remote key. As in rxe it equals the lkey; it only
// works for the remote rights the access flags grant (0 after Dereg).
func (m *MR) RKey() uint32 { return m.LKey() }

// IOVA is the address of the region's first byte as peers see it.
func (m *MR) IOVA() uint64 {
	if st := m.st.Load(); st != nil {
		return st.iova
	}
	return 0
}

// Len is the region's length in bytes (for a fast-registration region in
// the free state: of its last registration, 0 before the first).
func (m *MR) Len() int {
	if st := m.st.Load(); st != nil {
		return len(st.buf)
	}
	return 0
}

// Access returns the region's access flags.
func (m *MR) Access() Access {
	if st := m.st.Load(); st != nil {
		return st.access
	}
	return 0
}

// PD returns the region's protection domain (nil after Dereg).
func (m *MR) PD() *PD {
	if st := m.st.Load(); st != nil {
		return st.pd
	}
	return nil
}

// Bytes returns the registered buffer (nil after Dereg).
func (m *MR) Bytes() []byte {
	if st := m.st.Load(); st != nil {
		return st.buf
	}
	return nil
}

// Valid reports whether the region's keys currently resolve: false after
// Dereg and for a fast-registration region in the free state.
func (m *MR) Valid() bool {
	st := m.st.Load()
	return st != nil && st.valid
}

// String describes the region for logs.
func (m *MR) String() string {
	st := m.st.Load()
	if st == nil {
		return fmt.Sprintf("mr(index %#x, deregistered)", m.index)
	}
	return fmt.Sprintf("mr(key %#x pd %d iova %#x len %d access %v valid %t)",
		st.key, st.pd.handle, st.iova, len(st.buf), st.access, st.valid)
}

// Dereg deregisters the region (ibv_dereg_mr). Its keys stop resolving at
// once; Regions already handed out stay usable until released, and only
// then is an underlying mapping unpinned. It fails with ErrMWBound while
// windows are bound (as rxe) and ErrDeregistered the second time; on
// failure nothing changes.
func (m *MR) Dereg() error {
	t := m.t
	t.mu.Lock()
	if m.dead {
		t.mu.Unlock()
		return wrapf(ErrDeregistered, "mr index %#x", m.index)
	}
	if m.numMW > 0 {
		n := m.numMW
		t.mu.Unlock()
		return wrapf(ErrMWBound, "%d windows bound to mr %#x", n, m.LKey())
	}
	m.dead = true
	m.setMapped(nil, nil)
	t.mrs.free(m.index)
	old := m.st.Swap(nil)
	old.pd.users--
	t.mu.Unlock()
	old.put()
	return nil
}

// ReregFlags selects what Rereg changes (IBV_REREG_MR_* values).
type ReregFlags uint32

// Rereg flags.
const (
	ReregTranslation ReregFlags = 1 << 0 // IBV_REREG_MR_CHANGE_TRANSLATION
	ReregPD          ReregFlags = 1 << 1 // IBV_REREG_MR_CHANGE_PD
	ReregAccess      ReregFlags = 1 << 2 // IBV_REREG_MR_CHANGE_ACCESS
)

// Rereg re-registers the region (ibv_rereg_mr): with ReregPD it moves to
// pd, with ReregAccess it takes access, with ReregTranslation it covers buf
// (opts as for RegMR; the IOVA defaults to buf's address). Arguments of
// parts not selected by flags are ignored. The keys keep their index and
// get a new key part, so the old keys stop working. It fails, changing
// nothing, on a deregistered or fast-registration region, while windows are
// bound (ErrMWBound), or when the new settings would be rejected by RegMR.
// Regions handed out earlier keep the old translation until released.
func (m *MR) Rereg(flags ReregFlags, pd *PD, buf []byte, access Access, opts ...RegOption) error {
	t := m.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if m.dead {
		return wrapf(ErrDeregistered, "mr index %#x", m.index)
	}
	if flags == 0 || flags&^(ReregTranslation|ReregPD|ReregAccess) != 0 {
		return wrapf(ErrInvalidArgument, "rereg flags %#x", uint32(flags))
	}
	if m.fast {
		return wrapf(ErrBadState, "rereg of a fast-registration region")
	}
	if m.numMW > 0 {
		return wrapf(ErrMWBound, "%d windows bound to mr %#x", m.numMW, m.LKey())
	}
	old := m.st.Load()
	newPD, newAccess := old.pd, old.access
	if flags&ReregPD != 0 {
		if err := t.checkPD(pd); err != nil {
			return err
		}
		newPD = pd
	}
	if flags&ReregAccess != 0 {
		newAccess = access
	}
	var cfg regConfig
	newBuf := old.buf
	if flags&ReregTranslation != 0 {
		for _, o := range opts {
			o(&cfg)
		}
		newBuf = buf
	} else {
		cfg = regConfig{iova: old.iova, hasIOVA: true, mapping: old.mapping}
	}
	st, err := newState(newPD, newBuf, newAccess, &cfg)
	if err != nil {
		return err
	}
	st.key, err = t.mrs.slotOf(m.index).newKey(t, m.index)
	if err != nil {
		st.dropMapping()
		return err
	}
	if newPD != old.pd {
		old.pd.users--
		newPD.users++
	}
	m.st.Store(st)
	old.put()
	return nil
}
