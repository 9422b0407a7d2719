package oob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func randomKey(rng *rand.Rand, out uint16) Key {
	k := Key{OutReads: out, QPN: rng.Uint32N(1 << 24), PSN: rng.Uint32N(1 << 24), RKey: rng.Uint32(), VAddr: rng.Uint64()}
	for i := range k.GID {
		k.GID[i] = byte(rng.UintN(256))
	}
	return k
}

type sessionResult struct {
	neg     Negotiated
	remotes []Key
	report  BWReport
	err     error
}

// runSide plays one perftest side: negotiate, connect (checking the callback
// sees the peer's keys before the barriers), finish.
func runSide(ctx context.Context, s *Session, test Test, mtu int, locals []Key, my BWReport) sessionResult {
	var r sessionResult
	if r.neg, r.err = s.Negotiate(ctx, mtu); r.err != nil {
		return r
	}
	var seen []Key
	if r.remotes, r.err = s.Connect(ctx, test, locals, func(rem []Key) error {
		seen = append([]Key(nil), rem...)
		return nil
	}); r.err != nil {
		return r
	}
	if len(seen) != len(r.remotes) {
		r.err = errorf("", ErrConnect, "callback saw %d keys", len(seen))
		return r
	}
	r.report, r.err = s.Finish(ctx, test, locals[0], my)
	return r
}

func TestPerftestSessionLoopback(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	tests := []Test{
		{VerbWrite, false}, {VerbRead, false}, {VerbAtomic, false}, {VerbSend, false},
		{VerbWrite, true}, {VerbRead, true}, {VerbAtomic, true}, {VerbSend, true},
	}
	for _, test := range tests {
		for _, qps := range []int{1, 3} {
			t.Run(fmt.Sprintf("%v/qps=%d", test, qps), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				scfg := &SessionConfig{Options: Options{Timeout: 5 * time.Second}, CycleBuffer: 4096, CacheLineSize: 128}
				ccfg := &SessionConfig{Options: Options{Timeout: 5 * time.Second}, CycleBuffer: 8192, CacheLineSize: 64}
				ln, err := ListenPerftest("127.0.0.1:0", scfg)
				require.NoError(t, err)
				defer ln.Close()
				var skeys, ckeys []Key
				for range qps {
					skeys = append(skeys, randomKey(rng, 128))
					ckeys = append(ckeys, randomKey(rng, 1))
				}
				creport := BWReport{Size: 65536, Iters: 1000, BWPeak: 1234.5, BWAvg: 1200.25, MsgRateAvg: 0.0192}
				sreport := BWReport{Size: 1, Iters: 2, BWPeak: 3, BWAvg: 4, MsgRateAvg: 5}

				srv := make(chan sessionResult, 1)
				go func() {
					s, err := ln.Accept(ctx)
					if err != nil {
						srv <- sessionResult{err: err}
						return
					}
					srv <- runSide(ctx, s, test, 3, skeys, sreport)
				}()
				c, err := DialPerftest(ctx, ln.Addr().String(), ccfg)
				require.NoError(t, err)
				cres := runSide(ctx, c, test, 5, ckeys, creport)
				require.NoError(t, cres.err)
				sres := <-srv
				require.NoError(t, sres.err)

				want := Negotiated{RemoteVersion: PerftestVersion, SysData: SysData{CycleBuffer: 8192, CacheLineSize: 128}, MTU: 3}
				require.Equal(t, want, cres.neg)
				require.Equal(t, want, sres.neg)
				require.Equal(t, skeys, cres.remotes)
				require.Equal(t, ckeys, sres.remotes)
				if test.ExchangesReports() {
					require.Equal(t, creport, sres.report)
					require.Equal(t, sreport, cres.report)
				} else {
					require.Zero(t, sres.report)
					require.Zero(t, cres.report)
				}
			})
		}
	}
}

func TestPerftestDontXchgVersions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := &SessionConfig{Options: Options{Timeout: 5 * time.Second}, DontXchgVersions: true, ReportPerPort: true}
	ln, err := ListenPerftest("127.0.0.1:0", cfg)
	require.NoError(t, err)
	defer ln.Close()
	test := Test{Verb: VerbWrite}
	rng := rand.New(rand.NewPCG(1, 1))
	sk, ck := randomKey(rng, 1), randomKey(rng, 1)
	rep := BWReport{Size: 8, Iters: 9, BWPeak: 1, BWAvg: 2, MsgRateAvg: 3, BWAvgP1: 4, MsgRateAvgP1: 5, BWAvgP2: 6, MsgRateAvgP2: 7}
	srv := make(chan sessionResult, 1)
	go func() {
		s, err := ln.Accept(ctx)
		if err != nil {
			srv <- sessionResult{err: err}
			return
		}
		srv <- runSide(ctx, s, test, 5, []Key{sk}, BWReport{})
	}()
	c, err := DialPerftest(ctx, ln.Addr().String(), cfg)
	require.NoError(t, err)
	cres := runSide(ctx, c, test, 2, []Key{ck}, rep)
	require.NoError(t, cres.err)
	sres := <-srv
	require.NoError(t, sres.err)
	// Nothing negotiated: each side keeps its own MTU and defaults.
	require.Equal(t, 2, cres.neg.MTU)
	require.Equal(t, 5, sres.neg.MTU)
	require.Equal(t, SysData{CycleBuffer: 4096, CacheLineSize: 64}, sres.neg.SysData)
	require.Equal(t, rep, sres.report, "per-port figures travel too")
	require.Equal(t, []Key{ck}, sres.remotes)
}

func TestPingpongLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := &Options{Timeout: 5 * time.Second}
	ln, err := ListenPingpong("127.0.0.1:0", opts)
	require.NoError(t, err)
	defer ln.Close()
	server := PingpongDest{QPN: 0x11, PSN: 0xabcdef, GID: [16]byte{0: 0xfd, 15: 1}}
	client := PingpongDest{LID: 3, QPN: 0xffffff, PSN: 0, GID: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 2}}
	var serverConnected atomic.Bool
	type res struct {
		d   PingpongDest
		err error
	}
	srv := make(chan res, 1)
	go func() {
		d, err := ln.Exchange(ctx, server, func(r PingpongDest) error {
			if r != client {
				return errorf("", ErrConnect, "wrong remote %+v", r)
			}
			serverConnected.Store(true)
			return nil
		})
		srv <- res{d, err}
	}()
	got, err := DialPingpong(ctx, ln.Addr().String(), client, func(r PingpongDest) error {
		// The server answers only after its own QP is connected.
		require.True(t, serverConnected.Load())
		require.Equal(t, server, r)
		return nil
	}, opts)
	require.NoError(t, err)
	require.Equal(t, server, got)
	sr := <-srv
	require.NoError(t, sr.err)
	require.Equal(t, client, sr.d)
}

func TestPerftestConnectCallbackFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := &SessionConfig{Options: Options{Timeout: 10 * time.Second}}
	ln, err := ListenPerftest("127.0.0.1:0", cfg)
	require.NoError(t, err)
	defer ln.Close()
	test := Test{Verb: VerbRead}
	srv := make(chan sessionResult, 1)
	go func() {
		s, err := ln.Accept(ctx)
		if err != nil {
			srv <- sessionResult{err: err}
			return
		}
		srv <- runSide(ctx, s, test, 3, []Key{{QPN: 1}}, BWReport{})
	}()
	c, err := DialPerftest(ctx, ln.Addr().String(), cfg)
	require.NoError(t, err)
	_, err = c.Negotiate(ctx, 3)
	require.NoError(t, err)
	_, err = c.Connect(ctx, test, []Key{{QPN: 2}}, func([]Key) error { return errors.New("RTR refused") })
	require.ErrorIs(t, err, ErrConnect)
	require.Contains(t, err.Error(), "RTR refused")
	// The server learns at once, not after its 10 s step timeout.
	sres := <-srv
	require.ErrorIs(t, sres.err, ErrClosed)
	require.Contains(t, sres.err.Error(), "key message")
}

func TestSessionLogs(t *testing.T) {
	var logBuf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logBuf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := &SessionConfig{Options: Options{Timeout: 5 * time.Second, Logger: logger}}
	ln, err := ListenPerftest("127.0.0.1:0", cfg)
	require.NoError(t, err)
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		s, err := ln.Accept(ctx)
		if err == nil {
			_, err = s.ExchangeVersions(ctx)
			s.CloseWithoutExchange()
		}
		errc <- err
	}()
	c, err := DialPerftest(ctx, ln.Addr().String(), nil)
	require.NoError(t, err)
	v, err := c.ExchangeVersions(ctx)
	require.NoError(t, err)
	require.Equal(t, "6.06", v)
	require.Equal(t, Client, c.Role())
	require.Equal(t, ln.Addr().String(), c.RemoteAddr())
	require.NoError(t, <-errc)
	require.NoError(t, c.CloseWithoutExchange())
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, logBuf.String(), `msg="oob recv"`)
	require.Contains(t, logBuf.String(), `what="perftest version" len=16`)
	require.Equal(t, "server", Server.String())
	require.Equal(t, "client", Client.String())
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestOldLocalVersionNarrowsIters: with --dont_xchg_versions the peer is
// taken to run our version; claiming one older than 5.33 switches the
// report's iters field to 4 bytes, as perftest would.
func TestOldLocalVersionNarrowsIters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := &SessionConfig{Options: Options{Timeout: 5 * time.Second}, DontXchgVersions: true, Version: "5.20"}
	ln, err := ListenPerftest("127.0.0.1:0", cfg)
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			got <- nil
			return
		}
		defer c.CloseWithoutExchange()
		// Raw: the size exchange, then a 4-byte iters field.
		b := make([]byte, 12)
		_, _ = io.ReadFull(c.s.c, b[:8])
		_, _ = c.s.c.Write(make([]byte, 8))
		_, _ = io.ReadFull(c.s.c, b[8:])
		got <- b
	}()
	s, err := DialPerftest(ctx, ln.Addr().String(), cfg)
	require.NoError(t, err)
	defer s.CloseWithoutExchange()
	go func() { _, _ = s.ExchangeBWReports(ctx, BWReport{Size: 1, Iters: 0x01020304}) }()
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4}, <-got)
}

func TestTestKinds(t *testing.T) {
	names := map[Test]string{
		{VerbWrite, false}: "ib_write_bw", {VerbRead, true}: "ib_read_lat", {VerbSend, false}: "ib_send_bw", {VerbAtomic, true}: "ib_atomic_lat",
	}
	for tc, want := range names {
		require.Equal(t, want, tc.String())
	}
	require.Equal(t, "Verb(9)", Verb(9).String())
	require.True(t, Test{Verb: VerbRead}.ServerIdles())
	require.True(t, Test{Verb: VerbRead, Latency: true}.ServerIdles())
	require.False(t, Test{Verb: VerbWrite, Latency: true}.ServerIdles())
	require.False(t, Test{Verb: VerbSend}.ServerIdles())
	require.False(t, Test{Verb: VerbWrite, Latency: true}.ClosesWithExchange())
	require.True(t, Test{Verb: VerbSend, Latency: true}.ClosesWithExchange())
}
