package rdmacm_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/stretchr/testify/require"
)

// TestCountersReflectAConnection: each side's CM counters show the
// messages of a connection's handshake and disconnection (REQ, REP, RTU,
// DREQ, DREP, each sent by one side and received by the other), and a REQ
// for a port nobody listens on shows as the REJ it got. Counts are at
// least one rather than exactly one: a retransmission on a loaded machine
// counts again.
func TestCountersReflectAConnection(t *testing.T) {
	hs := memHosts(t, nil, "10.12.0.1", "10.12.0.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	require.Nil(t, rdmacm.Counters(srv.dev), "no connection manager before the first Listen")

	laddr := ap("10.12.0.1:7174")
	l, err := rdmacm.Listen(srv.dev, laddr, nil)
	require.NoError(t, err)
	defer l.Close()
	before := rdmacm.Counters(srv.dev)
	require.NotNil(t, before, "Listen starts the connection manager")
	require.Zero(t, before["rx_req"])
	require.Zero(t, before["tx_rep"])

	got := serveOne(ctx, srv, l, nil)
	c, err := rdmacm.Dial(ctx, cli.qp(ib.RC), laddr, nil)
	require.NoError(t, err)
	s := <-got
	require.NoError(t, s.err)
	require.NoError(t, c.Disconnect(ctx))

	// Each counter is incremented before its MAD is handed to QP 1, so
	// what one side has received the other has already counted.
	sc, cc := rdmacm.Counters(srv.dev), rdmacm.Counters(cli.dev)
	for _, name := range []string{"rx_req", "tx_rep", "rx_rtu", "rx_dreq", "tx_drep"} {
		require.GreaterOrEqual(t, sc[name], uint64(1), "server %s: %v", name, sc)
	}
	for _, name := range []string{"tx_req", "rx_rep", "tx_rtu", "tx_dreq", "rx_drep"} {
		require.GreaterOrEqual(t, cc[name], uint64(1), "client %s: %v", name, cc)
	}
	require.Zero(t, sc["tx_req"], "the server sent no REQ")
	require.Zero(t, cc["rx_req"], "the client received no REQ")
	require.Zero(t, sc["rx_malformed"])

	// The snapshot is the caller's: changing it changes nothing.
	sc["rx_req"] = 1 << 40
	require.Less(t, rdmacm.Counters(srv.dev)["rx_req"], uint64(1<<40))

	// A REQ for a port nobody listens on: REJ 8, counted as such.
	rejBefore := rdmacm.Counters(srv.dev)["rej_invalid_service_id"]
	_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.12.0.1:7175"), nil)
	var rej *rdmacm.RejectError
	require.ErrorAs(t, err, &rej)
	sc = rdmacm.Counters(srv.dev)
	require.GreaterOrEqual(t, sc["rej_invalid_service_id"], rejBefore+1)
	require.GreaterOrEqual(t, sc["tx_rej"], uint64(1))
	require.GreaterOrEqual(t, rdmacm.Counters(cli.dev)["rx_rej"], uint64(1))
}

// TestCountersWithoutAgent: a device whose connection manager never ran,
// or has stopped with the device, and a nil device have no counters; and
// asking does not start the manager.
func TestCountersWithoutAgent(t *testing.T) {
	require.Nil(t, rdmacm.Counters(nil))

	hs := memHosts(t, nil, "10.12.1.1", "10.12.1.2")
	idle, used := hs[0], hs[1]
	require.Nil(t, rdmacm.Counters(idle.dev))
	require.Nil(t, rdmacm.Counters(idle.dev), "Counters started a connection manager")

	require.NoError(t, rdmacm.Enable(used.dev, nil))
	require.NotNil(t, rdmacm.Counters(used.dev))
	require.NoError(t, used.dev.Close())
	require.Nil(t, rdmacm.Counters(used.dev), "the manager stops with its device")
}
