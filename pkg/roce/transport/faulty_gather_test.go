package transport

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/require"
)

// gatherRecorder is an inner Conn that can gather; it records every
// datagram sent, flattened, and whether it came in pieces.
type gatherRecorder struct {
	Conn
	sent     [][]byte
	gathered []bool
}

func (g *gatherRecorder) Send(bufs [][]byte, ep Endpoint) error {
	for _, b := range bufs {
		g.sent, g.gathered = append(g.sent, bytes.Clone(b)), append(g.gathered, false)
	}
	return nil
}

func (g *gatherRecorder) SendGather(dgrams []Gather, ep Endpoint) error {
	for i := range dgrams {
		g.sent, g.gathered = append(g.sent, dgrams[i].AppendTo(nil)), append(g.gathered, true)
	}
	return nil
}

// pieces is datagram id as a Gather of headers, payload and trailer.
func pieces(id int) Gather {
	p := idPayload(id, 40)
	return Gather{bytes.Clone(p[:12]), bytes.Clone(p[12:36]), bytes.Clone(p[36:])}
}

// With inline faults on send a Faulty gathers as its inner Conn does: the
// survivors of the seed's draws leave in pieces, in order; a corrupted one
// leaves as a flat copy with one bit flipped, and the caller's pieces are
// not touched. Before, a Faulty hid SendGather and the engine copied
// every payload of a lossy run next to its headers.
func TestFaultyInlineSendGather(t *testing.T) {
	mn := NewMemNetwork()
	c, err := mn.Listen(ap("10.0.0.1:1"))
	require.NoError(t, err)
	inner := &gatherRecorder{Conn: c}
	cfg := FaultConfig{Direction: DirSend, Loss: 0.3, Corrupt: 0.2, Seed: 5}
	f := NewFaulty(inner, cfg)
	defer f.Close()
	var gs GatherSender = f

	const n = 200
	var dgrams []Gather
	for i := range n {
		dgrams = append(dgrams, pieces(i))
	}
	for i := 0; i < n; i += 16 {
		require.NoError(t, gs.SendGather(dgrams[i:min(i+16, n)], Endpoint{Remote: ap("10.0.0.2:1")}))
	}
	order, corrupted, counts := faultModel(cfg, n)
	require.Len(t, inner.sent, len(order))
	for j, got := range inner.sent {
		id := order[j]
		want := idPayload(id, 40)
		if corrupted[id] {
			require.False(t, inner.gathered[j], "datagram %d: a flat copy", id)
			diff := 0
			for i := range want {
				diff += bits.OnesCount8(want[i] ^ got[i])
			}
			require.Equal(t, 1, diff, "datagram %d: one bit flipped", id)
			continue
		}
		require.True(t, inner.gathered[j], "datagram %d: in pieces", id)
		require.Equal(t, want, got)
	}
	for i := range dgrams {
		require.Equal(t, idPayload(i, 40), dgrams[i].AppendTo(nil), "the caller's pieces are untouched")
	}
	s, _ := f.FaultStats()
	require.Equal(t, counts, s)

	big := Gather{make([]byte, MaxDatagramSize), []byte{1}}
	require.ErrorIs(t, gs.SendGather([]Gather{big}, Endpoint{}), ErrTooLarge)
}

// Faults that add or hold back datagrams, or an inner Conn that cannot
// gather, get flat copies through Send: dup sends each one twice.
func TestFaultySendGatherFlatWhenFaultsQueue(t *testing.T) {
	mn := NewMemNetwork()
	c, err := mn.Listen(ap("10.0.0.1:1"))
	require.NoError(t, err)
	inner := &gatherRecorder{Conn: c}
	f := NewFaulty(inner, FaultConfig{Direction: DirSend, Dup: 1, Seed: 1})
	defer f.Close()
	require.NoError(t, f.SendGather([]Gather{pieces(0), pieces(1)}, Endpoint{}))
	var ids []int
	for j, b := range inner.sent {
		require.False(t, inner.gathered[j])
		ids = append(ids, int(binary.BigEndian.Uint32(b)))
	}
	require.Equal(t, []int{0, 0, 1, 1}, ids)

	p := newFaultPair(t, FaultConfig{Loss: 0.5, Seed: 2}) // MemNetwork: no SendGather
	var gs GatherSender = p.f
	var dgrams []Gather
	for i := range 64 {
		dgrams = append(dgrams, pieces(i))
	}
	require.NoError(t, gs.SendGather(dgrams, p.dst))
	order, _, _ := faultModel(FaultConfig{Loss: 0.5, Seed: 2}, 64)
	got := p.drain(t)
	require.Len(t, got, len(order))
	for j, b := range got {
		require.Equal(t, idPayload(order[j], 40), b)
	}
}
