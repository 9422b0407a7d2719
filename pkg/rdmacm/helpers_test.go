package rdmacm_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// host is one device with a PD, a CQ, a registered buffer and helpers to
// make QPs and move data.
type host struct {
	t   *testing.T
	dev *ib.Device
	pd  *ib.PD
	cq  *ib.CQ
	buf []byte
	mr  *ib.MR
	ip  netip.Addr
}

const hostBuf = 1 << 16

// memHosts opens one host per address on an in-memory network of their
// own (optionally lossy), closed at the end of the test.
func memHosts(t *testing.T, fault *transport.FaultConfig, addrs ...string) []*host {
	t.Helper()
	net := transport.NewMemNetwork()
	var hs []*host
	for i, s := range addrs {
		a := netip.MustParseAddr(s)
		c, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
		require.NoError(t, err)
		cfg := ib.Config{Conn: c}
		if fault != nil {
			f := *fault
			f.Seed += int64(i)
			cfg.Fault = &f
		}
		hs = append(hs, openHost(t, cfg, a))
	}
	return hs
}

// udpHosts opens one host per address on real UDP sockets over loopback,
// all on the same (ephemeral) port, as rxed peers assume.
func udpHosts(t *testing.T, addrs ...string) []*host {
	t.Helper()
	var hs []*host
	var port uint16
	for _, s := range addrs {
		a := netip.MustParseAddr(s)
		cfg := ib.Config{Addrs: []netip.Addr{a}, Port: port, EphemeralPort: port == 0}
		h := openHost(t, cfg, a)
		port = h.dev.UDPPort()
		hs = append(hs, h)
	}
	return hs
}

func openHost(t *testing.T, cfg ib.Config, ip netip.Addr) *host {
	t.Helper()
	dev, err := ib.OpenDevice(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(256)
	require.NoError(t, err)
	buf := make([]byte, hostBuf)
	mr, err := pd.RegMR(buf, ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessRemoteRead|ib.AccessRemoteAtomic)
	require.NoError(t, err)
	return &host{t: t, dev: dev, pd: pd, cq: cq, buf: buf, mr: mr, ip: ip}
}

func (h *host) qp(typ ib.QPType) *ib.QP {
	h.t.Helper()
	q, err := h.pd.CreateQP(ib.QPInitAttr{Type: typ, SendCQ: h.cq, RecvCQ: h.cq,
		Cap: ib.QPCap{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(h.t, err)
	return q
}

func (h *host) sge(off, n int) ib.SGE {
	return ib.SGE{Addr: h.mr.IOVA() + uint64(off), Length: uint32(n), LKey: h.mr.LKey()}
}

// wc waits for one completion.
func (h *host) wc(ctx context.Context) ib.WC {
	h.t.Helper()
	wcs := make([]ib.WC, 1)
	n, err := h.cq.WaitPoll(ctx, wcs)
	require.NoError(h.t, err)
	require.Equal(h.t, 1, n)
	return wcs[0]
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
