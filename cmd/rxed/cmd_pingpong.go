package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/oob"
)

func init() {
	register(&command{
		name:    "pingpong",
		summary: "ping-pong SENDs like ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong (server, or client with the server's address)",
		run:     runPingpong,
	})
}

// Work request IDs of the pingpong loop, as in rdma-core's examples.
const (
	ppRecvWRID = 1
	ppSendWRID = 2
)

// ppGRHLen is the room a UD receive leaves for the GRH in front of the
// payload (ibv_ud_pingpong's "+ 40").
const ppGRHLen = 40

// ppQKey is the Q_Key ibv_ud_pingpong uses.
const ppQKey = 0x11111111

// ppPage is the stride of the bytes ibv_*_pingpong -c checks.
const ppPage = 4096

type pingpongOpts struct {
	ef        engineFlags
	typ       ib.QPType
	size      uint
	mtu       ib.MTU
	rx        uint
	iters     uint
	sl        uint
	events    bool
	gidx      int
	chk       bool
	wait      time.Duration
	qpTimeout uint
	server    string // "" for the server side
	listen    string // the server's --listen (listenAddress)
}

func parsePingpong(args []string, stderr io.Writer) (*pingpongOpts, int, bool) {
	o := &pingpongOpts{}
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	o.ef.register(fs, true)
	o.ef.registerSpin(fs)
	typ := fs.String("t", "rc", "QP `type`: rc, uc or ud (which of ibv_{rc,uc,ud}_pingpong to mirror)")
	fs.StringVar(typ, "type", "rc", "same as -t")
	fs.String("d", "rxed0", "device name (accepted for compatibility; rxed has one device)")
	ibPort := fs.Int("i", 1, "device port (only 1)")
	var size sizeFlag
	sizeVar(fs, &size, "s", 4096, "message `size` in bytes, K/M/G suffixes (ud: default 2048)")
	mtu := fs.Int("m", 1024, "path MTU in bytes: 256, 512, 1024, 2048 or 4096")
	fs.UintVar(&o.rx, "r", 500, "receives to post at a time (rx depth)")
	fs.UintVar(&o.iters, "n", 1000, "number of exchanges")
	fs.UintVar(&o.sl, "l", 0, "service level (0..15)")
	fs.BoolVar(&o.events, "e", false, "sleep on CQ events instead of polling (as the tools' -e; the device still polls while packets flow)")
	fs.IntVar(&o.gidx, "g", 0, "local GID `index` (index into the --addr list)")
	fs.BoolVar(&o.chk, "c", false, "validate received buffers (as the tools' -c/--chk)")
	fs.BoolVar(&o.chk, "chk", false, "same as -c")
	fs.DurationVar(&o.wait, "wait", 0, "server: give up when no client connects within this `duration` (0 waits forever, like the tools)")
	fs.UintVar(&o.qpTimeout, "qp-timeout", 14, "RC local ACK timeout exponent (4.096 µs * 2^N; the tools use 14)")
	fs.StringVar(&o.listen, "listen", "", "server: TCP `address` of the exchange (default: every address, port -p, as the tools); e.g. 10.0.0.1 or [::1]:18515")
	rest, code, ok := parseArgsAnywhere(fs, args, stderr)
	if !ok {
		return nil, code, false
	}
	o.size = uint(min(uint64(size), 1<<31))
	sizeSet, mtuSet := false, false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "s":
			sizeSet = true
		case "m":
			mtuSet = true
		}
	})
	bad := func(format string, a ...any) (*pingpongOpts, int, bool) {
		fmt.Fprintf(stderr, "rxed pingpong: "+format+"\n", a...)
		return nil, 2, false
	}
	switch strings.ToLower(*typ) {
	case "rc":
		o.typ = ib.RC
	case "uc":
		o.typ = ib.UC
	case "ud":
		o.typ = ib.UD
		if !sizeSet {
			o.size = 2048
		}
	default:
		return bad("-t %q: want rc, uc or ud", *typ)
	}
	if *ibPort != 1 {
		return bad("-i %d: rxed devices have only port 1", *ibPort)
	}
	m, err := mtuEnum(*mtu)
	if err != nil {
		return bad("-m: %v", err)
	}
	o.mtu = m
	if o.typ == ib.UD {
		// UD messages use the port's active MTU, 4096 like rxe on a
		// jumbo-frame link unless -m lowers it.
		if !mtuSet {
			o.mtu = ib.MTU4096
		}
		o.ef.activeMTU = o.mtu
	}
	switch {
	case len(rest) > 1:
		return bad("more than one server address: %q", rest)
	case o.size == 0:
		return bad("-s 0: size must be at least 1")
	case o.size > 1<<30:
		return bad("-s %d: too large", uint64(size))
	case o.sl > 15:
		return bad("-l %d: service level must be 0..15", o.sl)
	case o.iters == 0:
		return bad("-n 0: need at least one iteration")
	case o.qpTimeout > 31:
		return bad("--qp-timeout %d: want 0..31", o.qpTimeout)
	case o.rx == 0 || o.rx > 8192:
		return bad("-r %d: rx depth must be 1..8192", o.rx)
	case o.typ == ib.UD && int(o.size) > o.mtu.Bytes():
		return bad("-s %d: requested size larger than the port MTU %d (ud)", o.size, o.mtu.Bytes())
	}
	if err := o.ef.check(); err != nil {
		return bad("%v", err)
	}
	if _, err := o.ef.gid("-g", o.gidx); err != nil {
		return bad("%v", err)
	}
	if len(rest) == 1 {
		o.server = rest[0]
	}
	if o.listen != "" {
		if o.server != "" {
			return bad("--listen: only for the server (no server address)")
		}
		if _, err := listenAddress(o.listen, o.ef.oobPort); err != nil {
			return bad("%v", err)
		}
	}
	return o, 0, true
}

