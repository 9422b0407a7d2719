package kv

import (
	"fmt"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// The model through lossy, reordering links (the --fault syntax, several
// seeds): every datagram the clients' host sends or receives may be lost,
// duplicated, held back behind later ones or corrupted (the ICRC drops
// it), so READ responses, PUTs and their responses are retransmitted,
// duplicated and reordered while 4 clients write and read concurrently.
// Every GET must still return exactly a state the model allows: the
// seqlock and checksums see no torn value, and RC delivers each PUT once.
func TestModelConcurrentRDMAThroughFaults(t *testing.T) {
	const spec = "loss=0.02,dup=0.02,reorder=0.03,corrupt=0.01"
	for _, seed := range []int64{1, 2, 3} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := newRig(t)
			fc, err := transport.ParseFaultSpec(spec)
			require.NoError(t, err)
			fc.Seed = seed
			dev := openDevWith(t, r.net, "10.0.0.3", ib.Config{Fault: &fc})
			const nc = 4
			cs := dialClientsOn(t, dev, r.cmAddr, nc)
			ops := modelOps(t, nc, 300)
			gets, writes := runModel(t, cs, 48, ops, uint64(seed))
			require.Equal(t, nc*ops, gets+writes)
			rs, _ := r.app.Stats()
			require.Equal(t, uint64(writes), rs.Puts+rs.Deletes, "each PUT or DELETE applied once")
			ctr := dev.Counters()
			t.Logf("seed %d: %d GETs, %d writes; completer_retry_err %d, implied_naks %d, duplicate requests %d",
				seed, gets, writes, ctr["completer_retry_err"], ctr["implied_naks"], ctr["duplicate_request"])
		})
	}
}
