package main

import (
	"bytes"
	"context"
	"encoding/binary"
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
		name:    "rping",
		summary: "rdma_cm ping like librdmacm's rping: RDMA READ and WRITE of a buffer per ping (-s server, -c client)",
		run:     runRping,
	})
}

// rping's constants (librdmacm/examples/rping.c).
const (
	rpingPort    = 7174
	rpingMsgFmt  = "rdma-ping-%d: "
	rpingInfoLen = 16 // struct rping_rdma_info: be64 buf, be32 rkey, be32 size
	rpingSQDepth = 16 // RPING_SQ_DEPTH
	// rpingMinSize is RPING_MIN_BUFSIZE: sizeof("2147483647") +
	// sizeof("rdma-ping-%d: "), room for the longest prefix and its NUL.
	rpingMinSize = 11 + 15
	rpingMaxSize = 64*1024 - 1 // RPING_BUFSIZE - 1
	// rpingStateDisconnected is rping's DISCONNECTED in its state enum,
	// which its server prints when the client has gone.
	rpingStateDisconnected = 10
)

// The work request IDs of an rping end.
const (
	rpingWRRecv = iota + 1
	rpingWRSend
	rpingWRRDMA
)

type rpingOpts struct {
	ef         engineFlags
	server     bool
	addr       netip.Addr // -a: the server's listen address; the client's target
	src        netip.Addr // -I: the client's source address
	port       uint
	count      int
	size       int
	verbose    bool
	validate   bool
	persistent bool
	debug      bool
	ackTimeout uint          // --ack-timeout: 0 as rdma_cm derives it
	clients    int           // -P: stop after this many clients (0: serve forever)
	wait       time.Duration // server: give up when no client comes
}

func parseRping(args []string, stderr io.Writer) (*rpingOpts, int, bool) {
	o := &rpingOpts{}
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	o.ef.register(fs, false)
	server := fs.Bool("s", false, "server side")
	client := fs.Bool("c", false, "client side")
	addr := fs.String("a", "", "`address`: the server binds it (default any), the client connects to it")
	src := fs.String("I", "", "client: source `address` to bind (the engine's address unless --addr)")
	fs.UintVar(&o.port, "p", rpingPort, "rdma_cm `port`")
	fs.IntVar(&o.count, "C", 0, "client: ping `count` (0: forever)")
	fs.IntVar(&o.size, "S", 64, "ping data `size` in bytes")
	fs.BoolVar(&o.verbose, "v", false, "display ping data to stdout")
	fs.BoolVar(&o.validate, "V", false, "validate ping data")
	fs.BoolVar(&o.persistent, "P", false, "persistent server mode allowing multiple connections")
	fs.BoolVar(&o.debug, "d", false, "debug printfs (rping's DEBUG_LOG lines on stdout; --debug logs the engine)")
	fs.UintVar(&o.ackTimeout, "ack-timeout", 0, "local ACK timeout `exponent` (4.096 µs * 2^N, rdma_set_option's RDMA_OPTION_ID_ACK_TIMEOUT); 0 lets rdma_cm derive it (2.1 s on RoCE)")
	fs.IntVar(&o.clients, "clients", 0, "with -P: exit after serving this many clients (0: serve forever, as rping)")
	fs.DurationVar(&o.wait, "wait", 0, "server: give up when no client connects within this `duration` (0 waits forever)")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return nil, code, false
	}
	bad := func(format string, a ...any) (*rpingOpts, int, bool) {
		fmt.Fprintf(stderr, "rxed rping: "+format+"\n", a...)
		return nil, 2, false
	}
	o.server = *server
	var err error
	switch {
	case len(rest) > 0:
		return bad("unexpected arguments %q (the server address is -a)", rest)
	case *server == *client:
		return bad("give exactly one of -s (server) and -c (client)")
	case o.size < rpingMinSize || o.size > rpingMaxSize:
		return bad("-S %d: invalid size (valid range is %d to %d)", o.size, rpingMinSize, rpingMaxSize)
	case o.count < 0:
		return bad("-C %d: invalid count", o.count)
	case o.port == 0 || o.port > 65535:
		return bad("-p %d out of range 1..65535", o.port)
	case o.ackTimeout > 31:
		return bad("--ack-timeout %d: want 0..31", o.ackTimeout)
	case o.clients < 0:
		return bad("--clients %d: must be 0 or more", o.clients)
	case o.clients > 0 && !o.persistent:
		return bad("--clients needs -P")
	case *client && *addr == "":
		return bad("-c needs -a, the server's address")
	}
	if *addr != "" {
		if o.addr, err = parseHost("-a", *addr); err != nil {
			return bad("%v", err)
		}
	}
	if *src != "" {
		if !*client {
			return bad("-I is the client's source address")
		}
		if o.src, err = parseHost("-I", *src); err != nil {
			return bad("%v", err)
		}
	}
	bindFlag := "-I"
	if o.server {
		bindFlag = "-a"
	}
	if err := o.ef.pickAddrs(o.server, o.addr, o.src, bindFlag); err != nil {
		return bad("%v", err)
	}
	if err := o.ef.check(); err != nil {
		return bad("%v", err)
	}
	return o, 0, true
}

