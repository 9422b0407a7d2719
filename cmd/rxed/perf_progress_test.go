package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPerfDurationRunFailureNamesNoIterationCount: a -D run that fails
// says how many operations completed and the duration, not a count it
// never had. Bug (found by the newcomer audit, session AG): a client of
// `perf write -D 30` whose server was interrupted said "completion with
// error RETRY_EXC_ERR ... while running ib_write_bw (15633 of 5000 done)",
// the default -n it did not run.
func TestPerfDurationRunFailureNamesNoIterationCount(t *testing.T) {
	o, code, ok := parsePerf([]string{"write", "--addr", "127.0.0.1", "-D", "30", "127.0.0.2"}, io.Discard)
	require.True(t, ok, "exit %d", code)
	require.Equal(t, "running ib_write_bw (15633 done, -D 30s)", o.bwProgress(15633, 1))
	o, code, ok = parsePerf([]string{"write", "--addr", "127.0.0.1", "-n", "100", "-q", "2", "127.0.0.2"}, io.Discard)
	require.True(t, ok, "exit %d", code)
	require.Equal(t, "running ib_write_bw (150 of 200 done)", o.bwProgress(150, 2))
}
