package cm_test

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/stretchr/testify/require"
)

// Two Managers wired directly (Send calls the peer's HandleMAD in the same
// goroutine, so HandleMAD re-enters a draining Manager), connections opened
// and closed from several goroutines at once: run under -race, every
// connection completes and ends in timewait exit.
func TestConcurrentDirectWiring(t *testing.T) {
	clock := cmtest.NewFakeClock(time.Unix(0, 0))
	var a, b *cm.Manager
	a = cm.New(cm.Config{NodeGUID: guidA, Clock: clock, Rand: rand.New(rand.NewPCG(1, 1)),
		Send: func(dst, src netip.Addr, _ cm.Traffic, m []byte) error { b.HandleMAD(src, dst, m); return nil }})
	b = cm.New(cm.Config{NodeGUID: guidB, Clock: clock, Rand: rand.New(rand.NewPCG(2, 2)),
		Send: func(dst, src netip.Addr, _ cm.Traffic, m []byte) error { a.HandleMAD(src, dst, m); return nil }})
	_, err := b.Listen(serviceID, 0, func(ev cm.Event) {
		if ev.Type == cm.EventREQ {
			require.NoError(t, ev.ID.Accept(acceptParams(ev.REQ.LocalQPN+0x1000)))
		}
	})
	require.NoError(t, err)

	const n = 16
	var wg sync.WaitGroup
	done := make(chan cm.EventType, 4*n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			established := make(chan *cm.ID, 1)
			p := cm.ConnectParams{Src: gidA, Dst: gidB, ServiceID: serviceID, QPN: uint32(0x100 + i)}
			_, err := a.Connect(p, func(ev cm.Event) {
				switch ev.Type {
				case cm.EventREP:
					require.NoError(t, ev.ID.SendRTU(nil))
				case cm.EventEstablished:
					established <- ev.ID
				case cm.EventDisconnected, cm.EventTimewaitExit:
					done <- ev.Type
				}
			})
			require.NoError(t, err)
			id := <-established
			require.NoError(t, id.Disconnect(nil))
		}(i)
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		require.Equal(t, cm.EventDisconnected, <-done)
	}
	clock.Advance(time.Second)
	for i := 0; i < n; i++ {
		require.Equal(t, cm.EventTimewaitExit, <-done)
	}
	ids, _, _, _, _ := a.TableSizes()
	require.Zero(t, ids)
	ids, _, _, _, _ = b.TableSizes()
	require.Zero(t, ids)
}
