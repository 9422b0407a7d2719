package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestRDMACMServesIPv6Clients: a perftest -R client whose address is
// IPv6 (its rdma_cm header version 6) gets a session that completes, as
// an IPv4 one does. Bug (found by the rdma_cm header audit, session AH):
// the daemon listened on 0.0.0.0, which takes version 4 headers only
// (cma_match_private_data), so every IPv6 client got REJ 28 although
// docs/tools.md promised every address of the engine.
func TestRDMACMServesIPv6Clients(t *testing.T) {
	n := transport.NewMemNetwork()
	srv, cli := netip.MustParseAddr("fd00:3::1"), netip.MustParseAddr("fd00:3::2")
	sc, err := n.Listen(netip.AddrPortFrom(srv, transport.RoCEv2Port))
	require.NoError(t, err)
	logs := newLogWatch()
	d, err := New(Config{Addrs: []netip.Addr{srv}, Conn: sc, RDMACMPort: DefaultRDMACMPort, IdleTimeout: -1,
		HandshakeTimeout: 20 * time.Second, Logger: slog.New(logs),
		Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 20}}})
	require.NoError(t, err)
	runDaemon(t, d)
	cc, err := n.Listen(netip.AddrPortFrom(cli, transport.RoCEv2Port))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: cc})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	require.NoError(t, rdmacm.Enable(dev, nil))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newCMTestClient(t, dev, netip.AddrPortFrom(srv, DefaultRDMACMPort))
	require.NoError(t, c.connect(ctx))
	_, err = c.ctrl.HandShake(ctx, oob.Key{}, true)
	require.NoError(t, err)
	require.NoError(t, c.dialTestQPs(ctx, 2))
	require.NoError(t, c.finish(ctx))
	c.close()
	logs.waitFor(t, "perftest rdma_cm session complete", 1)
	require.Equal(t, uint64(1), d.completed.Load())
}
