package allreduce

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHelloRoundTrip(t *testing.T) {
	for _, h := range []hello{
		{rank: 0, ranks: 2, count: 2},
		{rank: 3, ranks: 8, count: 1 << 24, slotAddr: 0x7f00deadbeef0000, slotRKey: 0x1234, slotSize: 2 << 20, slots: 8},
		{rank: 65535, ranks: 65535, count: 1<<63 - 1, slotAddr: ^uint64(0), slotRKey: ^uint32(0), slotSize: ^uint32(0), slots: ^uint32(0)},
	} {
		b := h.append(nil)
		require.Len(t, b, helloLen)
		require.Equal(t, helloMagic, string(b[:4]))
		got, err := parseHello(b)
		require.NoError(t, err)
		require.Equal(t, h, got)
		got, err = parseHello(append(b, 0, 0, 0)) // rdma_cm pads private data
		require.NoError(t, err)
		require.Equal(t, h, got)
	}
}

// Every prefix of a hello is refused as not a ring, and so is the hello
// of the rings that handed slots back by SEND ("RXAR", 32 bytes: a rank
// of that build would wait for credits that never come).
func TestHelloRefusesPrefixesAndTheCreditRing(t *testing.T) {
	b := hello{rank: 1, ranks: 4, count: 4096, slotAddr: 1 << 40, slotRKey: 7, slotSize: 4096, slots: 4}.append(nil)
	for n := range len(b) {
		_, err := parseHello(b[:n])
		require.ErrorIs(t, err, errNotRing, "prefix of %d bytes", n)
	}
	old := append([]byte("RXAR"), b[4:32]...)
	_, err := parseHello(old)
	require.ErrorIs(t, err, errNotRing)
	_, err = parseHello(append(old, 0, 0, 0, 0)) // padded to a new hello's length
	require.ErrorIs(t, err, errNotRing)
}

// The dialing rank accepts the next rank's slots only if there are as
// many as slotsFor asks and each holds a chunk.
func TestSlotsOK(t *testing.T) {
	l := &rdmaLink{cfg: Config{Rank: 0, Ranks: 4, Count: 1001, Timeout: 1}}
	chunkBytes := uint32(maxChunk(1001, 4) * 4) // 251 floats
	require.NoError(t, l.slotsOK(hello{rank: 1, slots: 4, slotSize: chunkBytes}))
	require.NoError(t, l.slotsOK(hello{rank: 1, slots: 5, slotSize: chunkBytes + 4}))
	for _, h := range []hello{
		{rank: 1, slots: 3, slotSize: chunkBytes},
		{rank: 1, slots: 2, slotSize: 2 * chunkBytes},
		{rank: 1, slots: 4, slotSize: chunkBytes - 1},
		{rank: 1},
	} {
		err := l.slotsOK(h)
		require.ErrorIs(t, err, errMismatch, "%+v", h)
		require.Contains(t, err.Error(), "needs 4 of 1004")
	}
}

func FuzzParseHello(f *testing.F) {
	f.Add(hello{rank: 1, ranks: 4, count: 4096, slots: 4, slotSize: 4096}.append(nil))
	f.Add([]byte("RXAR0123456789012345678901234567"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			require.ErrorIs(t, err, errNotRing)
			return
		}
		// What parses re-encodes to the same first helloLen bytes.
		require.Equal(t, b[:helloLen], h.append(nil))
	})
}