// mtuEnum converts an MTU in bytes to the ibv_mtu enum.
func mtuEnum(bytes int) (ib.MTU, error) {
	if e := oob.MTUEnum(bytes); e != 0 {
		return ib.MTU(e), nil
	}
	return 0, fmt.Errorf("%d is not 256, 512, 1024, 2048 or 4096", bytes)
}

func runPingpong(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parsePingpong(args, stderr)
	if !ok {
		return code
	}
	if err := pingpong(context.Background(), o, stdout, stderr); err != nil {
		return fail(stderr, "pingpong", err)
	}
	return 0
}

// oobAddress joins host and the -p port for dialing, bracketing IPv6.
func oobAddress(host string, port uint) string {
	return net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
}

// ppSide is one end of a pingpong run.
type ppSide struct {
	o     *pingpongOpts
	en    *engine
	pd    *ib.PD
	cq    *ib.CQ
	qp    *ib.QP
	mapm  *mr.Mapping
	buf   []byte
	mr    *ib.MR
	ah    *ib.AH
	rqpn  uint32
	local oob.PingpongDest
}

func pingpong(ctx context.Context, o *pingpongOpts, stdout, stderr io.Writer) (err error) {
	log := o.ef.logger(stderr)
	o.ef.busyPoll = deviceBusyPoll(false, o.events, o.ef.spin)
	en, err := o.ef.open(log)
	if err != nil {
		return err
	}
	s := &ppSide{o: o, en: en}
	stopWatch := en.closeOnInterrupt(stderr, "pingpong")
	defer func() {
		stopWatch()
		if cerr := s.close(); err == nil {
			err = cerr
		}
	}()
	if err := s.setup(); err != nil {
		return err
	}
	oopts := &oob.Options{Timeout: o.ef.timeout, Logger: log}
	// The server listens before printing its address, so whoever reads
	// the address line can connect at once.
	var ln *oob.PingpongListener
	if o.server == "" {
		addr, _ := listenAddress(o.listen, o.ef.oobPort)
		if ln, err = oob.ListenPingpong(addr, oopts); err != nil {
			return err
		}
		defer ln.Close()
	}
	if err := oob.WritePingpongAddress(stdout, false, s.local, o.typ == ib.UD); err != nil {
		return err
	}
	var remote oob.PingpongDest
	if o.server != "" {
		remote, err = oob.DialPingpong(ctx, oobAddress(o.server, o.ef.oobPort), s.local, s.connect, oopts)
	} else {
		actx, cancel := withWait(ctx, o.wait)
		remote, err = ln.Exchange(actx, s.local, s.connect)
		err = waitErr(actx, err)
		cancel()
	}
	if err != nil {
		return err
	}
	if err := oob.WritePingpongAddress(stdout, true, remote, false); err != nil {
		return err
	}
	start := time.Now()
	if err := s.loop(ctx); err != nil {
		return err
	}
	if err := oob.WritePingpongSummary(stdout, uint32(o.size), uint32(o.iters), time.Since(start)); err != nil {
		return err
	}
	if o.typ == ib.RC {
		s.linger(ctx)
	}
	return nil
}

