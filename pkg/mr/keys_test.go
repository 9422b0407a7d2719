package mr

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGuessedRKeys measures what a peer that guesses rkeys gets: against
// a table with a few registrations (three regions and a window bound to
// one of them), 10^6 guesses that know the key layout (an index in the
// region range, any key part) resolve at a rate below 1 in 10^6; with
// the sequential indexes of before, knowing the layout meant knowing the
// index, and 1 guess in 256 landed.
func TestGuessedRKeys(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	buf := alignedBuf(1 << 16)
	access := LocalWrite | RemoteRead | RemoteWrite
	var regs []*MR
	for i := range 3 {
		m, err := tb.RegMR(pd, buf[i<<14:(i+1)<<14], access|MWBind)
		require.NoError(t, err)
		regs = append(regs, m)
	}
	w, err := tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	_, err = w.Bind(regs[0], regs[0].IOVA(), 4096, RemoteRead)
	require.NoError(t, err)

	const guesses = 1_000_000
	rng := rand.New(rand.NewPCG(17, 4))
	resolves := func(key uint32) bool {
		for _, m := range regs {
			// Any region's range: a guess is good if the key opens anything.
			if reg, err := tb.Lookup(key, RKey, pd, m.IOVA(), 8, RemoteRead); err == nil {
				reg.Release()
				return true
			}
		}
		return false
	}
	hits := 0
	span := MaxMRIndex - MinMRIndex + 1
	for range guesses {
		key := MakeKey(MinMRIndex+rng.Uint32N(span), uint8(rng.UintN(256)))
		if resolves(key) {
			hits++
		}
	}
	t.Logf("%d of %d layout-aware guesses resolved (expected %.3f: %d regions / 2^26 per guess)",
		hits, guesses, float64(len(regs))*guesses/(1<<26), len(regs))
	require.Less(t, float64(hits)/guesses, 1e-6)

	// Uniformly random 32-bit keys (windows included) fare no better.
	hits = 0
	for range guesses {
		if resolves(rng.Uint32()) {
			hits++
		}
	}
	require.Less(t, float64(hits)/guesses, 1e-6)

	// What the index used to give away: with it known, one guess of the
	// key part in 256 resolves; now the index itself is the secret.
	known := 0
	for range 2560 {
		if resolves(MakeKey(MinMRIndex+rng.Uint32N(3), uint8(rng.UintN(256)))) {
			known++
		}
	}
	require.Less(t, known, 3, "guessing the first indexes (what sequential allocation handed out)")
}
