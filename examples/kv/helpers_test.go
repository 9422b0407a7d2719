package kv

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// rig is a table served over RDMA (two devices on an in-memory network)
// and over TCP (loopback), closed at the end of the test.
type rig struct {
	t       *testing.T
	app     *App
	srvDev  *ib.Device
	cliDev  *ib.Device
	rdma    *RDMAServer
	tcp     *TCPServer
	cmAddr  netip.AddrPort
	tcpAddr string
	net     *transport.MemNetwork
}

var testTable = TableConfig{NBuckets: 256, ExtentSize: 512, MaxProbe: 16}

func openDev(t *testing.T, n *transport.MemNetwork, addr string) *ib.Device {
	return openDevWith(t, n, addr, ib.Config{})
}

// openDevWith is openDev with cfg (its Conn is set here).
func openDevWith(t *testing.T, n *transport.MemNetwork, addr string, cfg ib.Config) *ib.Device {
	t.Helper()
	c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.RoCEv2Port))
	require.NoError(t, err)
	cfg.Conn = c
	dev, err := ib.OpenDevice(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	return dev
}

func newRig(t *testing.T) *rig { return newRigWith(t, func(*App) {}) }

// newRigWith is newRig with setup run on the App before it is served.
func newRigWith(t *testing.T, setup func(*App)) *rig {
	t.Helper()
	tab, err := NewTable(testTable)
	require.NoError(t, err)
	n := transport.NewMemNetwork()
	r := &rig{t: t, app: NewApp(tab), cmAddr: netip.MustParseAddrPort("10.0.0.1:7471"), net: n}
	setup(r.app)
	r.srvDev = openDev(t, n, "10.0.0.1")
	r.cliDev = openDev(t, n, "10.0.0.2")
	r.rdma, err = ServeRDMA(r.app, r.srvDev, r.cmAddr, nil)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r.tcp = ServeTCP(r.app, ln)
	r.tcpAddr = ln.Addr().String()
	t.Cleanup(func() {
		_ = r.tcp.Close()
		_ = r.rdma.Close()
		_ = r.srvDev.Close() // the engine stops touching the table before it is unmapped
		_ = tab.Close()
	})
	return r
}

func (r *rig) rdmaClient() *RDMAClient {
	r.t.Helper()
	c, err := DialRDMA(ctxT(r.t), r.cliDev, r.cmAddr, nil)
	require.NoError(r.t, err)
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (r *rig) tcpClient() *TCPClient {
	r.t.Helper()
	c, err := DialTCP(ctxT(r.t), r.tcpAddr)
	require.NoError(r.t, err)
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// listenAgain listens on the address a closed listener had.
func listenAgain(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "listening on %s again", addr)
	return ln
}
