package mr

import "unsafe"

// Region is the memory an access resolved to: the bytes of [va, va+length)
// of a region or window, plus a reference that keeps the region's memory
// alive (a deregistered region's mapping is only unpinned after its last
// Region is released). A zero Region is empty and needs no release.
type Region struct {
	b  []byte
	st *mrState
}

// Bytes returns the resolved memory; it aliases the registered buffer.
func (r *Region) Bytes() []byte { return r.b }

// Len is len(r.Bytes()).
func (r *Region) Len() int { return len(r.b) }

// Release drops the reference. Calling it again on the same variable is a
// no-op; releasing two copies of one Region is a bug (and panics once the
// count goes negative).
func (r *Region) Release() {
	if st := r.st; st != nil {
		r.st, r.b = nil, nil
		st.put()
	}
}

// Persist makes the region's bytes durable for RDMA FLUSH to persistence:
// msync of the covered pages when the region lies in a file mapping, a
// no-op for ordinary memory.
func (r *Region) Persist() error {
	if r.st == nil || r.st.mapping == nil || len(r.b) == 0 {
		return nil
	}
	return r.st.mapping.syncRange(r.b)
}

// Lookup resolves key for an access of length bytes at va from a QP in pd
// needing the rights need (0 for a local read, LocalWrite for a local
// write, RemoteRead/RemoteWrite/RemoteAtomic for the remote operations,
// FlushGlobal/FlushPersistent for FLUSH). It is LookupQP with NoQP, so type
// 2 windows (which belong to one QP) never resolve through it.
//
// It allocates nothing. On success the caller must Release the Region.
func (t *Table) Lookup(key uint32, kind KeyKind, pd *PD, va, length uint64, need Access) (Region, error) {
	return t.LookupQP(key, kind, pd, NoQP, va, length, need)
}

// LookupQP is Lookup on behalf of QP number qpn, which type 2 windows must
// be bound to. Checks, in order, with the sentinel each failure returns:
//
//   - zero-length non-atomic access: succeeds with an empty Region without
//     looking at the key at all (IBA C9-88; rxe skips the rkey check of
//     zero-length RDMA and the lkey lookup of zero-length SGEs);
//   - an atomic (need has RemoteAtomic) must be exactly 8 bytes: ErrRange;
//   - the key names a live object of the right kind (lkeys never name
//     windows; a type 2 window must be bound to qpn): ErrInvalidKey;
//   - the object is valid, not a free fast-registration region or a
//     free/unbound window: ErrInvalidated;
//   - the object's PD is pd: ErrPDMismatch;
//   - the object grants every right in need: ErrAccess;
//   - [va, va+length) lies inside the region or window: ErrRange;
//   - atomics: va and the host address are 8-byte aligned: ErrAlign.
func (t *Table) LookupQP(key uint32, kind KeyKind, pd *PD, qpn uint32, va, length uint64, need Access) (Region, error) {
	atomicOp := need&RemoteAtomic != 0
	if length == 0 && !atomicOp {
		return Region{}, nil
	}
	if atomicOp && length != 8 {
		return Region{}, ErrRange
	}
	return t.lookup(key, kind, pd, qpn, va, length, need, spanRange)
}

// LookupFlushQP resolves the target of an RDMA FLUSH on behalf of QP
// number qpn (rxe's check_rkey and process_flush); need is FlushGlobal
// or FlushPersistent. The checks and errors are LookupQP's, with two
// differences:
//
//   - a zero length does not skip them (rxe skips the rkey of zero-length
//     READs and WRITEs only): the Region is then empty, at va, which must
//     lie in the region or window or at its end;
//   - with whole (the FETH's selectivity level "memory region", rxe's
//     IB_FLUSH_MR) va and length are ignored and the Region is the whole
//     region, or all of a window's bound range.
func (t *Table) LookupFlushQP(key uint32, pd *PD, qpn uint32, va, length uint64, need Access, whole bool) (Region, error) {
	mode := spanRange
	switch {
	case whole:
		mode = spanWhole
	case length == 0:
		mode = spanEmpty
	}
	return t.lookup(key, RKey, pd, qpn, va, length, need, mode)
}

// spanMode says what part of a region or window a lookup resolves.
type spanMode uint8

const (
	spanRange spanMode = iota // [va, va+length), length > 0
	spanEmpty                 // the empty range at va, which may be the end
	spanWhole                 // all of it; va and length are ignored
)

// span returns the offset and length in the region of what a lookup in
// mode resolves, rejecting anything not inside without overflowing.
func (s *mrState) span(va, length uint64, mode spanMode) (off, n uint64, ok bool) {
	if mode == spanRange {
		off, ok = s.rangeOf(va, length)
		return off, length, ok
	}
	if mode == spanWhole {
		return 0, uint64(len(s.buf)), true
	}
	if va < s.iova || va-s.iova > uint64(len(s.buf)) {
		return 0, 0, false
	}
	return va - s.iova, 0, true
}

// lookup is LookupQP and LookupFlushQP past their length checks.
func (t *Table) lookup(key uint32, kind KeyKind, pd *PD, qpn uint32, va, length uint64, need Access, mode spanMode) (Region, error) {
	atomicOp := need&RemoteAtomic != 0
	if IsMWKey(key) {
		if kind != RKey {
			return Region{}, ErrInvalidKey
		}
		return t.lookupMW(key, pd, qpn, va, length, need, mode)
	}
	if kind != LKey && kind != RKey {
		return Region{}, ErrInvalidKey
	}
	m := t.mrs.get(KeyIndex(key))
	if m == nil {
		return Region{}, ErrInvalidKey
	}
	for {
		st := m.st.Load()
		switch {
		case st == nil || st.key != key:
			return Region{}, ErrInvalidKey
		case !st.valid:
			return Region{}, ErrInvalidated
		case st.pd != pd:
			return Region{}, ErrPDMismatch
		case !st.access.Has(need):
			return Region{}, ErrAccess
		}
		off, n, ok := st.span(va, length, mode)
		if !ok {
			return Region{}, ErrRange
		}
		b := st.buf[off : off+n : off+n]
		if atomicOp && misaligned(va, b) {
			return Region{}, ErrAlign
		}
		if st.tryGet() {
			return Region{b: b, st: st}, nil
		}
		if m.st.Load() == st {
			// Versions are replaced before their last reference goes,
			// so a dead current version means a Region was released
			// twice; fail rather than spin.
			return Region{}, ErrInvalidKey
		}
		// The version was retired between Load and tryGet; the region
		// has a newer one (or none), so look again.
	}
}

// Aligned8 reports whether the Region's 8 bytes, reached at va, are 8-byte
// aligned both as the peer addresses them (va) and in memory: what
// ATOMIC_WRITE needs (IBA A19.4.2, rxe_mr_do_atomic_write), as CmpSwap and
// FetchAdd do (LookupQP checks those itself, ErrAlign). False for an
// empty Region.
func (r *Region) Aligned8(va uint64) bool { return len(r.b) >= 8 && !misaligned(va, r.b) }

func misaligned(va uint64, b []byte) bool {
	return len(b) == 0 || (va|uint64(uintptr(unsafe.Pointer(&b[0]))))&7 != 0
}