// pickAddrs fills --addr when it was not given, from the tools' own
// address flags: a server binds its listen address, a client its source
// address, or the address the host would send from to the server. flag
// is the tool's own name for the address it binds (rping's -a for a
// server and -I for a client, cmatose's, udaddy's and mckey's -b), which
// the errors name: rping's "-a" sent a cmatose or mckey user to a flag
// their command does not have.
func (e *engineFlags) pickAddrs(server bool, addr, src netip.Addr, flag string) error {
	if len(e.addrs) > 0 {
		return nil
	}
	switch {
	case server && addr.IsValid() && !addr.IsUnspecified():
		e.addrs = addrList{addr}
	case server:
		return fmt.Errorf("--addr or %s is required: the address this engine binds", flag)
	case src.IsValid():
		e.addrs = addrList{src}
	default:
		a, err := sourceFor(addr)
		if err != nil {
			return fmt.Errorf("%v (give %s or --addr)", err, flag)
		}
		e.addrs = addrList{a}
	}
	return nil
}

// localFor is the engine address a client connects from: src if given,
// else the first engine address of raddr's family.
func (e *engineFlags) localFor(raddr, src netip.Addr) (netip.Addr, error) {
	if src.IsValid() {
		return src, nil
	}
	for _, a := range e.addrs {
		if a.Is4() == raddr.Is4() {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no --addr of %s's family", raddr)
}

func runRping(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseRping(args, stderr)
	if !ok {
		return code
	}
	if err := rping(context.Background(), o, &lockedWriter{w: stdout}, stderr); err != nil {
		return fail(stderr, "rping", err)
	}
	return 0
}

// lockedWriter serialises lines from concurrent connections.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func rping(ctx context.Context, o *rpingOpts, stdout, stderr io.Writer) (err error) {
	log := o.ef.logger(stderr)
	en, err := o.ef.open(log)
	if err != nil {
		return err
	}
	stopWatch := en.closeOnInterrupt(stderr, "rping")
	defer func() {
		stopWatch()
		if cerr := en.close(); err == nil {
			err = cerr
		}
	}()
	if o.server {
		return rpingServe(ctx, o, en.dev, stdout, stderr)
	}
	raddr := netip.AddrPortFrom(o.addr, uint16(o.port))
	local, err := o.ef.localFor(o.addr, o.src)
	if err != nil {
		return err
	}
	e, err := newRpingEnd(o, en.dev, false)
	if err != nil {
		return err
	}
	defer e.close()
	cctx, cancel := context.WithTimeout(ctx, o.ef.timeout)
	e.conn, err = cmDial(cctx, e.qp, raddr, rpingParams(local, o))
	cancel()
	if err != nil {
		return connectError(raddr, err, o.ef.timeout, "an rping server (-s) running there")
	}
	o.debugf(stdout, "rdma_connect successful")
	runErr := e.client(ctx, stdout)
	dctx, cancel := context.WithTimeout(ctx, o.ef.timeout)
	defer cancel()
	if derr := e.conn.disconnect(dctx); runErr == nil && derr != nil {
		runErr = fmt.Errorf("disconnect: %v", derr)
	}
	return runErr
}

// debugf prints one of rping's -d lines.
func (o *rpingOpts) debugf(w io.Writer, format string, a ...any) {
	if o.debug {
		fmt.Fprintf(w, format+"\n", a...)
	}
}

// rpingParams are rping_init_conn_param's: one read each way, retry 7,
// RNR retry 7 (infinite).
func rpingParams(local netip.Addr, o *rpingOpts) cmParams {
	return cmParams{local: local, respResources: 1, initiatorDepth: 1, retryCount: 7, rnrRetryCount: 7,
		ackTimeout: uint8(o.ackTimeout), timeout: o.ef.timeout}
}

// rpingServe listens and serves one client, or with -P successive and
// concurrent ones, each on its own QP.
func rpingServe(ctx context.Context, o *rpingOpts, dev *ib.Device, stdout, stderr io.Writer) error {
	laddr := netip.AddrPortFrom(o.addr, uint16(o.port))
	if !o.addr.IsValid() {
		laddr = netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(o.port))
		if o.ef.addrs[0].Is6() {
			laddr = netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(o.port))
		}
	}
	ln, err := cmListen(dev, laddr, false)
	if err != nil {
		return fmt.Errorf("listen %s: %v", laddr, err)
	}
	defer ln.close()
	o.debugf(stdout, "rdma_bind_addr successful")
	o.debugf(stdout, "rdma_listen")
	if !o.persistent {
		actx, cancel := withWait(ctx, o.wait)
		req, err := ln.accept(actx)
		err = waitErr(actx, err)
		cancel()
		if err != nil {
			return fmt.Errorf("waiting for a client on %s: %v", laddr, err)
		}
		ln.close() // later requests are refused, not left waiting
		return rpingServeOne(ctx, o, dev, req, stdout, stderr)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		served int
	)
	for o.clients == 0 || served < o.clients {
		actx, cancel := withWait(ctx, o.wait)
		req, err := ln.accept(actx)
		err = waitErr(actx, err)
		cancel()
		if err != nil {
			wg.Wait()
			return errors.Join(append(errs, fmt.Errorf("waiting for a client on %s: %v", laddr, err))...)
		}
		served++
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rpingServeOne(ctx, o, dev, req, stdout, stderr); err != nil {
				// rping's persistent server reports a failed client and
				// goes on serving the others.
				fmt.Fprintf(stderr, "rxed rping: client %s: %v\n", req.remote(), err)
				mu.Lock()
				errs = append(errs, fmt.Errorf("client %s: %v", req.remote(), err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d clients failed", len(errs), served)
	}
	return nil
}

func rpingServeOne(ctx context.Context, o *rpingOpts, dev *ib.Device, req *cmRequest, stdout, stderr io.Writer) error {
	e, err := newRpingEnd(o, dev, true)
	if err != nil {
		_ = req.reject()
		return err
	}
	defer e.close()
	actx, cancel := context.WithTimeout(ctx, o.ef.timeout)
	local := o.addr
	if !local.IsValid() || local.IsUnspecified() {
		local = o.ef.addrs[0]
	}
	e.conn, err = req.accept(actx, e.qp, rpingParams(local, o))
	cancel()
	if err != nil {
		return fmt.Errorf("accept %s: %v", req.remote(), err)
	}
	runErr := e.server(ctx, stdout, stderr)
	dctx, cancel := context.WithTimeout(ctx, o.ef.timeout)
	defer cancel()
	_ = e.conn.disconnect(dctx) // after the client's DREQ: the DREP is the CM's
	return runErr
}

// rpingEnd is one side of an rping connection: rping_cb's verbs
// resources.
type rpingEnd struct {
	o    *rpingOpts
	pd   *ib.PD
	cq   *ib.CQ
	qp   *ib.QP
	conn *cmConn

	// ctl holds the 16-byte messages: the receive buffer, then two send
	// buffers (the client's start and sink adverts, the server's "go").
	ctl   []byte
	ctlMR *ib.MR
	// rdma is the RDMA sink (server: READ target and WRITE source;
	// client: WRITE target); start the client's READ source.
	rdma, start     []byte
	rdmaMR, startMR *ib.MR

	// sending[i]: send buffer i's SEND has not completed. Its bytes are
	// the engine's until then (a retransmission after a lost ACK reads
	// them again), so sendInfo waits for that completion before it
	// writes the buffer anew; completions of other kinds that come
	// meanwhile wait in stash for await. rping's C client rewrites the
	// buffer at once (the race detector caught ours doing the same under
	// loss: CI, session AI, TestRpingUnderLoss).
	sending [2]bool
	stash   []ib.WC
}

func (e *rpingEnd) recvBuf() []byte      { return e.ctl[:rpingInfoLen] }
func (e *rpingEnd) sendBuf(i int) []byte { return e.ctl[rpingInfoLen*(1+i) : rpingInfoLen*(2+i)] }

func newRpingEnd(o *rpingOpts, dev *ib.Device, server bool) (_ *rpingEnd, err error) {
	e := &rpingEnd{o: o}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.cq, err = dev.CreateCQ(rpingSQDepth * 2); err != nil {
		return nil, err
	}
	e.ctl = make([]byte, 3*rpingInfoLen)
	if e.ctlMR, err = e.pd.RegMR(e.ctl, ib.AccessLocalWrite); err != nil {
		return nil, err
	}
	remote := ib.AccessLocalWrite | ib.AccessRemoteRead | ib.AccessRemoteWrite
	e.rdma = make([]byte, o.size)
	if e.rdmaMR, err = e.pd.RegMR(e.rdma, remote); err != nil {
		return nil, err
	}
	if !server {
		e.start = make([]byte, o.size)
		if e.startMR, err = e.pd.RegMR(e.start, remote); err != nil {
			return nil, err
		}
	}
	e.qp, err = e.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: ib.QPCap{MaxSendWR: rpingSQDepth, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	if err := initQPForCM(e.qp); err != nil {
		return nil, err
	}
	return e, e.postRecv()
}

func (e *rpingEnd) close() {
	if e.qp != nil {
		_ = e.qp.Destroy()
	}
	for _, m := range []*ib.MR{e.ctlMR, e.rdmaMR, e.startMR} {
		if m != nil {
			_ = m.Dereg()
		}
	}
	if e.cq != nil {
		_ = e.cq.Destroy()
	}
	if e.pd != nil {
		_ = e.pd.Dealloc()
	}
}

func (e *rpingEnd) postRecv() error {
	err := e.qp.PostRecv(ib.RecvWR{ID: rpingWRRecv, SGL: []ib.SGE{{Addr: e.ctlMR.IOVA(), Length: rpingInfoLen, LKey: e.ctlMR.LKey()}}})
	if err != nil {
		return fmt.Errorf("post recv error: %v", err)
	}
	return nil
}

// sendInfo SENDs send buffer i, holding {addr, rkey, size} of m (or,
// with m nil, whatever it holds: the server's zeroed "go ahead").
func (e *rpingEnd) sendInfo(ctx context.Context, i int, m *ib.MR, size int) error {
	b := e.sendBuf(i)
	for m != nil && e.sending[i] {
		wc, err := e.nextWC(ctx, e.conn.done())
		if err != nil {
			return fmt.Errorf("waiting for the SEND of buffer %d: %w", i, err)
		}
		if wc.Status == ib.WCSuccess && wc.Opcode == ib.WCSend {
			e.sent(wc)
			continue
		}
		e.stash = append(e.stash, wc) // await's
		if wc.Status != ib.WCSuccess {
			return fmt.Errorf("cq completion failed status %s (%d)", wc.Status, int(wc.Status))
		}
	}
	if m != nil {
		binary.BigEndian.PutUint64(b[0:8], m.IOVA())
		binary.BigEndian.PutUint32(b[8:12], m.RKey())
		binary.BigEndian.PutUint32(b[12:16], uint32(size))
	}
	off := uint64(rpingInfoLen * (1 + i))
	err := e.qp.PostSend(ib.SendWR{ID: rpingWRSend | uint64(i)<<8, Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: e.ctlMR.IOVA() + off, Length: rpingInfoLen, LKey: e.ctlMR.LKey()}}})
	if err != nil {
		return fmt.Errorf("post send error: %v", err)
	}
	e.sending[i] = true
	return nil
}

// sent notes a SEND's completion: its buffer may be written again.
func (e *rpingEnd) sent(wc ib.WC) {
	if i := wc.ID >> 8; i < uint64(len(e.sending)) {
		e.sending[i] = false
	}
}

// nextWC is the next completion: a stashed one first, else the CQ's.
func (e *rpingEnd) nextWC(ctx context.Context, done <-chan struct{}) (ib.WC, error) {
	if len(e.stash) > 0 {
		wc := e.stash[0]
		e.stash = e.stash[1:]
		return wc, nil
	}
	var wcs [1]ib.WC
	if _, err := wcWait(ctx, e.cq, wcs[:], done, e.o.ef.timeout); err != nil {
		return ib.WC{}, err
	}
	return wcs[0], nil
}

// rdmaOp posts an RDMA READ or WRITE of n bytes of the sink buffer
// against the peer's advertised buffer.
func (e *rpingEnd) rdmaOp(op ib.WROpcode, n int, addr uint64, rkey uint32) error {
	err := e.qp.PostSend(ib.SendWR{ID: rpingWRRDMA, Opcode: op, Flags: ib.SendSignaled,
		SGL:        []ib.SGE{{Addr: e.rdmaMR.IOVA(), Length: uint32(n), LKey: e.rdmaMR.LKey()}},
		RemoteAddr: addr, RKey: rkey})
	if err != nil {
		return fmt.Errorf("post send error: %v", err)
	}
	return nil
}

// await returns the next completion of opcode want, skipping SEND
// completions (rping counts on none of them), and reposts the receive
// after a RECV as rping's CQ handler does. watch makes the wait end when
// the peer disconnects.
func (e *rpingEnd) await(ctx context.Context, want ib.WCOpcode, watch bool) (ib.WC, error) {
	var done <-chan struct{}
	if watch {
		done = e.conn.done()
	}
	for {
		wc, err := e.nextWC(ctx, done)
		if err != nil {
			if errors.Is(err, errPeerDisconnected) {
				return ib.WC{}, err
			}
			return ib.WC{}, fmt.Errorf("no %v completion within %v (peer gone?)", want, e.o.ef.timeout)
		}
		if wc.Status != ib.WCSuccess {
			return wc, fmt.Errorf("cq completion failed status %s (%d)", wc.Status, int(wc.Status))
		}
		if wc.Opcode == ib.WCSend {
			e.sent(wc)
			continue
		}
		if wc.Opcode == ib.WCRecv {
			if err := e.postRecv(); err != nil {
				return wc, err
			}
			if wc.ByteLen != rpingInfoLen {
				return wc, fmt.Errorf("Received bogus data, size %d", wc.ByteLen)
			}
		}
		if wc.Opcode != want {
			return wc, fmt.Errorf("unexpected %v completion while waiting for %v", wc.Opcode, want)
		}
		return wc, nil
	}
}

// rpingFill writes ping's data into buf as rping_test_client does: the
// "rdma-ping-N: " prefix, then printable characters from start on,
// wrapping from 'z' to 'A', and a final NUL.
func rpingFill(buf []byte, ping int, start byte) {
	i := copy(buf, fmt.Sprintf(rpingMsgFmt, ping))
	for c := start; i < len(buf); i++ {
		buf[i] = c
		if c++; c > 'z' {
			c = 'A'
		}
	}
	buf[len(buf)-1] = 0
}

// cString is buf up to its first NUL, as %s prints a char array.
func cString(buf []byte) []byte {
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		return buf[:i]
	}
	return buf
}

