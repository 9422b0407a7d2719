package main

import (
	"context"
	"time"

	"github.com/rxed/rxed/pkg/ib"
)

// nextCompletions returns cq's next completions, failing after timeout.
// By default it spins on Poll, as ibv_*_pingpong and perftest do: the
// engine then receives in this goroutine (ib.CQ.Poll), which is what a
// latency run measures. With events it sleeps until the engine's receive
// goroutine delivers them (the tools' -e).
func nextCompletions(ctx context.Context, cq *ib.CQ, wcs []ib.WC, events bool, timeout time.Duration) (int, error) {
	if n := cq.Poll(wcs); n > 0 {
		return n, nil
	}
	if events {
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return cq.WaitPoll(wctx, wcs)
	}
	deadline := time.Now().Add(timeout)
	for spins := 1; ; spins++ {
		if n := cq.Poll(wcs); n > 0 {
			return n, nil
		}
		if spins&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if time.Now().After(deadline) {
				return 0, context.DeadlineExceeded
			}
		}
	}
}
