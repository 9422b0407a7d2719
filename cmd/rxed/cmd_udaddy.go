package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"

	"github.com/rxed/rxed/pkg/ib"
)

func init() {
	register(&command{
		name:    "udaddy",
		summary: "rdma_cm UD service resolution (SIDR) and UD SENDs each way like librdmacm's udaddy (server, or -s ADDR client)",
		run:     runUdaddy,
	})
}

// udaddy's port: rping's, in the UDP port space.
const udaddyPort = 7174

// grhLen is sizeof(struct ibv_grh): what a UD receive gets in front of
// the payload.
const grhLen = 40

func runUdaddy(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseCma("udaddy", "udaddy", udaddyPort, args, stderr)
	if !ok {
		return code
	}
	if o.count > 0 && o.size > ib.MTU4096.Bytes() {
		// verify_test_params: a UD message is one packet.
		fmt.Fprintf(stderr, "rxed udaddy: -S %d: message_size %d is larger than active mtu %d\n", o.size, o.size, ib.MTU4096.Bytes())
		return 2
	}
	return runCmaTool(o, stdout, stderr, udaddy)
}

// udNode is one udaddy "connection": a UD QP, its CQ, its buffers, and
// where replies go (struct cmatest_node). udaddy points every receive and
// its sends at one buffer; rxed gives each receive its own slot of
// size+40 bytes and the sends one more, so that reading a GRH never
// races with the engine writing the next message.
type udNode struct {
	id       int
	qp       *ib.QP
	cq       *ib.CQ
	mem      []byte // count receive slots, then the send slot
	slot     int    // size + 40
	mr       *ib.MR
	ah       *ib.AH
	remoteQP uint32
	qkey     uint32
}

