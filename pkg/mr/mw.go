package mr

import (
	"fmt"
	"sync/atomic"
)

// MWType is a memory window type (IBV_MW_TYPE_* values).
type MWType uint8

// Window types. Type 1 windows are bound with the bind verb (the rkey comes
// from the window); type 2 (rxe implements 2B) are bound with a BIND_MW work
// request, belong to the QP that bound them and can be invalidated.
const (
	MWType1 MWType = 1
	MWType2 MWType = 2
)

// String returns "type1" or "type2".
func (t MWType) String() string {
	switch t {
	case MWType1:
		return "type1"
	case MWType2:
		return "type2"
	}
	return fmt.Sprintf("MWType(%d)", uint8(t))
}

// MW is a memory window: a remote-access view of part of a region, with its
// own rkey and rights.
type MW struct {
	t     *Table
	index uint32
	typ   MWType
	pd    *PD
	st    atomic.Pointer[mwState] // nil once deallocated
	dead  bool                    // t.mu
}

// mwState is one immutable version of a window (its type and PD are the
// window's, which never change).
type mwState struct {
	rkey   uint32
	valid  bool // rxe's RXE_MW_STATE_VALID (type 1 always; type 2 once bound)
	qpn    uint32
	mr     *MR // nil when unbound
	addr   uint64
	length uint64
	access Access
}

