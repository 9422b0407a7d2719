package oob_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/rxed/rxed/pkg/oob"
)

// The output of an ib_write_bw client, printed from the values it
// exchanged.
func Example_perftestOutput() {
	gid := netip.MustParseAddr("::ffff:10.77.0.12").As16()
	local := oob.Key{OutReads: 1, QPN: 0x1b, PSN: 0xaca162, RKey: 0xc08, VAddr: 0x55ef4ebd2000, GID: gid}
	remote := oob.Key{OutReads: 1, QPN: 0x1b, PSN: 0xe5ef62, RKey: 0xcc1, VAddr: 0x55a82c8ae000,
		GID: netip.MustParseAddr("::ffff:10.77.0.11").As16()}
	test := oob.Test{Verb: oob.VerbWrite}
	_ = oob.WriteTestInfo(os.Stdout, oob.TestInfo{Test: test, Device: "rxe0", NumQPs: 1, Connection: "RC",
		PCIeRelaxOrder: true, TxDepth: 10, CQMod: 10, MTU: 3, GIDIndex: 1})
	_ = oob.WriteAddress(os.Stdout, false, test.Verb, local, true)
	_ = oob.WriteAddress(os.Stdout, true, test.Verb, remote, true)
	_ = oob.WriteBWHeader(os.Stdout, false)
	_ = oob.WriteBWResult(os.Stdout, oob.BWReport{Size: 4096, Iters: 10, BWPeak: 4.7272, BWAvg: 4.7184, MsgRateAvg: 0.0012079}, nil, false)
	fmt.Print(oob.ResultLine)
	// Output:
	// ---------------------------------------------------------------------------------------
	//                     RDMA_Write BW Test
	//  Dual-port       : OFF		Device         : rxe0
	//  Number of qps   : 1		Transport type : IB
	//  Connection type : RC		Using SRQ      : OFF
	//  PCIe relax order: ON
	//  ibv_wr* API     : OFF
	//  TX depth        : 10
	//  CQ Moderation   : 10
	//  Mtu             : 1024[B]
	//  Link type       : Ethernet
	//  GID index       : 1
	//  Max inline data : 0[B]
	//  rdma_cm QPs	 : OFF
	//  Data ex. method : Ethernet
	// ---------------------------------------------------------------------------------------
	//  local address: LID 0000 QPN 0x001b PSN 0xaca162 RKey 0x000c08 VAddr 0x0055ef4ebd2000
	//  GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:12
	//  remote address: LID 0000 QPN 0x001b PSN 0xe5ef62 RKey 0x000cc1 VAddr 0x0055a82c8ae000
	//  GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:11
	// ---------------------------------------------------------------------------------------
	//  #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
	//  4096       10               4.73               4.72   		   0.001208
	// ---------------------------------------------------------------------------------------
}

// A perftest client run as `rxed perf write` would make it: the exchanges
// in perftest's order, with the QP work in the callback and between Connect
// and Finish.
func ExampleSession() {
	ctx := context.Background()
	ln, err := oob.ListenPerftest("127.0.0.1:0", nil) // a server: ":18515"
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	test := oob.Test{Verb: oob.VerbWrite}
	go func() { // the peer, as `ib_write_bw` without a server name would be
		s, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		_, _ = s.Negotiate(ctx, 3)
		k := oob.Key{OutReads: 1, QPN: 0x12, PSN: 0x345678, RKey: 0x99, VAddr: 0x7f0000001000}
		_, _ = s.Connect(ctx, test, []oob.Key{k}, nil)
		_, _ = s.Finish(ctx, test, k, oob.BWReport{}) // idles until the client is done
	}()

	s, err := oob.DialPerftest(ctx, ln.Addr().String(), &oob.SessionConfig{Options: oob.Options{Timeout: 5 * time.Second}})
	if err != nil {
		panic(err)
	}
	n, err := s.Negotiate(ctx, 5) // our port's active MTU: 4096
	if err != nil {
		panic(err)
	}
	local := oob.Key{OutReads: 1, QPN: 0x11, PSN: 0xabcdef, RKey: 0x42, VAddr: 0x7f0000002000}
	remotes, err := s.Connect(ctx, test, []oob.Key{local}, func(r []oob.Key) error {
		// modify the QP to RTR (dest QPN r[0].QPN, rq_psn r[0].PSN, path MTU
		// n.MTU) and RTS (sq_psn local.PSN) here
		return nil
	})
	if err != nil {
		panic(err)
	}
	// ... post RDMA WRITEs to remotes[0].VAddr with remotes[0].RKey ...
	_, err = s.Finish(ctx, test, local, oob.BWReport{Size: 65536, Iters: 1000, BWAvg: 100})
	fmt.Println(n.MTU, remotes[0].QPN == 0x12, err)
	// Output: 3 true <nil>
}