// newUDNode is init_node and post_recvs: a UD QP in RTS with rdma_cm's
// Q_Key and count receives of size+40 bytes posted.
func newUDNode(o *cmaOpts, pd *ib.PD, dev *ib.Device, id int) (_ *udNode, err error) {
	n := &udNode{id: id}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	depth := max(o.count, 1)
	if n.cq, err = dev.CreateCQ(2 * depth); err != nil {
		return nil, err
	}
	n.qp, err = pd.CreateQP(ib.QPInitAttr{Type: ib.UD, SendCQ: n.cq, RecvCQ: n.cq,
		Cap: ib.QPCap{MaxSendWR: uint32(depth), MaxRecvWR: uint32(depth), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("unable to create QP: %v", err)
	}
	if err := readyUDQP(n.qp); err != nil {
		return nil, err
	}
	if o.count == 0 {
		return n, nil
	}
	n.slot = o.size + grhLen
	n.mem = make([]byte, (o.count+1)*n.slot)
	if n.mr, err = pd.RegMR(n.mem, ib.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("failed to reg MR: %v", err)
	}
	for i := range o.count {
		wr := ib.RecvWR{ID: uint64(i), SGL: []ib.SGE{{Addr: n.mr.IOVA() + uint64(i*n.slot), Length: uint32(n.slot), LKey: n.mr.LKey()}}}
		if err := n.qp.PostRecv(wr); err != nil {
			return nil, fmt.Errorf("failed to post receives: %v", err)
		}
	}
	return n, nil
}

func (n *udNode) close() {
	if n.qp != nil {
		_ = n.qp.Destroy()
	}
	if n.mr != nil {
		_ = n.mr.Dereg()
	}
	if n.cq != nil {
		_ = n.cq.Destroy()
	}
}

// postSends is udaddy's post_sends: count SEND_WITH_IMMs carrying our QPN
// (the server answers to it), signaled only on the server.
func (n *udNode) postSends(o *cmaOpts, signaled bool) error {
	if o.count == 0 {
		return nil
	}
	send := uint64(o.count*n.slot + grhLen)
	wr := ib.SendWR{ID: uint64(n.id), Opcode: ib.WRSendWithImm, Imm: n.qp.Num(),
		SGL: []ib.SGE{{Addr: n.mr.IOVA() + send, Length: uint32(o.size), LKey: n.mr.LKey()}}}
	if signaled {
		wr.Flags = ib.SendSignaled
	}
	ib.UDSend(&wr, n.ah, n.remoteQP, n.qkey)
	for range o.count {
		if err := n.qp.PostSend(wr); err != nil {
			return fmt.Errorf("connection %d: failed to post sends: %v", n.id, err)
		}
	}
	return nil
}

// replyAH is create_reply_ah: the address handle from the first
// received GRH (ibv_create_ah_from_wc), the peer's QPN from the
// immediate data, and our own Q_Key (both sides use rdma_cm's). The
// handle takes the GRH's traffic class, as ibv_init_ah_from_wc does, so
// replies carry the TOS the client's -t gave its datagrams; its hop
// limit is the route's (the kernel's ib_resolve_eth_dmac replaces the
// GRH's), as udAV's.
func (n *udNode) replyAH(pd *ib.PD, dev *ib.Device, local netip.Addr, wc ib.WC) error {
	off := int(wc.ID) * n.slot
	src, tclass, ok := grhSource(n.mem[off : off+grhLen])
	if !ok {
		return fmt.Errorf("connection %d: the first message has no IPv4/IPv6 GRH", n.id)
	}
	if wc.Flags&ib.WCWithImm == 0 {
		return fmt.Errorf("connection %d: the first message has no immediate data (the sender's QPN)", n.id)
	}
	av := udAV(dev, local, src)
	av.TrafficClass = tclass
	ah, err := pd.CreateAH(av)
	if err != nil {
		return fmt.Errorf("connection %d: failure creating address handle: %v", n.id, err)
	}
	n.ah, n.remoteQP, n.qkey = ah, wc.Imm, rdmaUDPQKey
	return nil
}

// Offsets into a received GRH (struct ibv_grh), which rxe fills with the
// packet's IP header: an IPv6 header, or for IPv4 20 zero bytes and then
// the IPv4 header.
const (
	grhV6TClassFlow = 0  // version (4 bits), traffic class (8), flow label (20)
	grhV6SGID       = 8  // the source address
	grhV4Header     = 20 // where the IPv4 header starts
	grhV4TOS        = grhV4Header + 1
	grhV4Src        = grhV4Header + 12
)

// grhSource reads the sender's address and the packet's traffic class
// (IPv4 TOS) out of a received GRH.
func grhSource(grh []byte) (netip.Addr, uint8, bool) {
	switch {
	case grh[grhV6TClassFlow]>>4 == 6:
		tclass := uint8(binary.BigEndian.Uint32(grh[grhV6TClassFlow:]) >> 20)
		return netip.AddrFrom16([16]byte(grh[grhV6SGID : grhV6SGID+16])).Unmap(), tclass, true
	case grh[grhV4Header]>>4 == 4:
		return netip.AddrFrom4([4]byte(grh[grhV4Src : grhV4Src+4])), grh[grhV4TOS], true
	}
	return netip.Addr{}, 0, false
}

// udAV is the path from local to the peer's GID on this engine's UDP port.
func udAV(dev *ib.Device, local, peer netip.Addr) ib.AddrVector {
	return ib.AddrVector{DGID: peer, SGIDIndex: uint8(max(dev.GIDIndex(local), 0)), PortNum: 1, DestPort: dev.UDPPort()}
}

// pollUD is udaddy's poll_cqs: count completions on every node's CQ; the
// first receive of a node without a reply address sets it up.
func pollUD(ctx context.Context, o *cmaOpts, pd *ib.PD, dev *ib.Device, local netip.Addr, nodes []*udNode, what string) error {
	for _, n := range nodes {
		var ahErr error
		err := pollN(ctx, n.cq, o.count, o.size+grhLen, o.ef.timeout, fmt.Sprintf("connection %d %s", n.id, what), func(wc ib.WC) {
			if n.ah == nil && wc.Opcode == ib.WCRecv && ahErr == nil {
				ahErr = n.replyAH(pd, dev, local, wc)
			}
		})
		if err != nil {
			return err
		}
		if ahErr != nil {
			return ahErr
		}
	}
	return nil
}

func udaddy(ctx context.Context, o *cmaOpts, dev *ib.Device, stdout io.Writer) error {
	return cmaRun(ctx, o, dev, stdout, udaddyClient, udaddyServer)
}

func udaddyServer(ctx context.Context, o *cmaOpts, dev *ib.Device, pd *ib.PD, nodes []*udNode, local netip.Addr, stdout io.Writer) error {
	laddr := o.listenAddr()
	ln, err := cmListen(dev, laddr, true)
	if err != nil {
		return fmt.Errorf("listen %s: %v", laddr, err)
	}
	defer ln.close()
	o.printf(stdout, "udaddy: starting server") // once listening, as cmatose's
	wctx, cancel := withWait(ctx, o.wait)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, o.conns)
	for i := range o.conns {
		req, err := ln.accept(wctx)
		if err = waitErr(wctx, err); err != nil {
			wg.Wait()
			return fmt.Errorf("waiting for request %d of %d on %s: %v", i+1, o.conns, laddr, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = func() error {
				if !req.isUD() {
					_ = req.reject()
					return fmt.Errorf("request %d from %s is not a UD (SIDR) request", i, req.remote())
				}
				n, err := newUDNode(o, pd, dev, i)
				if err != nil {
					_ = req.reject()
					return err
				}
				nodes[i] = n
				if err := req.acceptUD(n.qp); err != nil {
					return fmt.Errorf("accept %s: %v", req.remote(), err)
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if o.count > 0 {
		o.printf(stdout, "receiving data transfers")
		if err := pollUD(ctx, o, pd, dev, local, nodes, "receives"); err != nil {
			return err
		}
		o.printf(stdout, "sending replies")
		for _, n := range nodes {
			if err := n.postSends(o, true); err != nil {
				return err
			}
		}
		if err := pollUD(ctx, o, pd, dev, local, nodes, "sends"); err != nil {
			return err
		}
		o.printf(stdout, "data transfers complete")
	}
	return nil
}

func udaddyClient(ctx context.Context, o *cmaOpts, dev *ib.Device, pd *ib.PD, nodes []*udNode, local netip.Addr, stdout io.Writer) error {
	o.printf(stdout, "udaddy: starting client")
	raddr := netip.AddrPortFrom(o.dst, uint16(o.port))
	o.printf(stdout, "udaddy: connecting")
	if err := cmaEach(o.conns, func(i int) error {
		n, err := newUDNode(o, pd, dev, i)
		if err != nil {
			return err
		}
		nodes[i] = n
		cctx, cancel := context.WithTimeout(ctx, o.ef.timeout)
		defer cancel()
		r, err := cmDialUD(cctx, dev, raddr, cmParams{local: local, tos: o.tos.v, timeout: o.ef.timeout})
		if err != nil {
			return connectError(raddr, err, o.ef.timeout, "a udaddy server running there")
		}
		// resolved_handler: the SIDR_REP's QPN and Q_Key, an AH to the
		// peer with -t's traffic class (rdma_cm's ud.ah_attr).
		if n.ah, err = pd.CreateAH(r.av(dev, local)); err != nil {
			return fmt.Errorf("connection %d: failure creating address handle: %v", i, err)
		}
		n.remoteQP, n.qkey = r.qpn, r.qkey
		return nil
	}); err != nil {
		return firstError(err)
	}
	if o.count > 0 {
		o.printf(stdout, "initiating data transfers")
		for _, n := range nodes {
			if err := n.postSends(o, false); err != nil {
				return err
			}
		}
		o.printf(stdout, "receiving data transfers")
		if err := pollUD(ctx, o, pd, dev, local, nodes, "receives"); err != nil {
			return err
		}
		o.printf(stdout, "data transfers complete")
	}
	return nil
}
