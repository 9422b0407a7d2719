package roce

import (
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
)

// StartPersist implements qp.PersistEnv: the msync of a FLUSH to
// persistence runs in a goroutine of its own (a QP has at most one FLUSH
// waiting, so there are at most as many as QPs), and its result comes
// back to the worker as an event, which completes the FLUSH if the QP is
// still the one that asked. The worker and its other QPs carry on.
func (w *worker) StartPersist(q *qp.QP, reg mr.Region, t qp.PersistToken) {
	persist := w.persist
	if persist == nil {
		persist = (*mr.Region).Persist
	}
	w.e.persists.Add(1)
	go func() {
		defer w.e.persists.Done()
		err := persist(&reg)
		reg.Release()
		// On a closed engine nobody waits for the answer.
		w.enqueue(event{kind: evCall, fn: func() { w.persistDone(q, t, err) }})
	}()
}

// persistDone hands a FLUSH's msync result to its QP (on the worker).
func (w *worker) persistDone(q *qp.QP, t qp.PersistToken, err error) {
	ent := w.entryOf(q)
	if ent == nil {
		return // destroyed meanwhile
	}
	q.PersistDone(w, t, err)
	w.runQP(ent)
}
