package ib_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// The examples run two devices in one process over an in-memory network
// (transport.NewMemNetwork), so they need no privileges and are
// deterministic. Over real UDP, OpenDevice takes Config.Addrs instead of
// Config.Conn and everything else is the same.

// peer is one side of an example: a device with a PD, a CQ and a 64 KiB
// buffer registered with every access right.
type peer struct {
	dev  *ib.Device
	pd   *ib.PD
	cq   *ib.CQ
	buf  []byte
	mr   *ib.MR
	addr netip.Addr
}

func openPeer(net *transport.MemNetwork, addr string) *peer {
	a := netip.MustParseAddr(addr)
	conn, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
	check(err)
	return openPeerOn(conn, a)
}

// openPeerOn is openPeer on a Conn of the caller's, bound to a.
func openPeerOn(conn transport.Conn, a netip.Addr) *peer {
	dev, err := ib.OpenDevice(ib.Config{Conn: conn, Workers: 1})
	check(err)
	p := &peer{dev: dev, addr: a, buf: make([]byte, 64<<10)}
	p.pd, err = dev.AllocPD()
	check(err)
	p.cq, err = dev.CreateCQ(64)
	check(err)
	p.mr, err = p.pd.RegMR(p.buf, ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessRemoteRead|ib.AccessRemoteAtomic)
	check(err)
	return p
}

// createQP creates a QP of type t whose send and receive completions go
// to the peer's CQ.
func (p *peer) createQP(t ib.QPType) *ib.QP {
	q, err := p.pd.CreateQP(ib.QPInitAttr{Type: t, SendCQ: p.cq, RecvCQ: p.cq,
		Cap: ib.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}})
	check(err)
	return q
}

// sge describes n bytes at offset off of the peer's registered buffer.
func (p *peer) sge(off, n int) ib.SGE {
	return ib.SGE{Addr: p.mr.IOVA() + uint64(off), Length: uint32(n), LKey: p.mr.LKey()}
}

// connectRC moves q (on p) through INIT and RTR to RTS towards rq (on
// r), with the attributes ibv_rc_pingpong exchanges out of band.
func connectRC(p *peer, q *ib.QP, r *peer, rq *ib.QP) {
	connectRCAccess(p, q, r, rq, remoteAll)
}

// remoteAll is every remote operation: what connectRC lets the peer do.
const remoteAll = ib.AccessRemoteWrite | ib.AccessRemoteRead | ib.AccessRemoteAtomic

// connectRCAccess is connectRC with the remote operations q accepts.
func connectRCAccess(p *peer, q *ib.QP, r *peer, rq *ib.QP, access ib.Access) {
	connectRCAccessPSN(p, q, r, rq, access, 100)
}

// connectRCAccessPSN is connectRCAccess with psn as the first PSN both
// ways. A test that connects the same two QPs again after an error gives
// each connection its own PSNs, as rdma_cm's random ones do: a request
// the last connection resent, still in flight, is then an old duplicate
// to the new one, not its next request.
func connectRCAccessPSN(p *peer, q *ib.QP, r *peer, rq *ib.QP, access ib.Access, psn uint32) {
	check(ib.ConnectQP(q, ib.RemoteQP{QPN: rq.Num(), PSN: psn, GID: r.addr, UDPPort: r.dev.UDPPort(), MTU: ib.MTU1024},
		ib.ConnectAttr{SGIDIndex: -1, PSN: psn, AccessFlags: access, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
			MinRNRTimer: 1, MaxRdAtomic: 4, MaxDestRdAtomic: 4}))
}

// rcPair opens two peers with one connected RC QP each.
func rcPair() (a *peer, qa *ib.QP, b *peer, qb *ib.QP) {
	net := transport.NewMemNetwork()
	a, b = openPeer(net, "10.0.0.1"), openPeer(net, "10.0.0.2")
	qa, qb = a.createQP(ib.RC), b.createQP(ib.RC)
	connectRC(a, qa, b, qb)
	connectRC(b, qb, a, qa)
	return a, qa, b, qb
}

func (p *peer) close() { p.dev.Close() }

