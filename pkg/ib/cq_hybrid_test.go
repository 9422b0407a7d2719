package ib_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// TestHybridWaiterReturnsCompletions: a queued completion comes back at
// once; one pushed while the waiter spins or sleeps (with a 1 us budget
// it mostly sleeps; with Spin -1 it sleeps at once) comes back too, in
// order, and nothing is lost or duplicated.
func TestHybridWaiterReturnsCompletions(t *testing.T) {
	for _, spin := range []time.Duration{0, time.Microsecond, -1} {
		a, _ := peerPair(t, "10.9.0.1", "10.9.0.2")
		h := &ib.HybridWaiter{Spin: spin}
		wcs := make([]ib.WC, 4)
		require.NoError(t, ib.Push(a.cq, ib.WC{ID: 1}))
		n, err := h.Wait(context.Background(), a.cq, wcs)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, uint64(1), wcs[0].ID)

		// The pusher keeps at most half the CQ (64) outstanding: a credit
		// per completion, returned when the waiter takes it. Pacing it by
		// time alone overflowed the CQ whenever a loaded machine (CI,
		// -race) held the waiter back for 400 us.
		const k = 200
		credits := make(chan struct{}, 32)
		pushed := make(chan error, 1)
		go func() {
			for i := 2; i < 2+k; i++ {
				credits <- struct{}{}
				if err := ib.Push(a.cq, ib.WC{ID: uint64(i)}); err != nil {
					pushed <- err
					return
				}
				if i%16 == 0 {
					time.Sleep(100 * time.Microsecond) // let the waiter sleep now and then
				}
			}
			pushed <- nil
		}()
		want := uint64(2)
		for want < 2+k {
			n, err := h.Wait(context.Background(), a.cq, wcs)
			require.NoError(t, err, "spin %v", spin)
			require.Positive(t, n)
			for _, wc := range wcs[:n] {
				require.Equal(t, want, wc.ID, "spin %v", spin)
				want++
				<-credits
			}
		}
		require.NoError(t, <-pushed)
		if spin < 0 {
			require.Zero(t, h.Budget())
		} else {
			base := spin
			if base == 0 {
				base = ib.DefaultHybridSpin
			}
			require.GreaterOrEqual(t, h.Budget(), base)
			require.LessOrEqual(t, h.Budget(), 4*base)
		}
	}
}

// TestHybridWaiterErrors: with nothing to complete, Wait returns the
// context's error once it sleeps, ErrDestroyed after the CQ's Destroy
// and ErrDeviceClosed after the device's Close.
func TestHybridWaiterErrors(t *testing.T) {
	a, _ := peerPair(t, "10.9.1.1", "10.9.1.2")
	var h ib.HybridWaiter
	wcs := make([]ib.WC, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := h.Wait(ctx, a.cq, wcs)
	require.ErrorIs(t, err, context.Canceled)

	cq, err := a.dev.CreateCQ(8)
	require.NoError(t, err)
	require.NoError(t, cq.Destroy())
	_, err = h.Wait(context.Background(), cq, wcs)
	require.True(t, errors.Is(err, ib.ErrDestroyed), "got %v", err)

	require.NoError(t, a.dev.Close())
	_, err = h.Wait(context.Background(), a.cq, wcs)
	require.True(t, errors.Is(err, ib.ErrDeviceClosed), "got %v", err)
}

// TestHybridWaiterStopsOnABusyDevice: a wait whose device keeps
// receiving (a stream of WRITEs for another QP, which completes nothing on
// the CQ waited on) spins on, but a context that has ended or a destroyed
// CQ still ends it: the spin no longer ends by the device's silence alone.
func TestHybridWaiterStopsOnABusyDevice(t *testing.T) {
	a, b := peerPair(t, "10.9.2.1", "10.9.2.2")
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
	connectRC(a, qa, b, qb)
	connectRC(b, qb, a, qa)

	quit := make(chan struct{})
	started := make(chan struct{})
	streamed := make(chan error, 1)
	go func() { // b WRITEs into a's buffer until the test is done
		var wc [1]ib.WC
		for i := 0; ; i++ {
			err := qb.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
				SGL: []ib.SGE{b.sge(0, 1024)}, RemoteAddr: a.mr.IOVA(), RKey: a.mr.RKey()})
			if err == nil {
				_, err = b.cq.WaitPoll(context.Background(), wc[:])
			}
			if err == nil && wc[0].Status != ib.WCSuccess {
				err = errors.New(wc[0].Status.String())
			}
			if i == 0 {
				close(started)
			}
			select {
			case <-quit:
				streamed <- err
				return
			default:
			}
			if err != nil {
				streamed <- err
				return
			}
		}
	}()
	<-started

	wait := func(ctx context.Context, cq *ib.CQ) error {
		done := make(chan error, 1)
		go func() {
			// Budgets far longer than the stream's gaps: only stop
			// can end the spin.
			h := ib.HybridWaiter{Spin: 10 * time.Millisecond}
			_, err := h.Wait(ctx, cq, make([]ib.WC, 1))
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("Wait kept spinning on a busy device after its context ended or its CQ was destroyed")
			return nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, wait(ctx, a.cq), context.Canceled)

	cq, err := a.dev.CreateCQ(8)
	require.NoError(t, err)
	require.NoError(t, cq.Destroy())
	require.ErrorIs(t, wait(context.Background(), cq), ib.ErrDestroyed)

	close(quit)
	require.NoError(t, <-streamed, "the stream that kept the device busy")
}