// linger keeps the QP answering after the last completion. Our ACK of
// the peer's last message may have been lost; the peer then retransmits
// it, and had we gone it would end in RETRY_EXC_ERR although everything
// arrived (ibv_rc_pingpong has the same race; loss makes it show). So we
// stay until nothing has arrived for two retransmit timeouts (a waiting
// peer resends within one), at most retry_cnt+1 timeouts longer.
func (s *ppSide) linger(ctx context.Context) {
	if s.o.qpTimeout == 0 {
		return // the peer has no retransmit timer to wait for
	}
	t := time.Duration(4096<<s.o.qpTimeout) * time.Nanosecond
	quiet := 2*t + 10*time.Millisecond
	deadline := time.Now().Add(8*t + quiet)
	last := s.en.dev.Counters()["rcvd_pkts"]
	lastChange := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for time.Since(lastChange) < quiet && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if n := s.en.dev.Counters()["rcvd_pkts"]; n != last {
			last, lastChange = n, time.Now()
		}
	}
}

func (s *ppSide) setup() error {
	o := s.o
	var err error
	if s.pd, err = s.en.dev.AllocPD(); err != nil {
		return err
	}
	if s.cq, err = s.en.dev.CreateCQ(int(o.rx) + 1); err != nil {
		return err
	}
	n := int(o.size)
	if o.typ == ib.UD {
		n += ppGRHLen
	}
	if s.mapm, err = mr.MapAnonymous(n); err != nil {
		return err
	}
	s.buf = s.mapm.Bytes()
	// The tools fill the buffer with 0x7b; with -c the client zeroes the
	// first byte of every page, which is what both sides then check.
	for i := range s.buf {
		s.buf[i] = 0x7b
	}
	if o.chk {
		payload := s.payload()
		for i := 0; i < len(payload); i += ppPage {
			payload[i] = 0
		}
	}
	if s.mr, err = s.pd.RegMR(s.buf, ib.AccessLocalWrite, mr.WithMapping(s.mapm)); err != nil {
		return err
	}
	s.qp, err = s.pd.CreateQP(ib.QPInitAttr{Type: o.typ, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: ib.QPCap{MaxSendWR: 2, MaxRecvWR: uint32(o.rx), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return err
	}
	if err := initQP(s.qp, o.typ, ppQKey, 0); err != nil {
		return fmt.Errorf("modifying the QP to INIT: %v", err)
	}
	if err := s.postRecvs(int(o.rx)); err != nil {
		return err
	}
	gid, _ := s.o.ef.gid("-g", o.gidx)
	// An IPv4 address's GID is its IPv4-mapped IPv6 form, as rxe's.
	s.local = oob.PingpongDest{QPN: s.qp.Num(), PSN: rand.Uint32() & 0xffffff, GID: gid.As16()}
	return nil
}

// payload is the part of the buffer a message occupies.
func (s *ppSide) payload() []byte {
	if s.o.typ == ib.UD {
		return s.buf[ppGRHLen : ppGRHLen+int(s.o.size)]
	}
	return s.buf[:s.o.size]
}

func (s *ppSide) postRecvs(n int) error {
	wr := ib.RecvWR{ID: ppRecvWRID, SGL: []ib.SGE{{Addr: s.mr.IOVA(), Length: uint32(len(s.buf)), LKey: s.mr.LKey()}}}
	for range n {
		if err := s.qp.PostRecv(wr); err != nil {
			return fmt.Errorf("posting a receive: %v", err)
		}
	}
	return nil
}

// connect moves the QP to RTR and RTS with the attributes of rdma-core's
// pp_connect_ctx.
func (s *ppSide) connect(remote oob.PingpongDest) error {
	o := s.o
	dgid := netip.AddrFrom16(remote.GID).Unmap()
	if dgid.IsUnspecified() {
		return errors.New("the peer sent an all-zero GID (start it with -g)")
	}
	av := ib.AddrVector{DGID: dgid, SGIDIndex: uint8(o.gidx), SL: uint8(o.sl), PortNum: 1, DestPort: uint16(o.ef.port)}
	ah, err := connectQP(s.pd, s.qp, o.typ, qpPath{av: av, mtu: o.mtu, destQPN: remote.QPN, rqPSN: remote.PSN, sqPSN: s.local.PSN,
		timeout: uint8(o.qpTimeout), maxDestRdAtom: 1, maxRdAtomic: 1})
	s.ah, s.rqpn = ah, remote.QPN
	return err
}

func (s *ppSide) postSend() error {
	p := s.payload()
	wr := ib.SendWR{ID: ppSendWRID, Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: s.mr.IOVA() + uint64(len(s.buf)-len(p)), Length: uint32(len(p)), LKey: s.mr.LKey()}}}
	if s.o.typ == ib.UD {
		ib.UDSend(&wr, s.ah, s.rqpn, ppQKey)
	}
	if err := s.qp.PostSend(wr); err != nil {
		return fmt.Errorf("couldn't post send: %v", err)
	}
	return nil
}

