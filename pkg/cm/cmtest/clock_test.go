package cmtest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFakeClockOrderAndStop(t *testing.T) {
	start := time.Unix(100, 0)
	c := NewFakeClock(start)
	var got []string
	var at []time.Duration
	rec := func(s string) func() {
		return func() { got = append(got, s); at = append(at, c.Now().Sub(start)) }
	}
	c.AfterFunc(3*time.Second, rec("c"))
	c.AfterFunc(time.Second, rec("a"))
	stopped := c.AfterFunc(2*time.Second, rec("x"))
	c.AfterFunc(time.Second, func() {
		rec("b")()
		c.AfterFunc(500*time.Millisecond, rec("b2")) // armed by a callback, due within the step
	})
	require.True(t, stopped.Stop())
	require.False(t, stopped.Stop())
	d, ok := c.NextDeadline()
	require.True(t, ok)
	require.Equal(t, time.Second, d)
	c.Advance(2 * time.Second)
	require.Equal(t, []string{"a", "b", "b2"}, got)
	require.Equal(t, []time.Duration{time.Second, time.Second, 1500 * time.Millisecond}, at)
	require.Equal(t, 2*time.Second, c.Now().Sub(start))
	require.Equal(t, 1, c.Pending())
	c.Advance(time.Second)
	require.Equal(t, []string{"a", "b", "b2", "c"}, got)
	_, ok = c.NextDeadline()
	require.False(t, ok)
}
