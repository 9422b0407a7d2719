package ib

import "github.com/rxed/rxed/pkg/mr"

// MR is a registered memory region (struct ibv_mr), from PD.RegMR or
// PD.AllocMR. It is pkg/mr's region under this package's name, with its
// own documented methods; (*mr.MR)(m) converts it for code that works
// with pkg/mr directly.
//
// Every method may be called from any goroutine, concurrently with the
// data path that uses the region's keys.
type MR mr.MR

func (m *MR) mr() *mr.MR { return (*mr.MR)(m) }

// LKey is the region's local key, for the LKey of local SGEs (lkey; 0
// after Dereg).
func (m *MR) LKey() uint32 { return m.mr().LKey() }

// RKey is the key a peer puts in its RDMA READ, WRITE or atomic to reach
// the region (rkey). As in rdma_rxe it equals the lkey, and it works only
// for the remote rights the region was registered with (0 after Dereg).
func (m *MR) RKey() uint32 { return m.mr().RKey() }

// IOVA is the address of the region's first byte as peers see it: the
// buffer's address unless WithIOVA chose another (0 after Dereg).
func (m *MR) IOVA() uint64 { return m.mr().IOVA() }

// Len is the region's length in bytes (for a fast-registration region in
// the free state: of its last registration, 0 before the first).
func (m *MR) Len() int { return m.mr().Len() }

// Access returns the access flags the region was registered with.
func (m *MR) Access() Access { return m.mr().Access() }

// Bytes returns the registered buffer (nil after Dereg).
func (m *MR) Bytes() []byte { return m.mr().Bytes() }

// Valid reports whether the region's keys currently resolve: false after
// Dereg and for a fast-registration region in the free state.
func (m *MR) Valid() bool { return m.mr().Valid() }

// MaxLen is the capacity of a region from PD.AllocMR (0 for others).
func (m *MR) MaxLen() int { return m.mr().MaxLen() }

// String describes the region for logs.
func (m *MR) String() string { return m.mr().String() }

// Dereg deregisters the region (ibv_dereg_mr). Its keys stop resolving at
// once; work already using it finishes. It fails with ErrMWBound while
// memory windows are bound to it, and the second time; on failure
// nothing changes. It works after Device.Close.
func (m *MR) Dereg() error { return m.mr().Dereg() }

// ReregFlags selects what MR.Rereg changes (IBV_REREG_MR_* values).
type ReregFlags = mr.ReregFlags

// Rereg flags.
const (
	ReregTranslation = mr.ReregTranslation // IBV_REREG_MR_CHANGE_TRANSLATION: a new buffer
	ReregPD          = mr.ReregPD          // IBV_REREG_MR_CHANGE_PD: another PD
	ReregAccess      = mr.ReregAccess      // IBV_REREG_MR_CHANGE_ACCESS: other access flags
)

// Rereg re-registers the region (ibv_rereg_mr): with ReregPD it moves to
// pd, with ReregAccess it takes access, with ReregTranslation it covers
// buf (opts as for RegMR). Arguments of parts flags does not select are
// ignored (pd may be nil). The keys keep their index and get a new key
// part, so the old keys stop working. It fails, changing nothing, on a
// deregistered or fast-registration region, while windows are bound
// (ErrMWBound), or when RegMR would refuse the new settings.
func (m *MR) Rereg(flags ReregFlags, pd *PD, buf []byte, access Access, opts ...RegOption) error {
	var p *mr.PD
	if pd != nil {
		if err := pd.d.checkOpen(); err != nil {
			return err
		}
		p = pd.pd
	}
	return m.mr().Rereg(flags, p, buf, access, opts...)
}

// MW is a memory window (struct ibv_mw), from PD.AllocMW: a remote key
// for part of a region, bound and unbound through a QP's send queue
// (QP.BindMW for type 1, a BIND_MW work request for type 2).
//
// Every method may be called from any goroutine.
type MW mr.MW

func (w *MW) mw() *mr.MW { return (*mr.MW)(w) }

// RKey is the window's current rkey, which peers use while it is bound
// (0 after Dealloc).
func (w *MW) RKey() uint32 { return w.mw().RKey() }

// Type is the window type (MWType1 or MWType2).
func (w *MW) Type() MWType { return w.mw().Type() }

// Bound reports whether the window currently gives access to memory.
func (w *MW) Bound() bool { return w.mw().Bound() }

// Binding returns the current binding: region, address, length and
// access (region nil when unbound).
func (w *MW) Binding() (region *MR, addr, length uint64, access Access) {
	m, addr, length, access := w.mw().Binding()
	return (*MR)(m), addr, length, access
}

// Dealloc destroys the window (ibv_dealloc_mw), unbinding it first. A
// second call fails. It works after Device.Close.
func (w *MW) Dealloc() error { return w.mw().Dealloc() }
