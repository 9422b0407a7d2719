package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/ib"
)

func init() {
	register(&command{
		name:    "cmatose",
		summary: "rdma_cm RC connections and SENDs each way like librdmacm's ucmatose (server, or -s ADDR client)",
		run:     runCmatose,
	})
}

const cmatosePort = 7471

// cmaOpts are the flags ucmatose and udaddy share.
type cmaOpts struct {
	ef      engineFlags
	dst     netip.Addr // -s: the server (client side); invalid on the server
	bind    netip.Addr // -b
	conns   int
	count   int
	size    int
	port    uint
	wait    time.Duration
	ackTO   uint // --ack-timeout (RC)
	tos     tosFlag
	tool    string // "cmatose" or "udaddy": the prefix of its lines
	command string // the rxed subcommand
}

// parseCma parses ucmatose's / udaddy's flags for command name.
func parseCma(name, tool string, defPort uint, args []string, stderr io.Writer) (*cmaOpts, int, bool) {
	o := &cmaOpts{tool: tool, command: name}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	o.ef.register(fs, false)
	dst := fs.String("s", "", "server `address` (makes this the client)")
	bind := fs.String("b", "", "bind `address` (the engine's address unless --addr)")
	fs.IntVar(&o.conns, "c", 1, "number of `connections`")
	fs.IntVar(&o.count, "C", 10, "message `count` each way per connection")
	fs.IntVar(&o.size, "S", 100, "message `size` in bytes")
	fs.UintVar(&o.port, "p", defPort, "rdma_cm `port`")
	tosUsage := "IP TOS `value` of the client's connections, 0..255, e.g. 104 or 0x68 (rdma_set_option RDMA_OPTION_ID_TOS); a server's take each client's REQ's"
	if name == "udaddy" {
		tosUsage = "IP TOS `value` of the client's datagrams, 0..255, e.g. 104 or 0x68 (rdma_set_option RDMA_OPTION_ID_TOS: the address handle's traffic class); a server replies with the TOS of each client's"
	}
	fs.Var(&o.tos, "t", tosUsage)
	ps := ""
	if name == "cmatose" {
		fs.UintVar(&o.ackTO, "ack-timeout", 0, "local ACK timeout `exponent` (4.096 µs * 2^N, RDMA_OPTION_ID_ACK_TIMEOUT); 0 lets rdma_cm derive it (2.1 s on RoCE)")
	}
	if name == "udaddy" {
		fs.StringVar(&ps, "P", "udp", "port `space`: udp (the only one rxed has for UD)")
	}
	fs.DurationVar(&o.wait, "wait", 0, "server: give up when the clients do not all connect within this `duration` (0 waits forever)")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return nil, code, false
	}
	bad := func(format string, a ...any) (*cmaOpts, int, bool) {
		fmt.Fprintf(stderr, "rxed %s: "+format+"\n", append([]any{name}, a...)...)
		return nil, 2, false
	}
	var err error
	switch {
	case len(rest) > 0:
		return bad("unexpected arguments %q (the server address is -s)", rest)
	case o.conns < 1 || o.conns > 1024:
		return bad("-c %d: connections must be 1..1024", o.conns)
	case o.count < 0 || o.count > 1<<14:
		return bad("-C %d: message count must be 0..%d", o.count, 1<<14)
	case o.size < 0 || o.size > 1<<24:
		return bad("-S %d: message size must be 0..%d", o.size, 1<<24)
	case o.port == 0 || o.port > 65535:
		return bad("-p %d out of range 1..65535", o.port)
	case o.ackTO > 31:
		return bad("--ack-timeout %d: want 0..31", o.ackTO)
	case ps != "" && ps != "udp":
		return bad("-P %q: only the udp port space", ps)
	}
	if *dst != "" {
		if o.dst, err = parseHost("-s", *dst); err != nil {
			return bad("%v", err)
		}
	}
	if *bind != "" {
		if o.bind, err = parseHost("-b", *bind); err != nil {
			return bad("%v", err)
		}
	}
	server := !o.dst.IsValid()
	if server {
		err = o.ef.pickAddrs(true, o.bind, netip.Addr{}, "-b")
	} else {
		err = o.ef.pickAddrs(false, o.dst, o.bind, "-b")
	}
	if err != nil {
		return bad("%v", err)
	}
	if err := o.ef.check(); err != nil {
		return bad("%v", err)
	}
	if o.size == 0 {
		o.count = 0 // as create_message
	}
	return o, 0, true
}

