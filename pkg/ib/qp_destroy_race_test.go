package ib_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// TestModifyRacingDestroyCompletesNothingLate: a Modify to ERR racing
// Destroy either runs first or fails with ErrDestroyed; no completion of
// the destroyed QP reaches its CQ after Destroy returned. Bug (found by an
// audit of the engine, session AE): Modify checked that the QP was not
// destroyed, then queued its engine call, and Destroy could run in
// between; the call then moved the forgotten QP to ERR and flushed its
// receives into the CQ after Destroy had returned, and Modify returned
// nil (it failed at iteration 554 of 3000).
func TestModifyRacingDestroyCompletesNothingLate(t *testing.T) {
	net := transport.NewMemNetwork()
	a := openPeer(net, "10.77.0.1")
	defer a.close()
	wcs := make([]ib.WC, 64)
	late, lateModifyOK := 0, 0
	for i := 0; i < 3000 && late == 0; i++ {
		q := a.createQP(ib.UD)
		if err := q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: 7},
			ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey); err != nil {
			t.Fatal(err)
		}
		for k := 0; k < 4; k++ {
			if err := q.PostRecv(ib.RecvWR{ID: uint64(k), SGL: []ib.SGE{a.sge(0, 64)}}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var lenAfterDestroy int
		var destroyErr, modifyErr error
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			destroyErr = q.Destroy()
			lenAfterDestroy = a.cq.Len()
		}()
		go func() {
			defer wg.Done()
			<-start
			modifyErr = q.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState)
		}()
		close(start)
		wg.Wait()
		if destroyErr != nil {
			t.Fatal(destroyErr)
		}
		if n := a.cq.Len(); n > lenAfterDestroy {
			late++
			if modifyErr == nil {
				lateModifyOK++
			}
			t.Logf("iteration %d: %d completions pushed after Destroy returned (Modify err=%v)", i, n-lenAfterDestroy, modifyErr)
		} else if modifyErr != nil && !errors.Is(modifyErr, ib.ErrDestroyed) {
			t.Fatalf("iteration %d: Modify racing Destroy: %v", i, modifyErr)
		}
		for a.cq.Poll(wcs) > 0 {
		}
	}
	if late > 0 {
		t.Fatalf("a destroyed QP completed work requests after Destroy returned (%d times; Modify returned nil %d times)", late, lateModifyOK)
	}
}
