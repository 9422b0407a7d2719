package main

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// perftestWriteLatClient plays ib_write_lat's client against an rxed
// server: the perftest exchange, then run_iter_lat_write as perftest has
// it (the client polls the last byte of its receive half first, then
// writes its count into the server's buffer). It is not rxed (SRQN 0),
// so rxed treats it as a real perftest.
func perftestWriteLatClient(ctx context.Context, t *testing.T, addr, server, port string, size, iters int) error {
	dev, err := ib.OpenDevice(ib.Config{Addrs: []netip.Addr{netip.MustParseAddr(addr)}})
	require.NoError(t, err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	m, err := mr.MapAnonymous(2 * 4096)
	require.NoError(t, err)
	defer m.Close()
	buf := m.Bytes()
	region, err := pd.RegMR(buf, ib.AccessLocalWrite|ib.AccessRemoteWrite, mr.WithMapping(m))
	require.NoError(t, err)
	defer region.Dereg()
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: ib.AccessRemoteWrite},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))

	sess, err := oob.DialPerftest(ctx, server+":"+port, &oob.SessionConfig{})
	if err != nil {
		return err
	}
	neg, err := sess.Negotiate(ctx, int(ib.MTU1024))
	if err != nil {
		return err
	}
	gid := netip.MustParseAddr(addr)
	local := oob.Key{OutReads: 1, QPN: q.Num(), PSN: 0x123456, RKey: region.RKey(),
		VAddr: region.IOVA() + 4096, GID: gid.As16()} // perftest: buf + BUFF_SIZE
	test := oob.Test{Verb: oob.VerbWrite, Latency: true}
	remotes, err := sess.Connect(ctx, test, []oob.Key{local}, func(rem []oob.Key) error {
		rk := rem[0]
		av := ib.AddrVector{DGID: netip.AddrFrom16(rk.GID).Unmap(), PortNum: 1}
		if err := q.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU(neg.MTU), DestQPN: rk.QPN, RQPSN: ib.PSN(rk.PSN),
			MaxDestRdAtomic: 1, MinRNRTimer: 12, AV: av},
			ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer); err != nil {
			return err
		}
		return q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 0x123456, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic)
	})
	if err != nil {
		return err
	}
	rk := remotes[0]
	post, poll := buf[:size], buf[4096:4096+size]
	wcs := make([]ib.WC, 4)
	for n := 1; n <= iters; n++ {
		// Client: poll first (run_iter_lat_write skips the first poll
		// only on the server).
		deadline := time.Now().Add(5 * time.Second)
		for atomicLoadByte(poll, size-1) != byte(n) {
			if time.Now().After(deadline) {
				return fmt.Errorf("perftest client: message %d never arrived (last byte %d)", n, atomicLoadByte(poll, size-1))
			}
			time.Sleep(50 * time.Microsecond)
		}
		atomicStoreByte(post, size-1, byte(n))
		if err := q.PostSend(ib.SendWR{ID: uint64(n), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL:        []ib.SGE{{Addr: region.IOVA(), Length: uint32(size), LKey: region.LKey()}},
			RemoteAddr: rk.VAddr, RKey: rk.RKey}); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		k, err := cq.WaitPoll(wctx, wcs)
		cancel()
		if err != nil {
			return fmt.Errorf("perftest client: write %d: %v", n, err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != ib.WCSuccess {
				return fmt.Errorf("perftest client: write %d: %v", n, wc.Status)
			}
		}
	}
	return nil // ib_write_lat just closes (no final exchange)
}

// rxed perf write --lat as server against ib_write_lat's client: the
// server writes first. Before, both sides polled and no packet was ever
// sent (the interop run's "rxe→rxed write_lat: 0 packets, timeout").
//
// Regression test: was TestRegressWriteLatServerAgainstPerftestClient in regress_writelat_peer_test.go
// (added in commit a2f6dd1).
func TestWriteLatServerAgainstPerftestClient(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	const size, iters = 2, 30
	sout, _, sdone := startCmd("perf", "write", "--lat", "--addr", a, "-p", port, "-s", fmt.Sprint(size),
		"-n", fmt.Sprint(iters), "--timeout", "5s")
	sout.waitFor(t, "Waiting for client", 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cerr := perftestWriteLatClient(ctx, t, b, a, port, size, iters)
	srv := await(t, sdone, 30*time.Second)
	require.NoError(t, cerr)
	requireOK(t, "rxed server", srv)
	require.Regexp(t, latRow(size, iters), srv.stdout)
}