// listenAddr is where a server listens: -b, or any address of the
// engine's family.
func (o *cmaOpts) listenAddr() netip.AddrPort {
	if o.bind.IsValid() {
		return netip.AddrPortFrom(o.bind, uint16(o.port))
	}
	if o.ef.addrs[0].Is6() {
		return netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(o.port))
	}
	return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(o.port))
}

// localAddr is the address a connection of ours uses.
func (o *cmaOpts) localAddr() (netip.Addr, error) {
	if o.dst.IsValid() {
		return o.ef.localFor(o.dst, o.bind)
	}
	if o.bind.IsValid() && !o.bind.IsUnspecified() {
		return o.bind, nil
	}
	return o.ef.addrs[0], nil
}

func (o *cmaOpts) printf(w io.Writer, format string, a ...any) {
	fmt.Fprintf(w, format+"\n", a...)
}

func runCmatose(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseCma("cmatose", "cmatose", cmatosePort, args, stderr)
	if !ok {
		return code
	}
	return runCmaTool(o, stdout, stderr, cmatose)
}

// runCmaTool opens the engine, runs the tool, and prints the tools'
// closing lines ("test complete", "return status 0") on success.
func runCmaTool(o *cmaOpts, stdout, stderr io.Writer, tool func(context.Context, *cmaOpts, *ib.Device, io.Writer) error) int {
	err := func() (err error) {
		en, err := o.ef.open(o.ef.logger(stderr))
		if err != nil {
			return err
		}
		stopWatch := en.closeOnInterrupt(stderr, o.command)
		defer func() {
			stopWatch()
			if cerr := en.close(); err == nil {
				err = cerr
			}
		}()
		return tool(context.Background(), o, en.dev, stdout)
	}()
	if err != nil {
		return fail(stderr, o.command, err)
	}
	o.printf(stdout, "test complete")
	o.printf(stdout, "return status 0")
	return 0
}

// cmaNode is one ucmatose connection: its QP, two CQs and the message
// buffer (struct cmatest_node).
type cmaNode struct {
	id     int
	qp     *ib.QP
	cq     [2]*ib.CQ // send, receive
	mem    []byte
	mr     *ib.MR
	conn   *cmConn
	remote netip.AddrPort
}

const (
	cmaSendCQ = 0
	cmaRecvCQ = 1
)

// newCmaNode is init_node and post_recvs: a QP in INIT with count
// receives of size bytes posted.
func newCmaNode(o *cmaOpts, pd *ib.PD, dev *ib.Device, id int) (_ *cmaNode, err error) {
	n := &cmaNode{id: id}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	cqe := max(o.count, 1)
	for i := range n.cq {
		if n.cq[i], err = dev.CreateCQ(cqe); err != nil {
			return nil, err
		}
	}
	n.qp, err = pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: n.cq[cmaSendCQ], RecvCQ: n.cq[cmaRecvCQ],
		Cap: ib.QPCap{MaxSendWR: uint32(cqe), MaxRecvWR: uint32(cqe), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("unable to create QP: %v", err)
	}
	if err := initQPForCM(n.qp); err != nil {
		return nil, err
	}
	if o.count == 0 {
		return n, nil
	}
	// ucmatose sends from and receives into one buffer; rxed gives the
	// receives the second half, so the engine never reads a message to
	// send (or resend) while it writes one received.
	n.mem = make([]byte, 2*o.size)
	if n.mr, err = pd.RegMR(n.mem, ib.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("failed to reg MR: %v", err)
	}
	wr := ib.RecvWR{ID: uint64(id), SGL: []ib.SGE{{Addr: n.mr.IOVA() + uint64(o.size), Length: uint32(o.size), LKey: n.mr.LKey()}}}
	for range o.count {
		if err := n.qp.PostRecv(wr); err != nil {
			return nil, fmt.Errorf("failed to post receives: %v", err)
		}
	}
	return n, nil
}