// loop is the tools' main loop: the client sends first; each side sends
// its next message once its previous send completed and a message
// arrived, until both counts reach -n.
func (s *ppSide) loop(ctx context.Context) error {
	o := s.o
	routs := int(o.rx)
	pending := ppRecvWRID
	if o.server != "" {
		if err := s.postSend(); err != nil {
			return err
		}
		pending |= ppSendWRID
	}
	var wcs [2]ib.WC
	rcnt, scnt := 0, 0
	for rcnt < int(o.iters) || scnt < int(o.iters) {
		n, err := nextCompletions(ctx, s.cq, wcs[:], o.events, o.ef.spin, o.ef.timeout)
		if err != nil {
			return fmt.Errorf("no completion within %v after %d sends and %d receives of %d (peer gone?)", o.ef.timeout, scnt, rcnt, o.iters)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != ib.WCSuccess {
				return fmt.Errorf("failed status %s (%d) for wr_id %d", wc.Status, int(wc.Status), wc.ID)
			}
			switch wc.ID {
			case ppSendWRID:
				scnt++
			case ppRecvWRID:
				if o.chk {
					if err := s.validate(wc, rcnt); err != nil {
						return err
					}
				}
				routs--
				if routs <= 1 {
					if err := s.postRecvs(int(o.rx) - routs); err != nil {
						return err
					}
					routs = int(o.rx)
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", wc.ID)
			}
			pending &^= int(wc.ID)
			if scnt < int(o.iters) && pending == 0 {
				if err := s.postSend(); err != nil {
					return err
				}
				pending = ppRecvWRID | ppSendWRID
			}
		}
	}
	return nil
}

// validate checks a received message: its length, and the tools' -c
// pattern (0 at every page start, 0x7b elsewhere).
func (s *ppSide) validate(wc ib.WC, i int) error {
	want := uint32(s.o.size)
	if s.o.typ == ib.UD {
		want += ppGRHLen
	}
	if wc.ByteLen != want {
		return fmt.Errorf("validation: message %d has %d bytes, want %d", i, wc.ByteLen, want)
	}
	for j, b := range s.payload() {
		exp := byte(0x7b)
		if j%ppPage == 0 {
			exp = 0
		}
		if b != exp {
			return fmt.Errorf("validation: message %d byte %d is %#02x, want %#02x (invalid data in page %d)", i, j, b, exp, j/ppPage)
		}
	}
	return nil
}

func (s *ppSide) close() error {
	return closeEngineAndMemory(s.en, s.mr, s.mapm)
}