// next blocks for the next completion on cq (ibv_poll_cq after waiting).
func next(cq *ib.CQ) ib.WC {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wc [1]ib.WC
	_, err := cq.WaitPoll(ctx, wc[:])
	check(err)
	return wc[0]
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

// Open a device and look at its attributes, port and GID table, like
// ibv_devinfo -v.
func ExampleOpenDevice() {
	net := transport.NewMemNetwork()
	conn, err := net.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
	check(err)
	dev, err := ib.OpenDevice(ib.Config{Conn: conn})
	check(err)
	defer dev.Close()

	attr := dev.QueryDevice()
	fmt.Println("device:", dev.Name())
	fmt.Println("max_qp_wr:", attr.MaxQPWR, "max_sge:", attr.MaxSGE, "max_cqe:", attr.MaxCQE)
	fmt.Println("max_qp_rd_atom:", attr.MaxQPRdAtom, "max_srq_wr:", attr.MaxSRQWR, "phys_port_cnt:", attr.PhysPortCnt)
	port, err := dev.QueryPort(1)
	check(err)
	fmt.Println("port 1:", port.LinkLayer, "active:", port.State == ib.PortActive, "mtu:", port.ActiveMTU, "udp:", port.UDPPort)
	gid, err := dev.QueryGID(1, 0)
	check(err)
	fmt.Println("gid[0]:", gid)
	ev := <-dev.Events()
	fmt.Println("event:", ev.Type, "port", ev.Port)
	// Output:
	// device: rxed0
	// max_qp_wr: 16384 max_sge: 32 max_cqe: 32767
	// max_qp_rd_atom: 128 max_srq_wr: 16384 phys_port_cnt: 1
	// port 1: Ethernet active: true mtu: 4096 udp: 4791
	// gid[0]: ::ffff:192.0.2.1
	// event: PORT_ACTIVE port 1
}

// RDMA WRITE into the peer's memory, then RDMA READ it back, on a
// reliable connection. Only the signalled READ generates a completion;
// its success implies the WRITE before it is done.
func ExampleQP_PostSend_rdmaWriteRead() {
	a, qa, b, _ := rcPair()
	defer a.close()
	defer b.close()
	// The peer's address and rkey travel out of band (a socket, a file).
	raddr, rkey := b.mr.IOVA(), b.mr.RKey()

	copy(a.buf, "hello, remote memory")
	check(qa.PostSend(
		ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{a.sge(0, 20)}, RemoteAddr: raddr + 4096, RKey: rkey},
		ib.SendWR{ID: 2, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(8192, 20)},
			RemoteAddr: raddr + 4096, RKey: rkey}))
	wc := next(a.cq)
	fmt.Println(wc.ID, wc.Status.String(), wc.Opcode)
	fmt.Printf("peer memory: %q\n", b.buf[4096:4116])
	fmt.Printf("read back:   %q\n", a.buf[8192:8212])
	// Output:
	// 2 SUCCESS RDMA_READ
	// peer memory: "hello, remote memory"
	// read back:   "hello, remote memory"
}

// SEND with immediate data consumes a receive the peer posted; the
// receive completion carries the length and the immediate value. Inline
// data is copied at post time, so the caller's slice is free at once.
func ExampleQP_PostRecv() {
	a, qa, b, qb := rcPair()
	defer a.close()
	defer b.close()

	check(qb.PostRecv(ib.RecvWR{ID: 7, SGL: []ib.SGE{b.sge(0, 256)}}))
	check(qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRSendWithImm, Flags: ib.SendSignaled | ib.SendInline,
		Inline: []byte("ping"), Imm: 0xC0FFEE}))

	swc := next(a.cq)
	fmt.Println("sender:", swc.ID, swc.Status.String(), swc.Opcode)
	rwc := next(b.cq)
	fmt.Printf("receiver: %d %v %v len=%d imm=%#x with_imm=%v\n", rwc.ID, rwc.Status.String(), rwc.Opcode,
		rwc.ByteLen, rwc.Imm, rwc.Flags&ib.WCWithImm != 0)
	fmt.Printf("data: %q\n", b.buf[:rwc.ByteLen])
	// Output:
	// sender: 1 SUCCESS SEND
	// receiver: 7 SUCCESS RECV len=4 imm=0xc0ffee with_imm=true
	// data: "ping"
}