// AllocMW creates a window in pd (ibv_alloc_mw). A type 1 window starts
// valid but unbound; a type 2 window starts free.
func (t *Table) AllocMW(pd *PD, typ MWType) (*MW, error) {
	if typ != MWType1 && typ != MWType2 {
		return nil, wrapf(ErrInvalidArgument, "window type %d", uint8(typ))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkPD(pd); err != nil {
		return nil, err
	}
	key, sl, err := t.mws.allocKey(t)
	if err != nil {
		return nil, err
	}
	w := &MW{t: t, index: KeyIndex(key), typ: typ, pd: pd}
	w.st.Store(&mwState{rkey: key, valid: typ == MWType1, qpn: NoQP})
	sl.p.Store(w)
	pd.users++
	return w, nil
}

// RKey is the window's current rkey (0 after Dealloc).
func (w *MW) RKey() uint32 {
	if s := w.st.Load(); s != nil {
		return s.rkey
	}
	return 0
}

// Type is the window type.
func (w *MW) Type() MWType { return w.typ }

// PD is the window's protection domain.
func (w *MW) PD() *PD { return w.pd }

// Bound reports whether the window currently gives access to memory.
func (w *MW) Bound() bool {
	s := w.st.Load()
	return s != nil && s.valid && s.length > 0
}

// Binding returns the current binding: region, address, length and access
// (mr nil when unbound).
func (w *MW) Binding() (mr *MR, addr, length uint64, access Access) {
	s := w.st.Load()
	if s == nil {
		return nil, 0, 0, 0
	}
	return s.mr, s.addr, s.length, s.access
}

// Dealloc destroys the window (ibv_dealloc_mw), unbinding it first. A
// second call fails with ErrDeregistered.
func (w *MW) Dealloc() error {
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.dead {
		return wrapf(ErrDeregistered, "mw index %#x", w.index)
	}
	old := w.st.Swap(nil)
	if old.mr != nil {
		old.mr.numMW--
	}
	w.dead = true
	t.mws.free(w.index)
	w.pd.users--
	return nil
}

// Bind describes a bind request (a BIND_MW work request, or the bind verb
// for type 1 windows, which libibverbs turns into one).
type Bind struct {
	MWKey  uint32 // the window's current rkey
	NewKey uint32 // rkey after the bind; only its key part is used (usually IncKey(MWKey))
	MRKey  uint32 // lkey of the region to bind to; ignored when Length is 0
	Addr   uint64 // start: an IOVA of the region (also for zero-based windows)
	Length uint64 // 0 unbinds a type 1 window; invalid for type 2
	Access Access // remote rights, optionally ZeroBased
}

func bindErr(cause error, format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", ErrBind, cause, fmt.Sprintf(format, args...))
}

// BindMW executes a bind on behalf of QP number qpn in pd (rxe_bind_mw) and
// returns the window's new rkey. Every failure matches ErrBind (the work
// completion status is MW_BIND_ERR) and the cause (ErrInvalidKey,
// ErrBadState, ErrPDMismatch, ErrAccess, ErrAccessCombo, ErrRange,
// ErrUnsupportedAccess, ErrInvalidated); on failure nothing changes.
//
// Checks, after rxe and IBA: the keys name the window and the region;
// access is supported for windows; a type 1 window must be valid and not
// zero-based; a type 2 window must be free, in the QP's PD and bound with a
// region and non-zero length; the region must be valid, in the window's
// PD, registered with MW_BIND (C10-73), have LOCAL_WRITE if the window
// grants remote write or atomic (C10-74), lie in a writable file mapping
// if the window grants FLUSH_PERSISTENT (as RegMR), and contain
// [Addr, Addr+Length) (C10-75).
func (t *Table) BindMW(pd *PD, qpn uint32, b Bind) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.mws.get(KeyIndex(b.MWKey))
	if w == nil {
		return 0, bindErr(ErrInvalidKey, "no window with rkey %#x", b.MWKey)
	}
	ws := w.st.Load()
	if ws == nil || ws.rkey != b.MWKey {
		return 0, bindErr(ErrInvalidKey, "rkey %#x is not the window's current key", b.MWKey)
	}
	var m *MR
	var ms *mrState
	if b.Length != 0 {
		if IsMWKey(b.MRKey) {
			return 0, bindErr(ErrInvalidKey, "lkey %#x names a window", b.MRKey)
		}
		m = t.mrs.get(KeyIndex(b.MRKey))
		if m != nil {
			ms = m.st.Load()
		}
		if ms == nil || ms.key != b.MRKey {
			return 0, bindErr(ErrInvalidKey, "no region with lkey %#x", b.MRKey)
		}
	}
	if bad := b.Access &^ mwSupported; bad != 0 {
		return 0, bindErr(ErrUnsupportedAccess, "access %v not supported on a window", bad)
	}
	if pd != w.pd {
		return 0, bindErr(ErrPDMismatch, "window in pd %d, QP in another pd", w.pd.handle)
	}
	switch w.typ {
	case MWType1:
		if !ws.valid {
			return 0, bindErr(ErrBadState, "type 1 window not valid")
		}
		if b.Access&ZeroBased != 0 { // o10-36.2.2
			return 0, bindErr(ErrUnsupportedAccess, "type 1 window cannot be zero based")
		}
	case MWType2:
		if ws.valid { // o10-37.2.30
			return 0, bindErr(ErrBadState, "type 2 window already bound")
		}
		if m == nil { // o10-37.2.40
			return 0, bindErr(ErrInvalidArgument, "type 2 window bound with zero length")
		}
	}
	if m != nil {
		switch {
		case !ms.valid:
			return 0, bindErr(ErrInvalidated, "region %#x is invalidated", b.MRKey)
		case ms.pd != w.pd:
			return 0, bindErr(ErrPDMismatch, "region in pd %d, window in pd %d", ms.pd.handle, w.pd.handle)
		case ms.access&MWBind == 0: // C10-73
			return 0, bindErr(ErrAccess, "region %#x lacks MW_BIND", b.MRKey)
		case b.Access&(RemoteWrite|RemoteAtomic) != 0 && ms.access&LocalWrite == 0: // C10-74
			return 0, bindErr(ErrAccessCombo, "writable window over region %#x without LOCAL_WRITE", b.MRKey)
		case b.Access&FlushPersistent != 0 && (ms.mapping == nil || !ms.mapping.persistable()):
			// As RegMR: only a writable file mapping can be made
			// durable; a FLUSH to persistence would be ACKed for
			// bytes nothing persisted.
			return 0, bindErr(ErrUnsupportedAccess, "FLUSH_PERSISTENT window over region %#x, not over a writable file mapping", b.MRKey)
		}
		if _, ok := ms.rangeOf(b.Addr, b.Length); !ok { // C10-75
			return 0, bindErr(ErrRange, "[%#x,+%d) outside region [%#x,+%d)", b.Addr, b.Length, ms.iova, len(ms.buf))
		}
	}
	ns := &mwState{
		rkey:   b.MWKey&^0xff | b.NewKey&0xff,
		valid:  true,
		qpn:    NoQP,
		addr:   b.Addr,
		length: b.Length,
		access: b.Access,
	}
	if m != nil {
		ns.mr = m
		m.numMW++
	}
	if w.typ == MWType2 {
		ns.qpn = qpn
	}
	if ws.mr != nil {
		ws.mr.numMW--
	}
	w.st.Store(ns)
	return ns.rkey, nil
}

