package roce

import (
	"runtime"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// TestQueryRacingClose: QueryQP racing Close returns the attributes or an
// error, never a value a worker may still be writing. Bug (found by an
// audit of the engine, session AE; -race reports it): the call returned
// ErrClosed once the engine closed, but the worker could still run the
// queued call and write the result QueryQP was returning.
func TestQueryRacingClose(t *testing.T) {
	for range 2000 {
		net := transport.NewMemNetwork()
		s := newSide(t, net, "10.9.0.1", qp.RC)
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					a, err := s.e.QueryQP(s.q)
					_ = a.State // read what QueryQP returned
					if err != nil {
						return
					}
				}
			}()
		}
		runtime.Gosched()
		s.e.Close()
		wg.Wait()
	}
}