// client is rping_test_client: per ping, advertise the start buffer, wait
// for the server's "go", advertise the sink, wait for "done", compare.
func (e *rpingEnd) client(ctx context.Context, stdout io.Writer) error {
	start := byte('A')
	for ping := 0; e.o.count == 0 || ping < e.o.count; ping++ {
		rpingFill(e.start, ping, start)
		if start++; start > 'z' {
			start = 'A'
		}
		clear(e.rdma)
		if err := e.sendInfo(ctx, 0, e.startMR, e.o.size); err != nil {
			return err
		}
		if _, err := e.await(ctx, ib.WCRecv, true); err != nil {
			return fmt.Errorf("ping %d: waiting for the server's go ahead: %w", ping, err)
		}
		if err := e.sendInfo(ctx, 1, e.rdmaMR, e.o.size); err != nil {
			return err
		}
		if _, err := e.await(ctx, ib.WCRecv, true); err != nil {
			return fmt.Errorf("ping %d: waiting for the server's RDMA WRITE: %w", ping, err)
		}
		if e.o.validate && !bytes.Equal(e.start, e.rdma) {
			i := 0
			for i < len(e.start) && e.start[i] == e.rdma[i] {
				i++
			}
			return fmt.Errorf("data mismatch! (ping %d, byte %d: got %#02x, want %#02x)", ping, i, e.rdma[i], e.start[i])
		}
		if e.o.verbose {
			fmt.Fprintf(stdout, "ping data: %s\n", cString(e.rdma))
		}
	}
	return nil
}

