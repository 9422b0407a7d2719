package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
)

func init() {
	register(&command{
		name:    "mckey",
		summary: "rdma_cm UD multicast like librdmacm's mckey: join a group (-m), receive -C messages, or send them (-s)",
		run:     runMckey,
	})
}

// mckeyOpts are mckey's flags (librdmacm/examples/mckey.c) and the engine's.
type mckeyOpts struct {
	ef     engineFlags
	group  netip.Addr
	bind   netip.Addr
	sender bool
	count  int
	size   int
	ps     mad.PortSpace
	pause  time.Duration
}

func parseMckey(args []string, stderr io.Writer) (*mckeyOpts, int, bool) {
	o := &mckeyOpts{}
	fs := flag.NewFlagSet("mckey", flag.ContinueOnError)
	o.ef.register(fs, false)
	group := fs.String("m", "", "multicast `address` to join (required)")
	bind := fs.String("b", "", "bind `address` (the engine's address unless --addr)")
	fs.BoolVar(&o.sender, "s", false, "send the messages (default: receive them)")
	fs.IntVar(&o.count, "C", 10, "message `count`")
	fs.IntVar(&o.size, "S", 100, "message `size` in bytes (at most the MTU)")
	ps := fs.String("p", "0x0111", "port `space`: 0x0111 RDMA_PS_UDP (0x0002 RDMA_PS_IPOIB has no Q_Key on RoCE)")
	fs.DurationVar(&o.pause, "pause", 3*time.Second, "wait this `duration` after joining before the data (mckey's sleep(3), for the other members to join)")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return nil, code, false
	}
	bad := func(format string, a ...any) (*mckeyOpts, int, bool) {
		fmt.Fprintf(stderr, "rxed mckey: "+format+"\n", a...)
		return nil, 2, false
	}
	var err error
	switch {
	case len(rest) > 0:
		return bad("unexpected arguments %q", rest)
	case *group == "":
		return bad("-m is required (the multicast address to join)")
	case o.count < 0 || o.count > 1<<14:
		return bad("-C %d: message count must be 0..%d", o.count, 1<<14)
	case o.size < 0 || o.size > ib.MTU4096.Bytes():
		return bad("-S %d: a UD message is one packet: 0..%d bytes", o.size, ib.MTU4096.Bytes())
	case o.pause < 0:
		return bad("--pause %v must not be negative", o.pause)
	}
	if o.group, err = parseHost("-m", *group); err != nil {
		return bad("%v", err)
	}
	if !o.group.IsMulticast() {
		return bad("-m %s: not a multicast address", *group)
	}
	if *bind != "" {
		if o.bind, err = parseHost("-b", *bind); err != nil {
			return bad("%v", err)
		}
	}
	v, err := strconv.ParseUint(*ps, 0, 16)
	if err != nil {
		return bad("-p %q: not a port space number", *ps)
	}
	o.ps = mad.PortSpace(v)
	if err := o.ef.pickAddrs(true, o.bind, netip.Addr{}, "-b"); err != nil {
		return bad("%v", err)
	}
	if err := o.ef.check(); err != nil {
		return bad("%v", err)
	}
	if o.size == 0 {
		o.count = 0
	}
	return o, 0, true
}

func runMckey(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseMckey(args, stderr)
	if !ok {
		return code
	}
	if o.sender {
		fmt.Fprintln(stdout, "mckey: starting client")
	} else {
		fmt.Fprintln(stdout, "mckey: starting server")
	}
	err := func() (err error) {
		en, err := o.ef.open(o.ef.logger(stderr))
		if err != nil {
			return err
		}
		stopWatch := en.closeOnInterrupt(stderr, "mckey")
		defer func() {
			stopWatch()
			if cerr := en.close(); err == nil {
				err = cerr
			}
		}()
		return mckey(o, en.dev, stdout)
	}()
	if err != nil {
		return fail(stderr, "mckey", err)
	}
	fmt.Fprintln(stdout, "test complete")
	fmt.Fprintln(stdout, "return status 0")
	return 0
}

// mckeyNode is mckey's one node: a UD QP, its CQ and count+1 slots of
// size+40 bytes (receives; the last slot is the send buffer).
type mckeyNode struct {
	qp   *ib.QP
	cq   *ib.CQ
	mr   *ib.MR
	mem  []byte
	slot int
}

