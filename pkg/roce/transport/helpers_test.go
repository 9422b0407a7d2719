package transport

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

type gotPkt struct {
	data []byte
	ep   Endpoint
}

// receiveN receives until want datagrams arrived (Receive blocks, so a lost
// datagram shows up as a test timeout, not a flaky count).
func receiveN(t testing.TB, c Conn, want int, size int) []gotPkt {
	t.Helper()
	r := newRxSet(c.BatchSize(), size)
	var out []gotPkt
	for len(out) < want {
		n, err := c.Receive(r.bufs, r.sizes, r.eps)
		require.NoError(t, err)
		require.Positive(t, n)
		for i := range n {
			d := make([]byte, r.sizes[i])
			copy(d, r.bufs[i])
			out = append(out, gotPkt{data: d, ep: r.eps[i]})
		}
	}
	require.Len(t, out, want)
	return out
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
