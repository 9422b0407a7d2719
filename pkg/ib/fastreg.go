package ib

import (
	"errors"
	"fmt"
	"sync"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
)

// RegMRInfo describes a REG_MR work request (SendWR.Reg): the region by
// its current lkey, the key it gets, the rights granted and the address
// range it is registered at.
type RegMRInfo = qp.RegMRInfo

// WRRegMR is the fast-registration work request opcode (the kernel's
// IB_WR_REG_MR; libibverbs has none). It completes with WCRegMR.
const WRRegMR = qp.WRRegMR

// WCRegMR is the completion opcode of a REG_MR work request.
const WCRegMR = qp.WCRegMR

// fastRegistry remembers, per fast-registration region, the memory its
// next REG_MR maps (set by MapMR), so the work request, which carries
// only keys, can find it. Indexed by the key index, which a region keeps
// for life.
type fastRegistry struct {
	mu   sync.Mutex
	regs map[uint32]*fastReg
}

type fastReg struct {
	m   *mr.MR
	pd  *PD
	buf []byte // nil until MapMR
}

// AllocMR allocates a fast-registration memory region of up to maxLen
// bytes in the PD (the kernel's ib_alloc_mr with IB_MR_TYPE_MEM_REG). Its
// keys refer to nothing until a REG_MR work request (WRRegMR) registers
// it over the memory given to MapMR; LOCAL_INV, or a peer's
// SEND_WITH_INV, returns it to the free state, and it can be registered
// again with a new key (IncRKey).
func (pd *PD) AllocMR(maxLen int) (*MR, error) {
	m, err := pd.d.eng.Memory().AllocFastMR(pd.pd, maxLen)
	if err != nil {
		return nil, fmt.Errorf("ib: AllocMR: %w", err)
	}
	f := &pd.d.fast
	f.mu.Lock()
	if f.regs == nil {
		f.regs = make(map[uint32]*fastReg)
	}
	f.regs[mr.KeyIndex(m.LKey())] = &fastReg{m: m, pd: pd}
	f.mu.Unlock()
	return m, nil
}

// Errors of MapMR; test with errors.Is.
var (
	ErrNotFastMR = errors.New("ib: not a fast-registration region of this PD")
	ErrMapTooBig = errors.New("ib: buffer larger than the region's maximum length")
)

// MapMR sets the memory the next REG_MR work request of m registers,
// like ib_map_mr_sg: buf, at most m.MaxLen() bytes. A REG_MR registers
// its first RegMRInfo.Length bytes (all of it when Length is 0) at
// RegMRInfo.IOVA. MapMR changes nothing on error and does not affect a
// registration already executed.
func (pd *PD) MapMR(m *MR, buf []byte) error {
	if m == nil {
		return fmt.Errorf("%w: nil region", ErrNotFastMR)
	}
	if len(buf) == 0 {
		return fmt.Errorf("ib: MapMR: %w", mr.ErrEmptyBuffer)
	}
	f := &pd.d.fast
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.regs[mr.KeyIndex(m.LKey())]
	if r == nil || r.m != m || r.pd != pd {
		return fmt.Errorf("%w: lkey %#x", ErrNotFastMR, m.LKey())
	}
	if len(buf) > m.MaxLen() {
		return fmt.Errorf("%w: %d > %d", ErrMapTooBig, len(buf), m.MaxLen())
	}
	r.buf = buf
	return nil
}

// verbsLocalOps executes the work requests that touch only local memory
// objects (LOCAL_INV, BIND_MW, REG_MR) on the QP's worker, with rxe's
// completion statuses: a failed LOCAL_INV or REG_MR is LOC_QP_OP_ERR, a
// failed bind MW_BIND_ERR.
type verbsLocalOps struct{ d *Device }

func (l verbsLocalOps) Execute(q *qp.QP, wr *qp.SendWR) qp.WCStatus {
	mem := l.d.eng.Memory()
	switch wr.Opcode {
	case qp.WRLocalInv:
		if err := mem.Invalidate(q.PD(), q.Num(), wr.InvalidateRKey); err != nil {
			return qp.WCLocQPOpErr
		}
		return qp.WCSuccess
	case qp.WRBindMW:
		b := wr.Bind
		if _, err := mem.BindMW(q.PD(), q.Num(), mr.Bind{MWKey: b.MWRKey, NewKey: b.NewRKey,
			MRKey: b.MRLKey, Addr: b.Addr, Length: b.Length, Access: mr.Access(b.Access)}); err != nil {
			return qp.WCMWBindErr
		}
		return qp.WCSuccess
	case qp.WRRegMR:
		if err := l.d.fast.register(q.PD(), &wr.Reg); err != nil {
			return qp.WCLocQPOpErr
		}
		return qp.WCSuccess
	}
	return qp.WCLocQPOpErr
}

// register executes a REG_MR for a QP in pd.
func (f *fastRegistry) register(pd *mr.PD, ri *qp.RegMRInfo) error {
	f.mu.Lock()
	r := f.regs[mr.KeyIndex(ri.MRLKey)]
	var buf []byte
	if r != nil {
		buf = r.buf
	}
	f.mu.Unlock()
	switch {
	case r == nil:
		return ErrNotFastMR
	case buf == nil:
		return errors.New("ib: REG_MR before MapMR")
	case ri.MRLKey != r.m.LKey():
		return mr.ErrKeyMismatch
	}
	n := ri.Length
	if n == 0 {
		n = uint64(len(buf))
	}
	if n > uint64(len(buf)) {
		return ErrMapTooBig
	}
	return r.m.FastReg(pd, ri.NewKey, mr.Access(ri.Access), buf[:n], ri.IOVA)
}
