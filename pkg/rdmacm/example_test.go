package rdmacm_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// device opens a device on an in-memory network (a real program passes
// ib.Config{Addrs: ...} and talks UDP to rdma_rxe peers instead).
func device(net *transport.MemNetwork, addr string) *ib.Device {
	c, err := net.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.RoCEv2Port))
	if err != nil {
		panic(err)
	}
	dev, err := ib.OpenDevice(ib.Config{Conn: c})
	if err != nil {
		panic(err)
	}
	return dev
}

// rcQP makes an RC QP with its own CQ, in INIT so that receives can be
// posted before the connection exists (where rdma_create_qp leaves it).
func rcQP(dev *ib.Device) (*ib.QP, *ib.CQ, *ib.PD) {
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		panic(err)
	}
	if err := ib.InitQP(q, ib.ConnectAttr{}); err != nil {
		panic(err)
	}
	return q, cq, pd
}

// A server listens on an IP address and port, accepts a connection and
// receives a SEND; a client dials it, both through the IB CM on QP 1 the
// way librdmacm does (rping, ucmatose and NVMe-oF connect the same way).
func Example() {
	net := transport.NewMemNetwork()
	srvDev, cliDev := device(net, "10.0.0.1"), device(net, "10.0.0.2")
	defer srvDev.Close()
	defer cliDev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	l, err := rdmacm.Listen(srvDev, netip.MustParseAddrPort("10.0.0.1:7471"), nil)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	got := make(chan string, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Printf("request from %v\n", req.Remote.Addr())
		q, cq, pd := rcQP(srvDev)
		buf := make([]byte, 64)
		mr, _ := pd.RegMR(buf, ib.AccessLocalWrite)
		_ = q.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.LKey()}}})
		if _, err := req.Accept(ctx, q, &rdmacm.ConnParam{PrivateData: []byte("welcome")}); err != nil {
			panic(err)
		}
		wcs := make([]ib.WC, 1)
		if _, err := cq.WaitPoll(ctx, wcs); err != nil {
			panic(err)
		}
		got <- string(buf[:wcs[0].ByteLen])
	}()

	q, cq, pd := rcQP(cliDev)
	conn, err := rdmacm.Dial(ctx, q, netip.MustParseAddrPort("10.0.0.1:7471"), &rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7})
	if err != nil {
		panic(err)
	}
	fmt.Printf("connected, QP in %v, server said %q\n", conn.QP().State(), string(conn.PrivateData()[:7]))
	msg := []byte("hello over rdma_cm")
	mr, _ := pd.RegMR(msg, 0)
	_ = q.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: mr.IOVA(), Length: uint32(len(msg)), LKey: mr.LKey()}}})
	wcs := make([]ib.WC, 1)
	_, _ = cq.WaitPoll(ctx, wcs)
	fmt.Println("server received:", <-got)
	_ = conn.Disconnect(ctx)

	// Nobody listens on another port: the CM rejects with reason 8.
	q2, _, _ := rcQP(cliDev)
	_, err = rdmacm.Dial(ctx, q2, netip.MustParseAddrPort("10.0.0.1:7472"), nil)
	var rej *rdmacm.RejectError
	fmt.Println(errors.As(err, &rej), rej.Reason)
	// Output:
	// request from 10.0.0.2
	// connected, QP in RTS, server said "welcome"
	// server received: hello over rdma_cm
	// true invalid service ID
}
