package ib

import (
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

// AllocMR allocates a fast-registration memory region of up to maxLen
// bytes in the PD (the kernel's ib_alloc_mr with IB_MR_TYPE_MEM_REG). Its
// keys refer to nothing until a REG_MR work request (WRRegMR) registers
// it over the memory given to MapMR; LOCAL_INV, or a peer's
// SEND_WITH_INV, returns it to the free state, and it can be registered
// again with a new key (IncRKey).
func (pd *PD) AllocMR(maxLen int) (*MR, error) {
	if err := pd.d.checkOpen(); err != nil {
		return nil, err
	}
	m, err := pd.d.eng.Memory().AllocFastMR(pd.pd, maxLen)
	if err != nil {
		return nil, wrap("AllocMR", err)
	}
	pd.addMR((*MR)(m))
	return (*MR)(m), nil
}

// Errors of MapMR; test with errors.Is.
var (
	ErrNotFastMR = mr.ErrNotFastMR // not a fast-registration region of this PD
	ErrMapTooBig = mr.ErrMapTooBig // buffer larger than the region's maximum length
)

// MapMR sets the memory the next REG_MR work request of m registers,
// like ib_map_mr_sg: buf, at most m.MaxLen() bytes. A REG_MR registers
// its first RegMRInfo.Length bytes (all of it when Length is 0) at
// RegMRInfo.IOVA. MapMR changes nothing on error and does not affect a
// registration already executed.
func (pd *PD) MapMR(m *MR, buf []byte) error {
	if m == nil || m.mr().PD() != pd.pd {
		return errorf(ErrNotFastMR, "ib: MapMR: not a fast-registration region of this PD")
	}
	if err := m.mr().Map(buf); err != nil {
		return wrap("MapMR", err)
	}
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
			MRKey: b.MRLKey, Addr: b.Addr, Length: b.Length, Access: b.Access}); err != nil {
			return qp.WCMWBindErr
		}
		return qp.WCSuccess
	case qp.WRRegMR:
		ri := &wr.Reg
		if err := mem.RegMapped(q.PD(), ri.MRLKey, ri.NewKey, ri.Access, ri.Length, ri.IOVA); err != nil {
			return qp.WCLocQPOpErr
		}
		return qp.WCSuccess
	}
	return qp.WCLocQPOpErr
}
