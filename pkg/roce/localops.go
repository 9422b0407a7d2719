package roce

import (
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
)

// localOps executes LOCAL_INV and BIND_MW with the engine's memory table.
type localOps struct{ e *Engine }

func (l localOps) Execute(q *qp.QP, wr *qp.SendWR) qp.WCStatus {
	switch wr.Opcode {
	case qp.WRLocalInv:
		if err := l.e.mem.Invalidate(q.PD(), q.Num(), wr.InvalidateRKey); err != nil {
			return qp.WCLocQPOpErr
		}
		return qp.WCSuccess
	case qp.WRBindMW:
		b := wr.Bind
		_, err := l.e.mem.BindMW(q.PD(), q.Num(), mr.Bind{MWKey: b.MWRKey, NewKey: b.NewRKey,
			MRKey: b.MRLKey, Addr: b.Addr, Length: b.Length, Access: b.Access})
		if err != nil {
			return qp.WCMWBindErr
		}
		return qp.WCSuccess
	}
	return qp.WCLocQPOpErr
}
