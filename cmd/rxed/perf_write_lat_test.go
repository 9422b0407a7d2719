package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// perftest's order (linux-rdma/perftest perftest_resources.c): in
// run_iter_lat_write the server skips its first poll and writes first,
// in run_iter_lat_send the client sends first; the captured rxe-rxe
// ib_write_lat (pcaps/perftest_write_lat_rc_2.pcap) starts with the
// server's RDMA WRITE. rxed used the send order for write_lat too: as
// server it waited for a client that was itself waiting (no packets at
// all), as client both sides wrote message 1 and the real server's poll
// for exactly 1 was overwritten by 2.
//
// Regression test: was TestRegressLatencyFirstSender in regress_writelat_test.go
// (added in commit fb9f5b8).
func TestLatencyFirstSender(t *testing.T) {
	cases := []struct {
		name            string
		byWrite, server bool
		first           bool
	}{
		{"write_lat server", true, true, true},
		{"write_lat client", true, false, false},
		{"send_lat server", false, true, false},
		{"send_lat client", false, false, true},
	}
	for _, c := range cases {
		require.Equal(t, c.first, latSendsFirst(c.byWrite, c.server), c.name)
	}
	// Exactly one side starts, or the run deadlocks or races.
	for _, byWrite := range []bool{true, false} {
		require.NotEqual(t, latSendsFirst(byWrite, true), latSendsFirst(byWrite, false))
	}
}