func (n *cmaNode) close() {
	if n.qp != nil {
		_ = n.qp.Destroy()
	}
	if n.mr != nil {
		_ = n.mr.Dereg()
	}
	for _, cq := range n.cq {
		if cq != nil {
			_ = cq.Destroy()
		}
	}
}

// postSends is post_sends: count signaled SENDs of the message buffer
// (ucmatose creates its QPs with sq_sig_all).
func (n *cmaNode) postSends(o *cmaOpts) error {
	if o.count == 0 {
		return nil
	}
	wr := ib.SendWR{ID: uint64(n.id), Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: n.mr.IOVA(), Length: uint32(o.size), LKey: n.mr.LKey()}}}
	for range o.count {
		if err := n.qp.PostSend(wr); err != nil {
			return fmt.Errorf("connection %d: failed to post sends: %v", n.id, err)
		}
	}
	return nil
}

// pollN waits for n successful completions on cq. ucmatose counts any
// completion; rxed also fails on an error status and on a receive of the
// wrong length, so a lost or mangled message cannot pass unnoticed.
func pollN(ctx context.Context, cq *ib.CQ, n int, wantLen int, timeout time.Duration, what string, each func(ib.WC)) error {
	var wcs [8]ib.WC
	for done := 0; done < n; {
		k, err := wcWait(ctx, cq, wcs[:min(8, n-done)], nil, timeout)
		if err != nil {
			return fmt.Errorf("%s: %d of %d completions within %v", what, done, n, timeout)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != ib.WCSuccess {
				return fmt.Errorf("%s: completion %d failed: %s (%d)", what, done, wc.Status, int(wc.Status))
			}
			if wantLen >= 0 && wc.Opcode == ib.WCRecv && int(wc.ByteLen) != wantLen {
				return fmt.Errorf("%s: message %d has %d bytes, want %d", what, done, wc.ByteLen, wantLen)
			}
			if each != nil {
				each(wc)
			}
			done++
		}
	}
	return nil
}

// pollNodes is poll_cqs: count completions on CQ index of every node.
func pollNodes(ctx context.Context, o *cmaOpts, nodes []*cmaNode, index int) error {
	what := [2]string{"send", "receive"}[index]
	for _, n := range nodes {
		if err := pollN(ctx, n.cq[index], o.count, o.size, o.ef.timeout, fmt.Sprintf("connection %d %ss", n.id, what), nil); err != nil {
			return err
		}
	}
	return nil
}

// cmaParams are ucmatose's connect parameters: one read each way, retry
// 5, RNR retry 0 (its receives are posted before it connects).
func cmaParams(local netip.Addr, o *cmaOpts) cmParams {
	return cmParams{local: local, respResources: 1, initiatorDepth: 1, retryCount: 5, ackTimeout: uint8(o.ackTO), tos: o.tos.v, timeout: o.ef.timeout}
}

func cmatose(ctx context.Context, o *cmaOpts, dev *ib.Device, stdout io.Writer) error {
	return cmaRun(ctx, o, dev, stdout, cmatoseClient, cmatoseServer)
}

// cmaPart is the client's or the server's half of ucmatose or udaddy.
type cmaPart[N any] func(ctx context.Context, o *cmaOpts, dev *ib.Device, pd *ib.PD, nodes []N, local netip.Addr, stdout io.Writer) error

// cmaRun is the frame ucmatose and udaddy share around their connections:
// a PD, one node per connection (each closed at the end), the local
// address, then the client's part (with a server address) or the
// server's.
func cmaRun[N interface {
	comparable
	close()
}](ctx context.Context, o *cmaOpts, dev *ib.Device, stdout io.Writer, client, server cmaPart[N]) error {
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Dealloc()
	nodes := make([]N, o.conns)
	defer func() {
		var none N
		for _, n := range nodes {
			if n != none {
				n.close()
			}
		}
	}()
	local, err := o.localAddr()
	if err != nil {
		return err
	}
	if o.dst.IsValid() {
		return client(ctx, o, dev, pd, nodes, local, stdout)
	}
	return server(ctx, o, dev, pd, nodes, local, stdout)
}