func newMckeyNode(o *mckeyOpts, dev *ib.Device) (*mckeyNode, error) {
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	depth := max(o.count, 1)
	n := &mckeyNode{slot: o.size + grhLen}
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
	n.mem = make([]byte, (o.count+1)*n.slot)
	if n.mr, err = pd.RegMR(n.mem, ib.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("failed to reg MR: %v", err)
	}
	if o.sender {
		return n, nil
	}
	for i := range o.count { // post_recvs, before the join as mckey
		wr := ib.RecvWR{ID: uint64(i), SGL: []ib.SGE{{Addr: n.mr.IOVA() + uint64(i*n.slot), Length: uint32(n.slot), LKey: n.mr.LKey()}}}
		if err := n.qp.PostRecv(wr); err != nil {
			return nil, fmt.Errorf("failed to post receives: %v", err)
		}
	}
	return n, nil
}

// mckey is mckey.c's run(): join, the pause, then the data one way, and
// the leave.
func mckey(o *mckeyOpts, dev *ib.Device, stdout io.Writer) error {
	n, err := newMckeyNode(o, dev)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "mckey: joining")
	m, err := rdmacm.JoinMulticast(n.qp, o.group, &rdmacm.McastOptions{Local: o.bind, PortSpace: o.ps})
	if err != nil {
		return fmt.Errorf("failure joining: %v", err)
	}
	// The join event's line: the address handle's DGID, DLID and SL.
	fmt.Fprintf(stdout, "mckey: joined dgid: %s mlid 0x%x sl %d\n", m.MGID, m.MLID, m.SL)
	time.Sleep(o.pause)
	if o.count > 0 {
		if o.sender {
			fmt.Fprintln(stdout, "initiating data transfers")
			err = n.send(o, dev, m)
		} else {
			fmt.Fprintln(stdout, "receiving data transfers")
			err = n.receive(o)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, "data transfers complete")
	}
	if err := m.Leave(); err != nil {
		return fmt.Errorf("failure leaving: %v", err)
	}
	return nil
}

// send is post_sends: count SEND_WITH_IMMs of size bytes carrying our QPN
// to the group (QPN 0xFFFFFF, the group's Q_Key). mckey posts them
// unsignaled and exits; rxed signals them and waits, so that its exit
// (which stops the engine) never cuts the last ones off.
func (n *mckeyNode) send(o *mckeyOpts, dev *ib.Device, m *rdmacm.Multicast) error {
	ah, err := n.qp.PD().CreateAH(m.AV)
	if err != nil {
		return fmt.Errorf("failure creating address handle: %v", err)
	}
	wr := ib.SendWR{Opcode: ib.WRSendWithImm, Imm: n.qp.Num(), Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: n.mr.IOVA() + uint64(o.count*n.slot+grhLen), Length: uint32(o.size), LKey: n.mr.LKey()}}}
	ib.UDSend(&wr, ah, m.QPN, m.QKey)
	for i := range o.count {
		wr.ID = uint64(i)
		if err := n.qp.PostSend(wr); err != nil {
			return fmt.Errorf("failed to post sends: %v", err)
		}
	}
	return n.poll(o, o.count, ib.WCSend)
}

// receive is poll_cqs: count receive completions of size bytes (plus
// the GRH).
func (n *mckeyNode) receive(o *mckeyOpts) error {
	return n.poll(o, o.count, ib.WCRecv)
}

func (n *mckeyNode) poll(o *mckeyOpts, want int, op ib.WCOpcode) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.ef.timeout)
	defer cancel()
	wcs := make([]ib.WC, 16)
	for got := 0; got < want; {
		k, err := n.cq.WaitPoll(ctx, wcs)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%d of %d completions after %v (--timeout)", got, want, o.ef.timeout)
			}
			return fmt.Errorf("failed polling CQ: %v", err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != ib.WCSuccess {
				return fmt.Errorf("completion %d: %v", got, wc.Status)
			}
			if wc.Opcode != op {
				return fmt.Errorf("completion %d: %v, want %v", got, wc.Opcode, op)
			}
			if op == ib.WCRecv && int(wc.ByteLen) != n.slot {
				return fmt.Errorf("message %d: %d bytes, want %d (-S %d and the GRH)", got, wc.ByteLen, n.slot, n.slot-grhLen)
			}
			got++
		}
	}
	return nil
}
