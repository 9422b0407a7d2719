package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/conform"
)

// TestPeerLostAfterNamesTheScenario: the interop CI at 63dbe54 saw D-PAD panic the rxe
// guest's kernel; rxed conform went on through 26 scenarios that all ERRORed at setup. It now
// says on stderr where the peer was lost; an ERROR here and there, or a run that ends in
// PASSes, is no lost peer.
func TestPeerLostAfterNamesTheScenario(t *testing.T) {
	P, F, E := conform.Pass, conform.Fail, conform.Error
	setup := "setup: connecting to 10.78.0.11:20133: connect: no route to host"
	mk := func(vs ...conform.Verdict) []conform.Result {
		var out []conform.Result
		for i, v := range vs {
			ev := "e"
			if v == E {
				ev = setup
			}
			out = append(out, conform.Result{ID: string(rune('A' + i)), Verdict: v, Evidence: ev})
		}
		return out
	}
	id, n, ok := peerLostAfter(mk(P, P, F, E, E, E))
	require.True(t, ok)
	require.Equal(t, "C", id)
	require.Equal(t, 3, n)
	id, _, ok = peerLostAfter(mk(P, E, E, E)) // the culprit's own setup already failed
	require.True(t, ok)
	require.Equal(t, "B", id, "a PASS before the ERRORs is not the culprit: the first ERROR is")
	for _, rs := range [][]conform.Result{
		mk(P, F, E),       // one ERROR is not a pattern
		mk(P, P, P),       // all fine
		mk(E, E, E),       // never reached a peer
		nil,               // nothing ran
		mk(P, F, P, E, E), // the peer answered after the FAIL
	} {
		_, _, ok := peerLostAfter(rs)
		require.False(t, ok, "%v", rs)
	}
	other := mk(P, F, E, E)
	other[3].Evidence = "exchange: peer sent garbage"
	_, _, ok = peerLostAfter(other)
	require.False(t, ok, "an ERROR that is not at setup is another problem")
}