// cmaEach runs f for every connection at once (ucmatose resolves,
// connects and accepts them all in flight together) and returns the
// first error.
func cmaEach(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func cmatoseServer(ctx context.Context, o *cmaOpts, dev *ib.Device, pd *ib.PD, nodes []*cmaNode, local netip.Addr, stdout io.Writer) error {
	laddr := o.listenAddr()
	ln, err := cmListen(dev, laddr, false)
	if err != nil {
		return fmt.Errorf("listen %s: %v", laddr, err)
	}
	defer ln.close()
	// ucmatose prints this before it listens; rxed once it listens, so
	// the line tells a script (or a test) that clients may connect.
	o.printf(stdout, "cmatose: starting server")
	// connect_events: accept until every connection is established.
	wctx, cancel := withWait(ctx, o.wait)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, o.conns)
	for i := range o.conns {
		req, err := ln.accept(wctx)
		if err = waitErr(wctx, err); err != nil {
			wg.Wait()
			return fmt.Errorf("waiting for connection %d of %d on %s: %v", i+1, o.conns, laddr, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = func() error {
				n, err := newCmaNode(o, pd, dev, i)
				if err != nil {
					_ = req.reject()
					return err
				}
				nodes[i], n.remote = n, req.remote()
				actx, cancel := context.WithTimeout(ctx, o.ef.timeout)
				defer cancel()
				if n.conn, err = req.accept(actx, n.qp, cmaParams(local, o)); err != nil {
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
		o.printf(stdout, "initiating data transfers")
		for _, n := range nodes {
			if err := n.postSends(o); err != nil {
				return err
			}
		}
		o.printf(stdout, "completing sends")
		if err := pollNodes(ctx, o, nodes, cmaSendCQ); err != nil {
			return err
		}
		o.printf(stdout, "receiving data transfers")
		if err := pollNodes(ctx, o, nodes, cmaRecvCQ); err != nil {
			return err
		}
		o.printf(stdout, "data transfers complete")
	}
	o.printf(stdout, "cmatose: disconnecting")
	if err := cmaEach(len(nodes), func(i int) error {
		dctx, cancel := context.WithTimeout(ctx, o.ef.timeout)
		defer cancel()
		if err := nodes[i].conn.disconnect(dctx); err != nil {
			return fmt.Errorf("connection %d: disconnect: %v", i, err)
		}
		return nil
	}); err != nil {
		return err
	}
	o.printf(stdout, "disconnected")
	return nil
}

func cmatoseClient(ctx context.Context, o *cmaOpts, dev *ib.Device, pd *ib.PD, nodes []*cmaNode, local netip.Addr, stdout io.Writer) error {
	o.printf(stdout, "cmatose: starting client")
	raddr := netip.AddrPortFrom(o.dst, uint16(o.port))
	o.printf(stdout, "cmatose: connecting")
	if err := cmaEach(o.conns, func(i int) error {
		n, err := newCmaNode(o, pd, dev, i)
		if err != nil {
			return err
		}
		nodes[i] = n
		cctx, cancel := context.WithTimeout(ctx, o.ef.timeout)
		defer cancel()
		if n.conn, err = cmDial(cctx, n.qp, raddr, cmaParams(local, o)); err != nil {
			return connectError(raddr, err, o.ef.timeout, "a cmatose server running there")
		}
		return nil
	}); err != nil {
		return firstError(err)
	}
	if o.count > 0 {
		o.printf(stdout, "receiving data transfers")
		if err := pollNodes(ctx, o, nodes, cmaRecvCQ); err != nil {
			return err
		}
		o.printf(stdout, "sending replies")
		for _, n := range nodes {
			if err := n.postSends(o); err != nil {
				return err
			}
		}
		o.printf(stdout, "data transfers complete")
	}
	// disconnect_events: the server disconnects; answer each DREQ.
	for _, n := range nodes {
		select {
		case <-n.conn.done():
		case <-time.After(o.ef.timeout):
			return fmt.Errorf("connection %d: the server did not disconnect within %v", n.id, o.ef.timeout)
		}
		dctx, cancel := context.WithTimeout(ctx, o.ef.timeout)
		_ = n.conn.disconnect(dctx)
		cancel()
	}
	return nil
}

// firstError is the first of errors.Join's errors: the same failure on
// eight connections is one line, not eight.
func firstError(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		if errs := j.Unwrap(); len(errs) > 0 {
			return errs[0]
		}
	}
	return err
}
