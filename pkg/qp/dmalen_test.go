package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// Bug (found by the security audit, session AF): a RETH's DMA length
// above 2^31 (IBA C9-94's limit) was taken as it came: checked against
// the region and, for a READ against a region as large, segmented into
// up to 2^24 responses at MTU 256, the whole PSN space, so the expected
// PSN wrapped back onto the READ's own. rdma_rxe refuses such a request
// before it looks at the rkey (rxe_resp_check_length: RESPST_ERR_LENGTH,
// a class C invalid request NAK); rxed answered it with a remote access
// NAK after the region lookup. Now it is an invalid request NAK, as
// rxe's, whatever the rkey; 2^31 itself is still a length like any other.
func TestRETHLengthAboveTwoToTheThirtyFirstIsInvalid(t *testing.T) {
	for _, c := range []struct {
		n    uint32
		code uint8
	}{
		{1<<31 + 1, wire.NAKInvalidRequest},
		{0xFFFF_FFFF, wire.NAKInvalidRequest},
		{1 << 31, wire.NAKRemoteAccess}, // allowed; the region is smaller
	} {
		l := newLink(t, RC, 7, 7)
		l.deliver(l.b, l.a, readRequest(t, l.b, 0xFFFFFE, l.b.m.IOVA(), l.b.m.RKey(), c.n))
		out := l.b.env.take()
		require.Len(t, out, 1, "length %#x", c.n)
		var p wire.Packet
		require.NoError(t, p.Parse(out[0]))
		require.Equal(t, wire.RCAck, p.Opcode)
		syn := p.AETH.Syndrome()
		require.Equal(t, wire.SynNAK, syn.Kind(), "length %#x", c.n)
		require.Equal(t, c.code, syn.NAKCode(), "length %#x", c.n)
		require.Equal(t, Err, l.b.q.State())
	}
	// A WRITE's RETH too.
	l := newLink(t, RC, 7, 7)
	h := wire.Headers{Opcode: wire.RCWriteFirst, PKey: DefaultPKey, DestQP: l.b.q.Num(), PSN: 0xFFFFFE,
		VA: l.b.m.IOVA(), RKey: l.b.m.RKey(), DMALen: 1<<31 + 256}
	buf := make([]byte, MaxPacketLen)
	_, size, err := h.EncodeHeaders(buf, 256)
	require.NoError(t, err)
	before := append([]byte(nil), l.b.buf[:256]...)
	l.deliver(l.b, l.a, buf[:size])
	out := l.b.env.take()
	require.Len(t, out, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(out[0]))
	require.Equal(t, uint8(wire.NAKInvalidRequest), p.AETH.Syndrome().NAKCode())
	require.Equal(t, before, l.b.buf[:256], "nothing placed")
}
