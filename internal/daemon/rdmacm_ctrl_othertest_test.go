package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/roce"
	"github.com/stretchr/testify/require"
)

// TestCMControlRefusesAnotherTest: over perf -R's control connection, an
// rxed client announces its test in its version message and an rxed
// server that runs another refuses it in its answer, both naming the two
// tests; a client of the same test, or one announcing none (perftest), is
// served. Bug: newcomer walkthrough, item 6 (-R had no announcement).
func TestCMControlRefusesAnotherTest(t *testing.T) {
	write, read := oob.Test{Verb: oob.VerbWrite}, oob.Test{Verb: oob.VerbRead}
	for _, c := range []struct {
		name    string
		cli     *oob.Test
		refused bool
	}{
		{"another test", &read, true},
		{"the same test", &write, false},
		{"perftest (announces none)", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fc := roce.NewFakeClock(time.Unix(3_000_000, 0))
			p := newCtrlPair(t, fc, CMControlConfig{Test: &write}, CMControlConfig{Test: c.cli})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srvErr := make(chan error, 1)
			go func() { _, err := p.srv.Negotiate(ctx, 5); srvErr <- err }()
			_, cerr := p.cli.Negotiate(ctx, 5)
			serr := <-srvErr
			if !c.refused {
				require.NoError(t, cerr)
				require.NoError(t, serr)
				return
			}
			require.ErrorIs(t, cerr, oob.ErrRefused)
			require.ErrorContains(t, cerr, "version: the server runs ib_write_bw, we run ib_read_bw: refused; run the same test on both sides")
			require.ErrorIs(t, serr, oob.ErrRefused)
			require.ErrorContains(t, serr, "version: the client runs ib_read_bw, this server ib_write_bw: refused")
			// Said once (newcomer walk, session AI: "...: refused; run the
			// same test on both sides: refused by the server").
			for _, err := range []error{cerr, serr} {
				require.True(t, strings.HasSuffix(err.Error(), "refused; run the same test on both sides"), err.Error())
			}
		})
	}
}