// Atomic fetch-and-add and compare-and-swap on an 8-byte word in the
// peer's memory. The original value lands in the local SGE, in host byte
// order like rdma_rxe.
func ExampleQP_PostSend_atomics() {
	a, qa, b, _ := rcPair()
	defer a.close()
	defer b.close()
	binary.NativeEndian.PutUint64(b.buf[64:], 40)

	check(qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRAtomicFetchAndAdd, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.IOVA() + 64, RKey: b.mr.RKey(), CompareAdd: 2}))
	wc := next(a.cq)
	fmt.Println(wc.Opcode, wc.Status.String(), "orig", binary.NativeEndian.Uint64(a.buf[0:]))

	// Swap 42 for 1000 only if the word still holds 42.
	check(qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRAtomicCmpAndSwp, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(8, 8)}, RemoteAddr: b.mr.IOVA() + 64, RKey: b.mr.RKey(), CompareAdd: 42, Swap: 1000}))
	wc = next(a.cq)
	fmt.Println(wc.Opcode, wc.Status.String(), "orig", binary.NativeEndian.Uint64(a.buf[8:]))
	fmt.Println("peer word:", binary.NativeEndian.Uint64(b.buf[64:]))
	// Output:
	// FETCH_ADD SUCCESS orig 40
	// COMP_SWAP SUCCESS orig 42
	// peer word: 1000
}

// Unreliable datagram: each send names its destination with an address
// handle, the remote QPN and Q_Key. The receive buffer's first 40 bytes
// take the GRH (for IPv4, 20 zero bytes and the IP header).
func ExamplePD_CreateAH() {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.0.0.1"), openPeer(net, "10.0.0.2")
	defer a.close()
	defer b.close()
	const qkey = 0x11111111
	qa, qb := a.createQP(ib.UD), b.createQP(ib.UD)
	for _, q := range []*ib.QP{qa, qb} {
		check(q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: qkey},
			ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
		check(q.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
		check(q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 1}, ib.AttrState|ib.AttrSQPSN))
	}
	ah, err := a.pd.CreateAH(ib.AHAttr{DGID: b.addr, DestPort: b.dev.UDPPort(), PortNum: 1})
	check(err)
	defer ah.Destroy()

	check(qb.PostRecv(ib.RecvWR{ID: 9, SGL: []ib.SGE{b.sge(0, 40+512)}}))
	copy(a.buf, "datagram")
	wr := ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 8)}}
	ib.UDSend(&wr, ah, qb.Num(), qkey)
	check(qa.PostSend(wr))

	fmt.Println("sender:", next(a.cq).Status.String())
	rwc := next(b.cq)
	fmt.Printf("receiver: %v len=%d from_sender=%v grh=%v\n", rwc.Status.String(), rwc.ByteLen, rwc.SrcQP == qa.Num(), rwc.Flags&ib.WCWithGRH != 0)
	fmt.Printf("payload: %q\n", b.buf[40:rwc.ByteLen])
	// Output:
	// sender: SUCCESS
	// receiver: SUCCESS len=48 from_sender=true grh=true
	// payload: "datagram"
}

// A shared receive queue feeds several QPs; when it runs below its limit
// the device raises SRQ_LIMIT_REACHED once, so the application can refill.
func ExamplePD_CreateSRQ() {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.0.0.1"), openPeer(net, "10.0.0.2")
	defer a.close()
	defer b.close()
	<-b.dev.Events() // PORT_ACTIVE

	srq, err := b.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 8, MaxSGE: 1})
	check(err)
	for i := 0; i < 4; i++ {
		check(srq.PostRecv(ib.RecvWR{ID: uint64(100 + i), SGL: []ib.SGE{b.sge(1024*i, 1024)}}))
	}
	check(srq.ArmLimit(2))

	qa := a.createQP(ib.RC)
	qb, err := b.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	check(err)
	connectRC(a, qa, b, qb)
	connectRC(b, qb, a, qa)

	for i := 0; i < 3; i++ {
		check(qa.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRSend, SGL: []ib.SGE{a.sge(0, 10+i)}}))
		rwc := next(b.cq)
		fmt.Println("recv", rwc.ID, rwc.Status.String(), rwc.ByteLen, "left", srq.Len())
	}
	// qb's first request raised COMM_EST before that.
	ev := <-b.dev.Events()
	fmt.Println("event:", ev.Type, ev.QPN == qb.Num())
	ev = <-b.dev.Events()
	fmt.Println("event:", ev.Type, ev.SRQ == srq, "limit now", srq.Limit())
	// Output:
	// recv 100 SUCCESS 10 left 3
	// recv 101 SUCCESS 11 left 2
	// recv 102 SUCCESS 12 left 1
	// event: COMM_EST true
	// event: SRQ_LIMIT_REACHED true limit now 0
}

