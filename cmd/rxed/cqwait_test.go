package main

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

func TestSpinFlagParses(t *testing.T) {
	for in, want := range map[string]time.Duration{"-1": -1, "-5us": -1, "0": 0, "100us": 100 * time.Microsecond, "1ms": time.Millisecond} {
		var f spinFlag
		require.NoError(t, f.Set(in), in)
		require.Equal(t, want, time.Duration(f), in)
	}
	var f spinFlag
	require.Error(t, f.Set("fast"))
	require.Error(t, f.Set("5"))
	f = -1
	require.Equal(t, "-1", f.String())
}

// TestCQWaiterModes: in every mode (hybrid, pure spin, sleep, events) an
// empty CQ ends in context.DeadlineExceeded after the timeout, again on
// the next wait, and a cancelled parent ends it with the parent's error.
// (Completions arriving while a hybrid wait spins or sleeps: pkg/ib's
// TestHybridWaiterReturnsCompletions; the perf and pingpong tests run
// every mode's happy path.)
func TestCQWaiterModes(t *testing.T) {
	c, err := transport.NewMemNetwork().Listen(netip.MustParseAddrPort("10.7.0.1:4791"))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: c, Workers: 1})
	require.NoError(t, err)
	defer dev.Close()
	type mode struct {
		events bool
		spin   time.Duration
	}
	for _, m := range []mode{{false, defaultSpin}, {false, -1}, {false, 0}, {true, defaultSpin}} {
		cq, err := dev.CreateCQ(16)
		require.NoError(t, err)
		w := newCQWaiter(context.Background(), m.events, m.spin, 50*time.Millisecond)
		wcs := make([]ib.WC, 2)
		_, err = w.next(cq, wcs)
		require.ErrorIs(t, err, context.DeadlineExceeded, "%+v", m)
		_, err = w.next(cq, wcs)
		require.ErrorIs(t, err, context.DeadlineExceeded, "%+v: the next wait", m)
		w.close()
		require.NoError(t, cq.Destroy())

		ctx, cancel := context.WithCancel(context.Background())
		cq, err = dev.CreateCQ(16)
		require.NoError(t, err)
		w = newCQWaiter(ctx, m.events, m.spin, time.Minute)
		cancel()
		_, err = w.next(cq, wcs)
		require.ErrorIs(t, err, context.Canceled, "%+v", m)
		w.close()
		require.NoError(t, cq.Destroy())
	}
}

// TestDeviceBusyPoll: a perf device busy-polls for the base spin budget
// (the default's 50 us, or --spin's; --spin -1 polls like the default)
// where no application polls it: an idle server (write, read and atomic
// bandwidth, read and atomic latency), and both ends of any test with
// -e; never where the application's wait polls it, or with --spin 0.
func TestDeviceBusyPoll(t *testing.T) {
	var (
		writeBW  = oob.Test{Verb: oob.VerbWrite}
		readBW   = oob.Test{Verb: oob.VerbRead}
		sendBW   = oob.Test{Verb: oob.VerbSend}
		readLat  = oob.Test{Verb: oob.VerbRead, Latency: true}
		sendLat  = oob.Test{Verb: oob.VerbSend, Latency: true}
		writeLat = oob.Test{Verb: oob.VerbWrite, Latency: true}
		spin80   = 80 * time.Microsecond
	)
	for _, c := range []struct {
		test   oob.Test
		server bool
		events bool
		spin   time.Duration
		want   time.Duration
	}{
		// The idle server, waiting hybrid, polling or sleeping at once.
		{writeBW, true, false, defaultSpin, defaultSpin},
		{readBW, true, false, spin80, spin80},
		{readLat, true, false, -1, defaultSpin},
		{writeBW, true, false, 0, 0},
		// Ends whose application's wait polls the device.
		{writeBW, false, false, defaultSpin, 0},
		{sendBW, true, false, defaultSpin, 0},
		{sendLat, false, false, -1, 0},
		{writeLat, true, false, defaultSpin, 0},
		// -e: both ends poll, in bandwidth and latency tests.
		{writeBW, false, true, defaultSpin, defaultSpin},
		{writeBW, true, true, defaultSpin, defaultSpin},
		{sendBW, true, true, spin80, spin80},
		{sendBW, false, true, -1, defaultSpin},
		{sendBW, false, true, 0, 0},
		{readLat, true, true, defaultSpin, defaultSpin},
		{sendLat, false, true, defaultSpin, defaultSpin},
		{writeLat, true, true, 0, 0},
	} {
		idles := c.server && c.test.ServerIdles()
		require.Equal(t, c.want, deviceBusyPoll(idles, c.events, c.spin), "%+v", c)
	}
}
