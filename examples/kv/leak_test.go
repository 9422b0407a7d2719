package kv

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// A server and its clients closed with calls cancelled, connections
// open and a server-side connection failed leave no goroutine behind,
// over RDMA and TCP.
func TestServersAndClientsLeaveNoGoroutines(t *testing.T) {
	leaks := testenv.SnapshotGoroutines(testenv.StackPackages("github.com/rxed/rxed/examples/kv")...)
	func() {
		tab, err := NewTable(testTable)
		require.NoError(t, err)
		defer tab.Close()
		n := transport.NewMemNetwork()
		open := func(a string) *ib.Device {
			c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(a), transport.RoCEv2Port))
			require.NoError(t, err)
			d, err := ib.OpenDevice(ib.Config{Conn: c})
			require.NoError(t, err)
			return d
		}
		srvDev, cliDev := open("10.0.0.1"), open("10.0.0.2")
		defer srvDev.Close()
		defer cliDev.Close()
		app := NewApp(tab)
		cm := netip.MustParseAddrPort("10.0.0.1:7471")
		srv, err := ServeRDMA(app, srvDev, cm, &RDMAServerConfig{KeepAlive: 10 * time.Millisecond})
		require.NoError(t, err)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		tsrv := ServeTCP(app, ln)
		ctx := ctxT(t)

		var cs []Client
		for range 3 {
			c, err := DialRDMA(ctx, cliDev, cm, nil)
			require.NoError(t, err)
			cs = append(cs, c)
			tc, err := DialTCP(ctx, ln.Addr().String())
			require.NoError(t, err)
			cs = append(cs, tc)
		}
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		for i, c := range cs {
			require.NoError(t, c.Put(ctx, []byte("k"), []byte("v")))
			if i < 2 {
				// The RDMA client may find its READ done before it looks at
				// ctx; the TCP client's write fails first.
				if _, err := c.Get(cancelled, []byte("k")); err != nil {
					require.ErrorIs(t, err, context.Canceled)
				}
			}
		}
		// A garbage-length SEND fails one RDMA connection server-side.
		_, err = sendRaw(ctx, cs[2].(*RDMAClient), make([]byte, srv.maxMsg()+1))
		require.ErrorIs(t, err, ErrConnLost)
		require.NoError(t, srv.Close())
		require.NoError(t, tsrv.Close())
		for _, c := range cs {
			_ = c.Close()
		}
	}()
	leaks.CheckNoneLeft(t)
}
