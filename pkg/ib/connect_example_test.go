package ib_test

import (
	"context"
	"fmt"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// ConnectQP is what every out-of-band exchange ends with: each side tells
// the other its QP number, first PSN and GID (here by assignment; ibv_*
// pingpong and perftest use TCP, rdma_cm uses the CM: pkg/rdmacm), and
// moves its QP to RTS against that description. A wrong PSN here is the
// classic way to lose data silently, so the PSN a side sends from (its
// ConnectAttr.PSN) must be the one the other side expects (RemoteQP.PSN).
func ExampleConnectQP() {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.0.0.1"), openPeer(net, "10.0.0.2")
	defer a.dev.Close()
	defer b.dev.Close()
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
	const psnA, psnB = 0x123456, 0xabcdef
	rc := ib.ConnectAttr{SGIDIndex: -1, AccessFlags: ib.AccessRemoteWrite | ib.AccessRemoteRead,
		Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: 1, MaxDestRdAtomic: 1}
	ra, rb := rc, rc
	ra.PSN, rb.PSN = psnA, psnB
	check(ib.ConnectQP(qa, ib.RemoteQP{QPN: qb.Num(), PSN: psnB, GID: b.addr}, ra))
	check(ib.ConnectQP(qb, ib.RemoteQP{QPN: qa.Num(), PSN: psnA, GID: a.addr}, rb))

	copy(a.buf, "written by A")
	check(qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 12)}, RemoteAddr: b.mr.IOVA() + 100, RKey: b.mr.RKey()}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wcs := make([]ib.WC, 1)
	_, err := a.cq.WaitPoll(ctx, wcs)
	check(err)
	fmt.Println(qa.State(), qb.State(), wcs[0].Status, string(b.buf[100:112]))
	// Output: RTS RTS SUCCESS written by A
}
