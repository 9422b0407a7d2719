package main

import (
	"context"
	"time"

	"github.com/rxed/rxed/pkg/rdmacm"
)

// endPerfConns ends a perf -R run's connections so that the client is the
// active side of every DREQ, as perftest's client is of its test
// connections (../shared/pcaps: rdmacm_*_R.pcap, the client's DREQ comes
// first): the client disconnects its test connections, then the control
// one, each Disconnect returning on the server's DREP; the server waits,
// up to bound, for the client's DREQ on every connection, the control one
// included, and disconnects only what is still up after that.
//
// Why the server waits for the control DREQ too: rxed's CM ends with its
// process, so a device close lingers (cmLinger) for a connection that
// answered the peer's DREQ, through its timewait, in which a peer whose
// DREP got lost retries; the active side, once its DREP came, owes
// nothing and closes at once. A server that disconnected the control
// connection as soon as the test ones were gone crossed the client's
// DREQ (or beat it): the client answered a DREQ and every run's client
// exited a timewait (2 s) late. Now the server is the side that lingers,
// which it did already for the test connections.
func endPerfConns(server bool, tests []*rdmacm.Conn, ctrl *rdmacm.Conn, bound time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	all := tests
	if ctrl != nil {
		all = append(all[:len(all):len(all)], ctrl)
	}
	if server {
		for _, c := range all {
			select {
			case <-c.Done():
			case <-ctx.Done():
			}
		}
	}
	for _, c := range all {
		_ = c.Disconnect(ctx)
	}
}