// Event-driven completion handling as with a completion channel: arm the
// CQ (ibv_req_notify_cq), wait for the notification (ibv_get_cq_event),
// re-arm, then drain it with Poll. Completions already queued when
// arming do not fire, which is why the consumer polls after re-arming.
func ExampleCQ_notification() {
	a, qa, b, qb := rcPair()
	defer a.close()
	defer b.close()

	check(b.cq.ReqNotify(false))
	check(qb.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{b.sge(0, 64)}}))
	check(qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("wake up")}))

	select {
	case <-b.cq.Notify():
	case <-time.After(20 * time.Second):
		panic("no completion event")
	}
	check(b.cq.ReqNotify(false))
	var wcs [8]ib.WC
	n := b.cq.Poll(wcs[:])
	fmt.Println("notified; polled", n, wcs[0].Opcode, wcs[0].Status.String(), "notifications:", b.cq.Notifications())

	// A blocking wait with a deadline, without notifications.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err := b.cq.WaitPoll(ctx, wcs[:])
	fmt.Println("empty CQ:", errors.Is(err, context.DeadlineExceeded))
	// Output:
	// notified; polled 1 RECV SUCCESS notifications: 1
	// empty CQ: true
}

// A type 2 memory window grants a peer access to a slice of a region,
// by a BIND_MW work request. The peer writes through the window's rkey,
// then invalidates it with SEND_WITH_INV; afterwards the rkey is refused.
func ExamplePD_AllocMW() {
	a, qa, b, qb := rcPair()
	defer a.close()
	defer b.close()

	region, err := b.pd.RegMR(b.buf[:16<<10], ib.AccessLocalWrite|ib.AccessMWBind)
	check(err)
	mw, err := b.pd.AllocMW(ib.MWType2)
	check(err)
	rkey := ib.IncRKey(mw.RKey())
	check(qb.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRBindMW, Flags: ib.SendSignaled,
		Bind: ib.MWBindInfo{MWRKey: mw.RKey(), NewRKey: rkey, MRLKey: region.LKey(),
			Addr: region.IOVA() + 4096, Length: 1024, Access: ib.AccessRemoteWrite}}))
	wc := next(b.cq)
	fmt.Println("bind:", wc.Opcode, wc.Status.String(), "bound:", mw.Bound())

	copy(a.buf, "via window")
	check(qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 10)}, RemoteAddr: region.IOVA() + 4096, RKey: rkey}))
	fmt.Println("write:", next(a.cq).Status.String(), fmt.Sprintf("%q", b.buf[4096:4106]))

	check(qb.PostRecv(ib.RecvWR{ID: 3, SGL: []ib.SGE{b.sge(32<<10, 64)}}))
	check(qa.PostSend(ib.SendWR{ID: 4, Opcode: ib.WRSendWithInv, Flags: ib.SendInline | ib.SendSignaled,
		Inline: []byte("done"), InvalidateRKey: rkey}))
	fmt.Println("send_with_inv:", next(a.cq).Status.String())
	rwc := next(b.cq)
	fmt.Println("recv:", rwc.Status.String(), "invalidated:", rwc.Flags&ib.WCWithInv != 0 && rwc.InvalidatedRKey == rkey,
		"bound:", mw.Bound())
	// Output:
	// bind: BIND_MW SUCCESS bound: true
	// write: SUCCESS "via window"
	// send_with_inv: SUCCESS
	// recv: SUCCESS invalidated: true bound: false
}

// A remote access error: writing with a key the peer never gave out
// completes with REM_ACCESS_ERR, leaves the peer's memory alone and
// moves the QP to ERR, which flushes the work requests behind it. The
// QP is recovered by moving it to RESET and connecting it again.
func ExampleWCStatus_remoteAccessError() {
	a, qa, b, qb := rcPair()
	defer a.close()
	defer b.close()

	copy(a.buf, "intruder")
	check(qa.PostSend(
		ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 8)},
			RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey() ^ 0x80},
		ib.SendWR{ID: 2, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 8)},
			RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}))
	for i := 0; i < 2; i++ {
		wc := next(a.cq)
		fmt.Printf("wr %d: %v (%s)\n", wc.ID, wc.Status.String(), wc.Status.Description())
	}
	fmt.Println("qp state:", qa.State(), "peer memory untouched:", b.buf[0] == 0)

	check(qa.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	check(qb.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	// The new connection starts from new PSNs, as rdma_cm's random ones
	// do: a request the old one resent, still on its way, is then an old
	// duplicate to it rather than its next request.
	connectRCAccessPSN(a, qa, b, qb, remoteAll, 0x10000)
	connectRCAccessPSN(b, qb, a, qa, remoteAll, 0x10000)
	check(qa.PostSend(ib.SendWR{ID: 3, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 8)},
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}))
	wc := next(a.cq)
	fmt.Printf("after reconnect: wr %d %v, peer memory %q\n", wc.ID, wc.Status.String(), b.buf[:8])
	// Output:
	// wr 1: REM_ACCESS_ERR (remote access error)
	// wr 2: WR_FLUSH_ERR (Work Request Flushed Error)
	// qp state: ERR peer memory untouched: true
	// after reconnect: wr 3 SUCCESS, peer memory "intruder"
}

