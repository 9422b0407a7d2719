package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// TestGrantedClientIsNotHeldToTheAmplificationBound: an rxed client whose
// GID is not its TCP address proves it and is granted the export; from
// the moment the grant is sent, what the daemon sends the client's QP is
// bounded by the session's budget (none here), not by the
// anti-amplification bound of an unproved address. Bug (found by the
// newcomer audit, session AG: `rxed perf read --validate` against `rxed
// serve` on one host dropped all 100 READ responses once,
// rxed_budget_drops_total 100, 5.66 MB/s instead of about 200): the
// bound was lifted only after the grant was written, so a client that
// posted its READs at once had their responses dropped and waited out a
// retransmission timeout.
func TestGrantedClientIsNotHeldToTheAmplificationBound(t *testing.T) {
	const srvAddr, cliAddr = "127.0.3.243", "127.0.3.244"
	logs := newLogWatch()
	d, err := New(Config{Addrs: addrs(t, srvAddr), OOBAddr: srvAddr + ":0", IdleTimeout: -1,
		Logger: slog.New(logs), Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 20}}})
	require.NoError(t, err)
	// The hook runs once the grant is on its way to the client: a READ
	// response to the client's QP must then leave.
	granted := make(chan bool, 1)
	var clientQPN uint32
	d.afterGrant = func() {
		hdr := make([]byte, wire.BTHLen)
		wire.BTH(hdr).SetDestQP(clientQPN)
		granted <- d.traffic.allowTx(hdr, 4096+wire.BTHLen+wire.AETHLen+4, netip.MustParseAddr(cliAddr))
	}
	runDaemon(t, d)

	dev, err := ib.OpenDevice(ib.Config{Addrs: addrs(t, cliAddr)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	// Memory outside the Go heap, as perf's: the engine writes the nonce
	// into it with no Go synchronisation the race detector could follow.
	mapm, err := mr.MapAnonymous(4096)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mapm.Close() })
	buf := mapm.Bytes()
	region, err := pd.RegMR(buf, ib.AccessLocalWrite|ib.AccessRemoteWrite, mr.WithMapping(mapm))
	require.NoError(t, err)
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	qp, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	clientQPN = qp.Num()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The exchange comes from 127.0.0.1, the GID is cliAddr: a proof is needed.
	dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	c, err := dl.DialContext(ctx, "tcp", d.OOBAddr().String())
	require.NoError(t, err)
	test := oob.Test{Verb: oob.VerbRead}
	s := oob.NewSession(c, oob.Client, &oob.SessionConfig{Options: oob.Options{Timeout: 10 * time.Second},
		Ext: &oob.ExtConfig{Test: &test}})
	t.Cleanup(func() { _ = s.CloseWithoutExchange() })
	_, err = s.Negotiate(ctx, 3)
	require.NoError(t, err)
	require.True(t, s.Ext(), "the daemon speaks the rxed extension")
	const psn = 0x123
	local := oob.Key{OutReads: 1, QPN: qp.Num(), PSN: psn, RKey: region.RKey(), VAddr: region.IOVA(), GID: netip.MustParseAddr(cliAddr).As16()}
	_, err = s.Connect(ctx, test, []oob.Key{local}, func(remotes []oob.Key) error {
		rk := remotes[0]
		return ib.ConnectQP(qp, ib.RemoteQP{QPN: rk.QPN, PSN: rk.PSN, GID: netip.AddrFrom16(rk.GID).Unmap()},
			ib.ConnectAttr{PSN: psn, AccessFlags: ib.AccessRemoteWrite, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
				MaxRdAtomic: 1, MaxDestRdAtomic: 1})
	})
	require.NoError(t, err)
	// The daemon's nonce is in buf once its WRITE was ACKed, which the
	// last barrier's answer waited for.
	var nonce [16]byte
	copy(nonce[:], buf)
	g, err := s.ProveAddress(ctx, nonce)
	require.NoError(t, err, "the address proof")
	require.NotZero(t, g.RKey)
	select {
	case ok := <-granted:
		require.True(t, ok, "a READ response to the granted client was dropped: the anti-amplification bound outlived the grant")
	case <-ctx.Done():
		t.Fatal("the daemon never ran its grant hook")
	}
	require.Zero(t, d.traffic.budgetDrops.Load())
}