// server is rping_test_server: until the client disconnects, READ its
// start buffer, say go, WRITE the data into its sink, say done.
func (e *rpingEnd) server(ctx context.Context, stdout, stderr io.Writer) error {
	for {
		if _, err := e.await(ctx, ib.WCRecv, true); err != nil {
			if e.ended(err) {
				// rping's two lines when the client has gone.
				fmt.Fprintf(stderr, "server DISCONNECT EVENT...\n")
				fmt.Fprintf(stderr, "wait for RDMA_READ_ADV state %d\n", rpingStateDisconnected)
				return nil
			}
			return err
		}
		addr, rkey, n := e.peerInfo()
		if n > len(e.rdma) {
			return fmt.Errorf("the client's buffer has %d bytes, more than -S %d", n, len(e.rdma))
		}
		if err := e.rdmaOp(ib.WRRDMARead, n, addr, rkey); err != nil {
			return err
		}
		if _, err := e.await(ctx, ib.WCRDMARead, false); err != nil {
			return fmt.Errorf("RDMA READ: %w", err)
		}
		if e.o.verbose {
			fmt.Fprintf(stdout, "server ping data: %s\n", cString(e.rdma[:n]))
		}
		if err := e.sendInfo(ctx, 0, nil, 0); err != nil {
			return err
		}
		if _, err := e.await(ctx, ib.WCRecv, true); err != nil {
			return fmt.Errorf("waiting for the client's sink advert: %w", err)
		}
		addr, rkey, sink := e.peerInfo()
		w := len(cString(e.rdma[:n])) + 1 // strlen + 1, as rping
		w = min(w, n, sink)
		if err := e.rdmaOp(ib.WRRDMAWrite, w, addr, rkey); err != nil {
			return err
		}
		if _, err := e.await(ctx, ib.WCRDMAWrite, false); err != nil {
			return fmt.Errorf("RDMA WRITE: %w", err)
		}
		if err := e.sendInfo(ctx, 0, nil, 0); err != nil {
			return err
		}
	}
}

// ended reports whether a failed wait for the next ping means the client
// has gone: its DREQ arrived, or our "done" SEND failed because the
// client disconnected after its last ping before our ACK reached it (the
// lost ACK's retransmissions meet a QP in ERR); then the DREQ follows, and
// we wait for it up to --timeout.
func (e *rpingEnd) ended(err error) bool {
	if errors.Is(err, errPeerDisconnected) {
		return true
	}
	select {
	case <-e.conn.done():
		return true
	case <-time.After(e.o.ef.timeout):
		return false
	}
}

// peerInfo decodes the received struct rping_rdma_info.
func (e *rpingEnd) peerInfo() (addr uint64, rkey uint32, size int) {
	b := e.recvBuf()
	return binary.BigEndian.Uint64(b[0:8]), binary.BigEndian.Uint32(b[8:12]), int(binary.BigEndian.Uint32(b[12:16]))
}