// Fast registration: a region allocated without memory gets its memory
// (MapMR) and keys from a REG_MR work request on the send queue, and
// gives them up with LOCAL_INV. A peer holding the key is then refused.
func ExamplePD_AllocMR() {
	a, qa, b, qb := rcPair()
	defer a.close()
	defer b.close()

	fmr, err := b.pd.AllocMR(4096)
	check(err)
	check(b.pd.MapMR(fmr, b.buf[16<<10:20<<10]))
	key := ib.IncRKey(fmr.LKey())
	const iova = 0x10000
	check(qb.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRegMR, Flags: ib.SendSignaled,
		Reg: ib.RegMRInfo{MRLKey: fmr.LKey(), NewKey: key, IOVA: iova, Length: 4096,
			Access: ib.AccessLocalWrite | ib.AccessRemoteWrite}}))
	wc := next(b.cq)
	fmt.Println(wc.Opcode, wc.Status.String(), "new key in use:", fmr.RKey() == key)

	copy(a.buf, "fast")
	check(qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 4)}, RemoteAddr: iova + 8, RKey: key}))
	fmt.Printf("write: %v %q\n", next(a.cq).Status.String(), b.buf[16<<10+8:16<<10+12])

	check(qb.PostSend(ib.SendWR{ID: 3, Opcode: ib.WRLocalInv, Flags: ib.SendSignaled, InvalidateRKey: key}))
	wc = next(b.cq)
	fmt.Println(wc.Opcode, wc.Status.String())
	check(qa.PostSend(ib.SendWR{ID: 4, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 4)}, RemoteAddr: iova + 8, RKey: key}))
	fmt.Println("write after LOCAL_INV:", next(a.cq).Status.String())
	// Output:
	// REG_MR SUCCESS new key in use: true
	// write: SUCCESS "fast"
	// LOCAL_INV SUCCESS
	// write after LOCAL_INV: REM_ACCESS_ERR
}

// One completion channel serves several CQs: GetCQEvent says which CQ
// has news; the consumer re-arms that CQ and polls it empty.
func ExampleCompChannel() {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.0.0.1"), openPeer(net, "10.0.0.2")
	defer a.close()
	defer b.close()
	ch := b.dev.CreateCompChannel()
	cqs := make([]*ib.CQ, 2)
	qas := make([]*ib.QP, 2)
	for i := range cqs {
		var err error
		cqs[i], err = b.dev.CreateCQOnChannel(16, ch)
		check(err)
		check(cqs[i].ReqNotify(false))
		qb, err := b.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cqs[i], RecvCQ: cqs[i],
			Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		check(err)
		qas[i] = a.createQP(ib.RC)
		connectRC(a, qas[i], b, qb)
		connectRC(b, qb, a, qas[i])
		check(qb.PostRecv(ib.RecvWR{ID: uint64(10 + i), SGL: []ib.SGE{b.sge(64*i, 64)}}))
	}
	// A message for the second CQ first, then one for the first.
	for _, i := range []int{1, 0} {
		check(qas[i].PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("hi")}))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cq, err := ch.GetCQEvent(ctx)
		cancel()
		check(err)
		check(cq.ReqNotify(false))
		var wcs [4]ib.WC
		n := cq.Poll(wcs[:])
		fmt.Println("event from CQ", map[*ib.CQ]int{cqs[0]: 0, cqs[1]: 1}[cq], "polled", n, "wr", wcs[0].ID)
	}
	fmt.Println("destroy channel in use:", errors.Is(ch.Destroy(), ib.ErrBusy))
	// Output:
	// event from CQ 1 polled 1 wr 11
	// event from CQ 0 polled 1 wr 10
	// destroy channel in use: true
}
