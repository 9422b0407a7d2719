package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The first lap round a fresh ring must not allocate (slots are carved
// from shared backing arrays at init), and one slot's data must never leak
// into its neighbour, even when a WR outgrows the preallocated share.
func TestSendQueuePreallocatedSlots(t *testing.T) {
	var s sendQueue
	s.init(4, 2, 8)
	inline := []byte("12345678")
	sgl := []SGE{{Addr: 1, Length: 2, LKey: 3}, {Addr: 4, Length: 5, LKey: 6}}
	allocs := testing.AllocsPerRun(1, func() {
		s.head = 0
		s.tail.Store(0)
		for i := 0; i < 2; i++ {
			if err := s.pushLocked(&SendWR{ID: uint64(i), Opcode: WRSend, Flags: Inline, Inline: inline}); err != nil {
				panic(err)
			}
			if err := s.pushLocked(&SendWR{ID: uint64(i), Opcode: WRSend, SGL: sgl}); err != nil {
				panic(err)
			}
		}
	})
	require.Zero(t, allocs, "first lap allocates")
	require.ErrorIs(t, s.pushLocked(&SendWR{Opcode: WRSend}), ErrSendFull)

	// Slot 0 outgrows its 8-byte inline share: slot 1 keeps its own bytes.
	s.head = 0
	s.tail.Store(0)
	big := []byte("0123456789abcdef")
	require.NoError(t, s.pushLocked(&SendWR{Opcode: WRSend, Flags: Inline, Inline: big}))
	require.NoError(t, s.pushLocked(&SendWR{Opcode: WRSend, Flags: Inline, Inline: []byte("XY")}))
	require.Equal(t, big, s.at(0).wr.Inline)
	require.Equal(t, []byte("XY"), s.at(1).wr.Inline)
	// Three SGEs in a two-SGE slot, then a neighbour: both intact.
	s.head = 2
	s.tail.Store(2)
	three := append(append([]SGE(nil), sgl...), SGE{Addr: 7, Length: 8, LKey: 9})
	require.NoError(t, s.pushLocked(&SendWR{Opcode: WRSend, SGL: three}))
	require.NoError(t, s.pushLocked(&SendWR{Opcode: WRSend, SGL: sgl[:1]}))
	require.Equal(t, three, s.at(2).wr.SGL)
	require.Equal(t, sgl[:1], s.at(3).wr.SGL)
}
