package ib_test

import (
	"context"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// waitSleepers waits until dev's engine counts want application
// goroutines asleep on its completions.
func waitSleepers(t *testing.T, dev *ib.Device, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for dev.Engine().Sleepers() != want {
		require.False(t, time.Now().After(deadline), "sleepers %d, want %d", dev.Engine().Sleepers(), want)
		time.Sleep(100 * time.Microsecond)
	}
}

// TestWaitPollCountsItsSleep: while WaitPoll sleeps its device counts an
// application asleep on its completions (so other devices' waits leave
// its packets to it, roce.Engine.ProgressBeforeSleep), and no longer once
// it returns, with a completion or with ctx's error; the MAD agent's
// receive loop, asleep for the occasional MAD, does not count.
func TestWaitPollCountsItsSleep(t *testing.T) {
	a, _ := peerPair(t, "10.9.1.1", "10.9.1.2")
	require.Zero(t, a.dev.Engine().Sleepers())

	got := make(chan uint64, 1)
	go func() {
		wcs := make([]ib.WC, 1)
		n, err := a.cq.WaitPoll(context.Background(), wcs)
		if err != nil || n != 1 {
			got <- 0
			return
		}
		got <- wcs[0].ID
	}()
	waitSleepers(t, a.dev, 1)
	require.NoError(t, ib.Push(a.cq, ib.WC{ID: 9}))
	require.EqualValues(t, 9, <-got)
	waitSleepers(t, a.dev, 0)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := a.cq.WaitPoll(ctx, make([]ib.WC, 1))
		errc <- err
	}()
	waitSleepers(t, a.dev, 1)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.Zero(t, a.dev.Engine().Sleepers())

	agent, err := ib.OpenMADAgent(a.dev, ib.MADAgentConfig{Handler: func(netip.Addr, netip.Addr, []byte) {}})
	require.NoError(t, err)
	defer agent.Close()
	waitParked(t, "(*MADAgent).receiveLoop", "qp.(*CQ).Wait")
	require.Zero(t, a.dev.Engine().Sleepers(), "the MAD agent's loop sleeps unattended")
}

// waitParked waits until a goroutine's stack holds both frames: one
// blocked there, as a goroutine dump shows it.
func waitParked(t *testing.T, frame, blockedIn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, frame) && strings.Contains(g, blockedIn) {
				return
			}
		}
		require.False(t, time.Now().After(deadline), "no goroutine in %s blocked in %s", frame, blockedIn)
		time.Sleep(100 * time.Microsecond)
	}
}
