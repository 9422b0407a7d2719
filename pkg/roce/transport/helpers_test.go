package transport

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type gotPkt struct {
	data []byte
	ep   Endpoint
}

// receiveTimeout bounds every wait for a datagram in these tests.
// Loopback and MemNetwork deliver in microseconds, so it only runs out when
// a datagram was lost; the test then fails at once, saying what it missed,
// instead of hanging in Receive until go test's 10-minute timeout.
const receiveTimeout = 10 * time.Second

// recvGuard closes a Conn when no datagram arrived for receiveTimeout,
// which unblocks a waiting Receive with net.ErrClosed; its methods turn
// that error into a message that says so. progress re-arms it without
// allocating, so zero-allocation loops can use it.
type recvGuard struct {
	c     Conn
	timer *time.Timer
	fired atomic.Bool
}

// guardReceives arms a recvGuard on c until the test ends (or stop).
func guardReceives(t testing.TB, c Conn) *recvGuard {
	g := &recvGuard{c: c}
	g.timer = time.AfterFunc(receiveTimeout, func() {
		g.fired.Store(true)
		c.Close()
	})
	t.Cleanup(func() { g.timer.Stop() })
	return g
}

// progress restarts the timeout after a datagram arrived.
func (g *recvGuard) progress() { g.timer.Reset(receiveTimeout) }

// stop disarms the guard; it reports false when the guard fired (and
// closed the Conn) first.
func (g *recvGuard) stop() bool { return g.timer.Stop() && !g.fired.Load() }

// noError fails the test if err is not nil, naming the timeout if the
// guard caused it; what says what the test was waiting for.
func (g *recvGuard) noError(t testing.TB, err error, what string) {
	t.Helper()
	if err == nil {
		return
	}
	if g.fired.Load() {
		t.Fatalf("%s: no datagram arrived on %v for %v (the test closed the Conn): %v",
			what, g.c.LocalAddrs(), receiveTimeout, err)
	}
	t.Fatalf("%s: %v", what, err)
}

// receiveN receives until want datagrams arrived, in batches of the
// Conn's batch size. A lost datagram fails the test after receiveTimeout
// with the count and a description of what did arrive.
func receiveN(t testing.TB, c Conn, want int, size int) []gotPkt {
	t.Helper()
	return receiveNBatch(t, c, want, size, c.BatchSize())
}

// receiveNBatch is receiveN with batch buffers per Receive call.
func receiveNBatch(t testing.TB, c Conn, want, size, batch int) []gotPkt {
	t.Helper()
	g := guardReceives(t, c)
	r := newRxSet(batch, size)
	var out []gotPkt
	for len(out) < want {
		n, err := c.Receive(r.bufs, r.sizes, r.eps)
		if err != nil {
			g.noError(t, err, fmt.Sprintf("waiting for datagram %d of %d (got %s)", len(out)+1, want, describe(out)))
		}
		require.Positive(t, n)
		for i := range n {
			d := make([]byte, r.sizes[i])
			copy(d, r.bufs[i])
			out = append(out, gotPkt{data: d, ep: r.eps[i]})
		}
		g.progress()
	}
	if !g.stop() {
		t.Fatalf("received all %d datagrams on %v, but the %v receive timeout closed the Conn at the same time", want, c.LocalAddrs(), receiveTimeout)
	}
	require.Len(t, out, want)
	return out
}

// describe lists received datagrams by length, sender and first bytes
// (the test payloads start with their index).
func describe(got []gotPkt) string {
	if len(got) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, p := range got {
		if i == 8 {
			fmt.Fprintf(&b, " ... and %d more", len(got)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d B from %v starting %x", len(p.data), p.ep.Remote, p.data[:min(len(p.data), 4)])
	}
	return b.String()
}

// payload makes a datagram whose content identifies it.
func payload(id, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(id*131 + i*7)
	}
	if size >= 4 {
		b[0], b[1], b[2], b[3] = byte(id>>24), byte(id>>16), byte(id>>8), byte(id)
	}
	return b
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// dgramsOfLens returns whole datagrams of the given lengths, each filled
// with its index so a test can tell them apart.
func dgramsOfLens(lens ...int) [][]byte {
	bufs := make([][]byte, len(lens))
	for i, l := range lens {
		bufs[i] = bytes.Repeat([]byte{byte(i + 1)}, l)
	}
	return bufs
}
