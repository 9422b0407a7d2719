package roce

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKickedSet: the one-QP slot and the map behave as one set: members
// are found wherever they live, removed from either, and take hands each
// out exactly once, at most len(dst) a call.
func TestKickedSet(t *testing.T) {
	var s kickedSet
	require.True(t, s.empty())
	require.False(t, s.has(7))
	require.Zero(t, s.take(make([]uint32, 4)), "nothing to take")

	s.add(7) // the slot
	require.True(t, s.has(7))
	require.Nil(t, s.more, "one QP needs no map")
	s.add(9) // the map
	s.add(11)
	for _, q := range []uint32{7, 9, 11} {
		require.True(t, s.has(q), "%d", q)
	}
	require.False(t, s.has(8))

	s.remove(7) // from the slot: the map keeps the rest
	require.False(t, s.has(7))
	require.True(t, s.has(9) && s.has(11))
	s.add(13) // the free slot again
	require.True(t, s.hasOne)
	s.remove(11) // from the map
	require.False(t, s.has(11))

	var got []uint32
	dst := make([]uint32, 1)
	for !s.empty() {
		n := s.take(dst)
		require.Equal(t, 1, n, "at most len(dst) a call")
		got = append(got, dst[:n]...)
	}
	slices.Sort(got)
	require.Equal(t, []uint32{9, 13}, got, "each member once")
	require.Zero(t, s.take(dst))

	for q := range uint32(40) { // more than a take holds
		s.add(q)
	}
	n1 := s.take(make([]uint32, 16))
	n2 := s.take(make([]uint32, 16))
	n3 := s.take(make([]uint32, 16))
	require.Equal(t, []int{16, 16, 8}, []int{n1, n2, n3})
	require.True(t, s.empty())
}