// Bind binds a type 1 window to [addr, addr+length) of m with access,
// choosing the next key part (ibv_bind_mw), on behalf of QP qpn in the
// window's PD. Length 0 unbinds. It returns the new rkey.
func (w *MW) Bind(m *MR, addr, length uint64, access Access) (uint32, error) {
	var lkey uint32
	if m != nil {
		lkey = m.LKey()
	}
	cur := w.RKey()
	return w.t.BindMW(w.pd, NoQP, Bind{MWKey: cur, NewKey: IncKey(cur), MRKey: lkey, Addr: addr, Length: length, Access: access})
}

// afterWindowLoad, if set (tests), runs between a lookup's reading of a
// window's binding and of its region's state: the moment an unbind and a
// re-registration of the region may come between the two.
var afterWindowLoad func()

// lookupMW is lookup for window rkeys.
func (t *Table) lookupMW(key uint32, pd *PD, qpn uint32, va, length uint64, need Access, mode spanMode) (Region, error) {
	w := t.mws.get(KeyIndex(key))
	if w == nil {
		return Region{}, ErrInvalidKey
	}
	ws := w.st.Load()
	if afterWindowLoad != nil {
		afterWindowLoad()
	}
	switch {
	case ws == nil || ws.rkey != key:
		return Region{}, ErrInvalidKey
	case w.typ == MWType2 && ws.valid && ws.qpn != qpn:
		return Region{}, ErrInvalidKey
	case !ws.valid || ws.length == 0 || ws.mr == nil:
		return Region{}, ErrInvalidated
	case w.pd != pd:
		return Region{}, ErrPDMismatch
	case !ws.access.Has(need):
		return Region{}, ErrAccess
	}
	var off uint64
	switch mode {
	case spanWhole:
		length = ws.length
	default:
		off = va
		if ws.access&ZeroBased == 0 {
			if va < ws.addr {
				return Region{}, ErrRange
			}
			off = va - ws.addr
		}
		if mode == spanEmpty && off > ws.length || mode == spanRange && (off >= ws.length || length > ws.length-off) {
			return Region{}, ErrRange
		}
	}
	target := ws.addr + off // cannot wrap: the bind checked the window is in the region
	inner := spanRange
	if length == 0 {
		inner = spanEmpty
	}
	for {
		st := ws.mr.st.Load()
		if st == nil || !st.valid {
			return Region{}, ErrInvalidKey
		}
		moff, n, ok := st.span(target, length, inner)
		if !ok {
			return Region{}, ErrRange
		}
		b := st.buf[moff : moff+n : moff+n]
		if need&RemoteAtomic != 0 && misaligned(va, b) {
			return Region{}, ErrAlign
		}
		if st.tryGet() {
			reg := Region{b: b, st: st}
			if w.st.Load() != ws {
				// The window was unbound (or rebound, or freed) since
				// ws was read, and st may be a later registration of
				// its region that the window never covered (a fast
				// region invalidated and registered again): ws's
				// rights do not reach it. Look the key up afresh.
				reg.Release()
				return t.lookupMW(key, pd, qpn, va, length, need, mode)
			}
			return reg, nil
		}
		if ws.mr.st.Load() == st {
			return Region{}, ErrInvalidKey // over-released; see LookupQP
		}
	}
}
