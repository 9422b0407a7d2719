package roce

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// cowList: empty at zero, adds in order, removes every copy of an
// element, and a slice loaded before a change keeps what it held.
func TestCowList(t *testing.T) {
	var l cowList[int]
	require.Empty(t, l.load())
	l.add(1)
	l.add(2)
	l.add(1)
	before := l.load()
	require.Equal(t, []int{1, 2, 1}, before)
	l.remove(1)
	require.Equal(t, []int{2}, l.load())
	require.Equal(t, []int{1, 2, 1}, before, "a reader's slice is never changed")
	l.remove(3)
	require.Equal(t, []int{2}, l.load())
	l.remove(2)
	require.Empty(t, l.load())
}
