package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/oob"
)

func init() {
	register(&command{
		name:    "perf",
		summary: "perftest-compatible benchmarks: perf write|read|send|atomic [--lat] (server, or client with the server's address); perf tcp [--lat]: the same over TCP",
		run:     runPerf,
	})
}

// perfMarker goes in the SRQ-number field of rxed's key messages (perftest
// reads that field only for XRC and DC QPs). Two rxed ends recognise each
// other by it and then validate the exact bytes, which they can only do
// when both sides know the pattern.
const perfMarker = 0x72786564 // "rxed"

// perfQKey is perftest's DEF_QKEY for UD.
const perfQKey = 0x11111111

// perfAllMax is the largest size of a -a sweep (perftest: 2^23).
const perfAllMax = 1 << 23

type perfOpts struct {
	ef   engineFlags
	test oob.Test
	size uint64
	// sizeSet: -s was given. A UD send test without it runs at the
	// negotiated MTU, as perftest's does.
	sizeSet    bool
	iters      uint64
	duration   time.Duration
	qps        int
	all        bool
	conn       ib.QPType
	connName   string
	atomicType string
	gidx       int
	mtu        int // bytes; 0 = the port's active MTU
	gbits      bool
	validate   bool
	txDepth    int
	rxDepth    int
	cqMod      int
	noVersions bool
	wait       time.Duration
	server     string
	progress   time.Duration
	qpTimeout  uint
	events     bool // sleep on CQ events instead of polling (perftest -e)
	// outReads is perftest's -o/--outs: the RDMA READ/atomic depth this
	// side announces in its key (the peer's max_rd_atomic) and accepts as
	// responder (max_dest_rd_atomic). 1 for write and send tests.
	outReads int
	// token is the shared secret of a token-mode rxed serve (--token,
	// --token-file); clients only.
	token []byte
	// rdmaCM is perftest's -R: connect with rdma_cm, exchange over it
	// (perf_rdmacm.go).
	rdmaCM bool
	// listen is the server's --listen: the TCP address of the exchange
	// (listenAddress; "" listens on every address, as perftest).
	listen string
	// tos is perftest's -T/--tos: with -R, the IP TOS the client sets on
	// its test connections (rdma_set_option RDMA_OPTION_ID_TOS; the
	// control connection keeps 0, as perftest's comm params' DEF_TOS).
	tos tosFlag
	// tclass is perftest's --tclass: the traffic class of this side's
	// QPs connected over the TCP exchange (ctx_modify_qp_to_rtr's
	// grh.traffic_class, the AH's for UD).
	tclass tosFlag
}

// perfMaxOutReads is rxe's max_qp_rd_atom, perftest's default -o for read and atomic tests.
const perfMaxOutReads = 128

func parsePerf(args []string, stderr io.Writer) (*perfOpts, int, bool) {
	bad := func(format string, a ...any) (*perfOpts, int, bool) {
		fmt.Fprintf(stderr, "rxed perf: "+format+"\n", a...)
		return nil, 2, false
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stderr, "usage: rxed perf write|read|send|atomic|tcp [--lat] [flags] [SERVER]   (no SERVER: the server; rxed perf TEST -h lists the flags)")
			return nil, 0, false
		}
		return bad("missing test: usage: rxed perf write|read|send|atomic|tcp [--lat] [flags] [SERVER] (the test comes first)")
	}
	o := &perfOpts{}
	switch args[0] {
	case "write":
		o.test.Verb = oob.VerbWrite
	case "read":
		o.test.Verb = oob.VerbRead
	case "send":
		o.test.Verb = oob.VerbSend
	case "atomic":
		o.test.Verb = oob.VerbAtomic
	default:
		return bad("unknown test %q: want write, read, send, atomic or tcp", args[0])
	}
	fs := flag.NewFlagSet("perf "+args[0], flag.ContinueOnError)
	o.ef.register(fs, true)
	o.ef.registerSpin(fs)
	fs.BoolVar(&o.test.Latency, "lat", false, "latency test (ib_*_lat) instead of bandwidth (ib_*_bw)")
	fs.BoolVar(&o.events, "e", false, "sleep on CQ events instead of polling (perftest's -e; polling lets the engine receive in the test's goroutine; the devices still poll while packets flow)")
	var size sizeFlag
	sizeVar(fs, &size, "s", 0, "message `size` in bytes, K/M/G suffixes (default 65536 for bandwidth, 2 for latency; UD bandwidth: the MTU; atomics are 8)")
	iters := fs.Uint64("n", 0, "iterations (default 5000 for write bandwidth, 1000 otherwise)")
	dur := fs.Int("D", 0, "run for this many `seconds` instead of -n (write/read/atomic bandwidth)")
	fs.IntVar(&o.qps, "q", 1, "number of QPs")
	fs.BoolVar(&o.all, "a", false, "run every size from 2 to 2^23 (write/read bandwidth, both sides)")
	connType := fs.String("c", "RC", "connection `type`: RC, UC or UD")
	fs.StringVar(&o.atomicType, "A", "FETCH_AND_ADD", "atomic `type`: CMP_AND_SWAP or FETCH_AND_ADD")
	fs.IntVar(&o.gidx, "x", 0, "local GID `index` (index into the --addr list)")
	fs.IntVar(&o.mtu, "m", 0, "path MTU in bytes (default: the port's active MTU)")
	fs.BoolVar(&o.gbits, "report_gbits", false, "report bandwidth in Gb/sec")
	fs.Bool("F", false, "accepted for compatibility (perftest: do not fail on CPU frequency checks)")
	fs.String("d", "rxed0", "device name (accepted for compatibility)")
	ibPort := fs.Int("i", 1, "device port (only 1)")
	fs.BoolVar(&o.validate, "validate", false, "check the data that arrived (exact bytes when both ends are rxed)")
	fs.IntVar(&o.txDepth, "t", 0, "TX depth (default 128 for bandwidth, 1 for latency)")
	fs.IntVar(&o.rxDepth, "r", 512, "RX depth (send tests)")
	fs.IntVar(&o.cqMod, "Q", 100, "completion moderation: one signaled work request in this many")
	fs.BoolVar(&o.noVersions, "dont_xchg_versions", false, "skip the version exchange (as perftest's flag; both sides)")
	fs.DurationVar(&o.wait, "wait", 0, "server: give up when no client connects within this `duration` (0 waits forever)")
	fs.UintVar(&o.qpTimeout, "qp-timeout", 14, "RC local ACK timeout exponent (4.096 µs * 2^N; perftest uses 14)")
	fs.IntVar(&o.outReads, "o", 0, "outstanding RDMA reads/atomics (read and atomic tests; perftest --outs; default 128)")
	fs.DurationVar(&o.progress, "progress", 2*time.Second, "print a progress line to stderr this often during long runs (0: never)")
	token := fs.String("token", "", "client: the shared `secret` of an rxed serve started with --token/--token-file")
	tokenFile := fs.String("token-file", "", "client: read the shared secret from `file` (trailing newline ignored)")
	fs.StringVar(&o.listen, "listen", "", "server: TCP `address` of the exchange (default: every address, port -p); e.g. 10.0.0.1 or [::1]:18515")
	fs.BoolVar(&o.rdmaCM, "R", false, "connect with rdma_cm (perftest -R): no TCP, the exchange runs over an rdma_cm control connection on port -p")
	tosUsage := "with -R: the IP TOS `value` of the client's test connections, 0..255, e.g. 104 or 0x68 (rdma_set_option RDMA_OPTION_ID_TOS; the server's take the client's)"
	fs.Var(&o.tos, "T", tosUsage)
	fs.Var(&o.tos, "tos", tosUsage+" (same as -T)")
	fs.Var(&o.tclass, "tclass", "traffic class (IP TOS) `value` of this side's QPs connected over TCP, 0..255, e.g. 104 or 0x68 (the AV's, for UD the address handle's; not with -R: use -T)")
	rest, code, ok := parseArgsAnywhere(fs, args[1:], stderr)
	if !ok {
		return nil, code, false
	}
	if tok, err := readToken(*token, *tokenFile); err != nil {
		return bad("%v", err)
	} else {
		o.token = tok
	}
	if len(rest) > 1 {
		return bad("more than one server address: %q", rest)
	}
	if len(rest) == 1 {
		o.server = rest[0]
	}
	// perftest refuses -s 0 ("Message Size should be between 1 and ...").
	if name, ok := explicitZero(fs, "s", "n", "t", "D", "o", "m"); ok {
		return bad("%v", errExplicitZero(name))
	}
	if o.listen != "" {
		if o.server != "" || o.rdmaCM {
			return bad("--listen: only for a TCP server (no server address, no -R)")
		}
		if _, err := listenAddress(o.listen, o.ef.oobPort); err != nil {
			return bad("%v", err)
		}
	}
	if len(o.token) > 0 && (o.server == "" || o.noVersions) {
		return bad("--token: only for a client (give the server's address) that exchanges versions")
	}
	if err := o.ef.check(); err != nil {
		return bad("%v", err)
	}
	if _, err := o.ef.gid("-x", o.gidx); err != nil {
		return bad("%v", err)
	}
	if *ibPort != 1 {
		return bad("-i %d: rxed devices have only port 1", *ibPort)
	}
	switch strings.ToUpper(*connType) {
	case "RC":
		o.conn = ib.RC
	case "UC":
		o.conn = ib.UC
	case "UD":
		o.conn = ib.UD
	default:
		return bad("-c %q: want RC, UC or UD", *connType)
	}
	o.connName = strings.ToUpper(*connType)
	if o.rdmaCM && o.conn != ib.RC {
		return bad("-R: only RC connections (-c RC)")
	}
	// perftest: " TOS only valid for rdma_cm based QP and RawEth QP";
	// --tclass sets the AV of ctx_modify_qp_to_rtr, which -R skips.
	if o.tos.set && !o.rdmaCM {
		return bad("-T %d: the TOS of rdma_cm connections, only with -R (as perftest); --tclass sets the traffic class of QPs connected over TCP", o.tos.v)
	}
	if o.tclass.set && o.rdmaCM {
		// perftest takes it and does nothing with it: a perftest command
		// line with both runs here too, told so.
		fmt.Fprintf(stderr, "rxed perf: --tclass %d has no effect with -R (as in perftest, where it sets only QPs connected over TCP); -T sets the TOS of rdma_cm connections\n", o.tclass.v)
		o.tclass = tosFlag{}
	}
	if o.rdmaCM && len(o.token) > 0 {
		return bad("-R: --token is for serve's TCP exchange; rdma_cm sessions carry no token")
	}
	switch {
	case o.conn == ib.UC && (o.test.Verb == oob.VerbRead || o.test.Verb == oob.VerbAtomic):
		return bad("-c UC: %s needs RC (UC has no reads or atomics)", o.test)
	case o.conn == ib.UD && o.test.Verb != oob.VerbSend:
		return bad("-c UD: only send tests run over UD")
	}
	switch o.atomicType = strings.ToUpper(o.atomicType); o.atomicType {
	case "CMP_AND_SWAP", "FETCH_AND_ADD":
	default:
		return bad("-A %q: want CMP_AND_SWAP or FETCH_AND_ADD", o.atomicType)
	}
	if o.qpTimeout > 31 {
		return bad("--qp-timeout %d: want 0..31", o.qpTimeout)
	}
	if o.mtu != 0 && oob.MTUEnum(o.mtu) == 0 {
		return bad("-m %d: want 256, 512, 1024, 2048 or 4096", o.mtu)
	}
	o.size = uint64(size)
	o.sizeSet = flagSet(fs, "s")
	switch {
	case o.test.Verb == oob.VerbAtomic:
		if o.size != 0 && o.size != 8 {
			return bad("-s %d: atomics are 8 bytes", o.size)
		}
		o.size = 8
	case o.size == 0 && o.test.Latency:
		o.size = 2
	case o.size == 0:
		o.size = 65536
	}
	if o.size > 1<<30 {
		return bad("-s %d: too large (at most 1 GiB)", o.size)
	}
	o.iters = *iters
	if o.iters == 0 {
		o.iters = 1000
		if o.test.Verb == oob.VerbWrite && !o.test.Latency {
			o.iters = 5000
		}
	}
	if o.iters < 5 && o.test.Latency {
		return bad("-n %d: latency tests need at least 5 iterations", o.iters)
	}
	if *dur < 0 {
		return bad("-D %d: negative", *dur)
	}
	o.duration = time.Duration(*dur) * time.Second
	if o.duration > 0 && (o.test.Latency || o.test.Verb == oob.VerbSend) {
		return bad("-D: supported for write, read and atomic bandwidth tests only")
	}
	if o.all && (o.test.Latency || o.test.Verb == oob.VerbSend || o.test.Verb == oob.VerbAtomic) {
		return bad("-a: supported for write and read bandwidth tests only")
	}
	if o.all && o.duration > 0 {
		return bad("-a and -D together are not supported")
	}
	if o.qps < 1 || o.qps > 64 {
		return bad("-q %d: want 1..64", o.qps)
	}
	if o.test.Latency && o.qps != 1 {
		return bad("-q %d: latency tests use one QP", o.qps)
	}
	if o.txDepth == 0 {
		o.txDepth = 128
		if o.test.Latency {
			o.txDepth = 1
		}
	}
	if o.txDepth < 1 || o.txDepth > 8192 {
		return bad("-t %d: want 1..8192", o.txDepth)
	}
	if o.duration == 0 && uint64(o.txDepth) > o.iters {
		o.txDepth = int(o.iters)
	}
	if o.rxDepth < 1 || o.rxDepth > 8192 {
		return bad("-r %d: want 1..8192", o.rxDepth)
	}
	if o.duration == 0 && uint64(o.rxDepth) > o.iters {
		o.rxDepth = int(o.iters)
	}
	if o.cqMod < 1 {
		return bad("-Q %d: must be at least 1", o.cqMod)
	}
	o.cqMod = min(o.cqMod, o.txDepth)
	readLike := o.test.Verb == oob.VerbRead || o.test.Verb == oob.VerbAtomic
	switch {
	case o.outReads == 0 && readLike:
		o.outReads = perfMaxOutReads
	case o.outReads == 0:
		o.outReads = 1
	case !readLike:
		return bad("-o %d: outstanding reads apply to read and atomic tests only", o.outReads)
	case o.outReads < 1 || o.outReads > perfMaxOutReads:
		return bad("-o %d: want 1..%d", o.outReads, perfMaxOutReads)
	}
	return o, 0, true
}

func runPerf(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "tcp" {
		return runPerfTCP(args[1:], stdout, stderr)
	}
	o, code, ok := parsePerf(args, stderr)
	if !ok {
		return code
	}
	if err := perf(context.Background(), o, stdout, stderr); err != nil {
		return fail(stderr, "perf", err)
	}
	return 0
}

// perfQP is one test QP with its slice of the registered buffer.
type perfQP struct {
	qp  *ib.QP
	ah  *ib.AH
	psn uint32
	// Offsets into the buffer: src is what we send or write from (and
	// where READ and atomic results land), target is what we advertise
	// (remote WRITEs, READs and atomics hit it; write_lat polls it), recv
	// holds the receive slots of send tests.
	src, target, recv int
	srcLen            int
	remote            oob.Key
	sge               [1]ib.SGE // the SGL of every WR sendWR builds
}

// perfRun is one side of a perf run.
type perfRun struct {
	o      *perfOpts
	en     *engine
	pd     *ib.PD
	cq     *ib.CQ
	mapm   *mr.Mapping
	buf    []byte
	mr     *ib.MR
	qps    []*perfQP
	mtu    int // negotiated ibv_mtu enum
	slots  int // receive slots per QP (send tests)
	slotSz int
	peer   bool // the peer is rxed (marker seen): exact validation
	// serveExport: the peer is rxed serve (it speaks the rxed extension),
	// whose export perf_serve.go checks against.
	serveExport bool
	wait        *cqWaiter
	stdout      io.Writer
	stderr      io.Writer
}

func (r *perfRun) server() bool { return r.o.server == "" }

// maxSize is the largest message of the run.
func (o *perfOpts) maxSize() int {
	if o.all {
		return perfAllMax
	}
	return int(o.size)
}

func perf(ctx context.Context, o *perfOpts, stdout, stderr io.Writer) (err error) {
	log := o.ef.logger(stderr)
	if o.mtu != 0 {
		o.ef.activeMTU = ib.MTU(oob.MTUEnum(o.mtu)) // -m lowers the port MTU (UD uses it)
	}
	if o.conn == ib.UD && o.size > 4096 {
		if o.sizeSet {
			return fmt.Errorf("-s %d: UD messages must fit the MTU", o.size)
		}
		// No -s: the buffers hold the largest MTU; session lowers the
		// size to the negotiated one.
		o.size = 4096
	}
	o.ef.busyPoll = deviceBusyPoll(o.server == "" && o.test.ServerIdles(), o.events, o.ef.spin)
	en, err := o.ef.open(log)
	if err != nil {
		return err
	}
	r := &perfRun{o: o, en: en, stdout: stdout, stderr: stderr}
	stopWatch := en.closeOnInterrupt(stderr, "perf")
	defer func() {
		stopWatch()
		if cerr := closeEngineAndMemory(r.en, r.mr, r.mapm); err == nil {
			err = cerr
		}
	}()
	if err := r.setup(); err != nil {
		return err
	}
	if o.rdmaCM {
		return r.rdmaCMSession(ctx)
	}
	cfg := &oob.SessionConfig{Options: oob.Options{Timeout: o.ef.timeout, Logger: log}, DontXchgVersions: o.noVersions}
	if !r.server() && !o.noVersions {
		// The rxed extension (a perftest server ignores it): serve's busy
		// and refusal answers, token mode, and the proof of our GID.
		cfg.Ext = &oob.ExtConfig{Token: o.token, Test: &o.test}
	}
	if r.server() {
		// An rxed client announces its test; one that runs another is
		// refused at the version step, both sides saying so (a perftest
		// client announces none and is served as perftest serves it).
		cfg.Test = &o.test
	}
	var sess *oob.Session
	if r.server() {
		addr, _ := listenAddress(o.listen, o.ef.oobPort)
		ln, err := oob.ListenPerftest(addr, cfg)
		if err != nil {
			return err
		}
		if err := oob.WriteWaitingForClient(stdout); err != nil {
			ln.Close()
			return err
		}
		actx, cancel := withWait(ctx, o.wait)
		sess, err = ln.Accept(actx)
		err = waitErr(actx, err)
		cancel()
		ln.Close()
		if err != nil {
			return err
		}
	} else {
		if sess, err = oob.DialPerftest(ctx, oobAddress(o.server, o.ef.oobPort), cfg); err != nil {
			return err
		}
	}
	closed := false
	defer func() {
		if !closed {
			_ = sess.CloseWithoutExchange()
		}
	}()
	return r.session(ctx, sess, &closed)
}

func (r *perfRun) localMTU() int {
	if r.o.mtu != 0 {
		return oob.MTUEnum(r.o.mtu)
	}
	pa, err := r.en.dev.QueryPort(1)
	if err != nil {
		return 5
	}
	return int(pa.ActiveMTU)
}

// session runs everything after the TCP connection is up.
func (r *perfRun) session(ctx context.Context, sess *oob.Session, closed *bool) error {
	o := r.o
	neg, err := sess.Negotiate(ctx, r.localMTU())
	if err != nil {
		return err
	}
	r.mtu = neg.MTU
	if mtu := oob.MTUBytes(r.mtu); o.conn == ib.UD && int(o.size) > mtu && !o.sizeSet {
		// perftest's check_link, when no size was asked for.
		fmt.Fprintf(r.stderr, " Max msg size in UD is MTU %d\n Changing to this MTU\n", mtu)
		o.size = uint64(mtu)
	}
	if o.conn == ib.UD && int(o.size) > oob.MTUBytes(r.mtu) {
		return fmt.Errorf("-s %d: UD messages must fit the negotiated MTU %d", o.size, oob.MTUBytes(r.mtu))
	}
	if err := oob.WriteTestInfo(r.stdout, r.testInfo()); err != nil {
		return err
	}
	locals := make([]oob.Key, len(r.qps))
	for i, q := range r.qps {
		locals[i] = r.key(q)
	}
	remotes, err := sess.Connect(ctx, o.test, locals, r.connect)
	if err != nil {
		return err
	}
	if sess.Ext() {
		r.serveExport = true
		if err := r.proveAddress(ctx, sess, remotes); err != nil {
			return err
		}
	}
	// RoCE: perftest prints the GID line under every address.
	for i := range r.qps {
		_ = oob.WriteAddress(r.stdout, false, o.test.Verb, locals[i], true)
	}
	for i := range r.qps {
		_ = oob.WriteAddress(r.stdout, true, o.test.Verb, remotes[i], true)
	}
	if o.test.Latency {
		_ = oob.WriteLatencyHeader(r.stdout, false)
	} else {
		_ = oob.WriteBWHeader(r.stdout, o.gbits)
	}
	return r.run(ctx, sess, locals[0], closed)
}

// testInfo is the banner perftest prints.
func (r *perfRun) testInfo() oob.TestInfo {
	o := r.o
	ti := oob.TestInfo{Test: o.test, AtomicType: o.atomicType, Server: r.server(), Device: r.en.dev.Name(),
		NumQPs: o.qps, Connection: o.connName, PCIeRelaxOrder: true, TxDepth: o.txDepth, RxDepth: o.rxDepth,
		CQMod: o.cqMod, MTU: r.mtu, GIDIndex: o.gidx, OutReads: o.outReads}
	if o.test.Latency && o.test.Verb == oob.VerbWrite {
		ti.PCIeRelaxOrder = false
	}
	return ti
}

func (r *perfRun) key(q *perfQP) oob.Key {
	gid, _ := r.o.ef.gid("-x", r.o.gidx)
	k := oob.Key{OutReads: uint16(r.o.outReads), QPN: q.qp.Num(), PSN: q.psn, GID: gid.As16(), SRQN: perfMarker}
	if r.o.test.Verb != oob.VerbSend {
		k.RKey = r.mr.RKey()
		k.VAddr = r.mr.IOVA() + uint64(q.target)
	}
	return k
}

func (r *perfRun) setup() error {
	o := r.o
	var err error
	if r.pd, err = r.en.dev.AllocPD(); err != nil {
		return err
	}
	depth := o.txDepth + 1
	if o.test.Verb == oob.VerbSend {
		depth += o.rxDepth
	}
	if r.cq, err = r.en.dev.CreateCQ(min(depth*o.qps, 1<<15-1)); err != nil {
		return err
	}
	size := o.maxSize()
	// Receive slots: one per posted receive, bounded so that big messages
	// don't need gigabytes.
	r.slotSz = size
	if o.conn == ib.UD {
		r.slotSz += ppGRHLen
	}
	r.slots = 1
	if o.test.Verb == oob.VerbSend {
		r.slots = max(1, min(o.rxDepth, (64<<20)/r.slotSz))
		if o.test.Latency {
			r.slots = max(1, min(16, r.slots))
		}
	}
	srcLen := size
	switch o.test.Verb {
	case oob.VerbRead:
		srcLen = 2 * size // alternate destinations, to compare reads
	case oob.VerbAtomic:
		srcLen = 8 * o.txDepth // one result slot per outstanding atomic
	}
	align := func(n int) int { return (n + 4095) &^ 4095 }
	per := align(srcLen) + align(size)
	if o.test.Verb == oob.VerbSend {
		per += align(r.slots * r.slotSz)
	}
	if r.mapm, err = mr.MapAnonymous(per * o.qps); err != nil {
		return err
	}
	r.buf = r.mapm.Bytes()
	access := ib.AccessLocalWrite | ib.AccessRemoteWrite | ib.AccessRemoteRead | ib.AccessRemoteAtomic
	if r.mr, err = r.pd.RegMR(r.buf, access, mr.WithMapping(r.mapm)); err != nil {
		return err
	}
	qpAccess := ib.AccessRemoteWrite | ib.AccessRemoteRead | ib.AccessRemoteAtomic
	if o.conn == ib.UC {
		qpAccess = ib.AccessRemoteWrite
	}
	for i := range o.qps {
		q := &perfQP{psn: rand.Uint32() & 0xffffff, src: i * per, srcLen: srcLen}
		q.target = q.src + align(srcLen)
		q.recv = q.target + align(size)
		// The send queue has room for twice -t: at most -t are outstanding,
		// but a completion can be polled a moment before the engine frees
		// its send queue slot.
		q.qp, err = r.pd.CreateQP(ib.QPInitAttr{Type: o.conn, SendCQ: r.cq, RecvCQ: r.cq,
			Cap: ib.QPCap{MaxSendWR: uint32(min(2*o.txDepth, 8192)), MaxRecvWR: uint32(max(r.slots, 1)), MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return err
		}
		if err := initQP(q.qp, o.conn, perfQKey, qpAccess); err != nil {
			return fmt.Errorf("modifying QP %#x to INIT: %v", q.qp.Num(), err)
		}
		r.qps = append(r.qps, q)
		fillPattern(r.buf[q.src : q.src+size])
		if o.test.Verb == oob.VerbRead {
			fillPattern(r.buf[q.target : q.target+size])
		}
	}
	return nil
}

// connect moves every QP to RTR/RTS towards its remote key and posts the
// receives of send tests (before the barriers, as perftest does).
func (r *perfRun) connect(remotes []oob.Key) error {
	o := r.o
	r.peer = true
	for i, q := range r.qps {
		rk := remotes[i]
		q.remote = rk
		if rk.SRQN != perfMarker {
			r.peer = false
		}
		dgid := netip.AddrFrom16(rk.GID).Unmap()
		if dgid.IsUnspecified() {
			return errors.New("the peer sent an all-zero GID")
		}
		av := ib.AddrVector{DGID: dgid, SGIDIndex: uint8(o.gidx), TrafficClass: o.tclass.v, PortNum: 1, DestPort: uint16(o.ef.port)}
		// As perftest: we accept as many reads as we announced, and issue as
		// many as the peer announced.
		var err error
		q.ah, err = connectQP(r.pd, q.qp, o.conn, qpPath{av: av, mtu: ib.MTU(r.mtu), destQPN: rk.QPN, rqPSN: rk.PSN, sqPSN: q.psn,
			timeout: uint8(o.qpTimeout), maxDestRdAtom: uint8(o.outReads), maxRdAtomic: uint8(min(max(int(rk.OutReads), 1), perfMaxOutReads))})
		if err != nil {
			return err
		}
		if o.test.Verb == oob.VerbSend {
			for s := range r.slots {
				if err := r.postRecv(q, s); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (r *perfRun) postRecv(q *perfQP, slot int) error {
	off := q.recv + slot*r.slotSz
	clear(r.buf[off : off+r.slotSz])
	wr := ib.RecvWR{ID: uint64(slot), SGL: []ib.SGE{{Addr: r.mr.IOVA() + uint64(off), Length: uint32(r.slotSz), LKey: r.mr.LKey()}}}
	if err := q.qp.PostRecv(wr); err != nil {
		return fmt.Errorf("posting a receive on QP %#x: %v", q.qp.Num(), err)
	}
	return nil
}

// fillPattern writes the data pattern both rxed ends know: byte j depends
// on j only, so any prefix of a bigger message is a smaller message.
func fillPattern(b []byte) {
	for j := range b {
		b[j] = patternByte(j)
	}
}

func patternByte(j int) byte { return byte(j*131+j>>8+j>>16) ^ 0xa5 }

// checkPattern returns the first offset where b differs from the pattern,
// or -1.
func checkPattern(b []byte) int {
	for j, c := range b {
		if c != patternByte(j) {
			return j
		}
	}
	return -1
}

// proveAddress answers rxed serve's address proof: the server may have
// RDMA-WRITTEN a nonce into our first buffer to check that the GID we
// announced is ours; we echo what is there and get the export's rkey and
// address, which its key messages left out.
func (r *perfRun) proveAddress(ctx context.Context, sess *oob.Session, remotes []oob.Key) error {
	var nonce [16]byte
	q0 := r.qps[0]
	for i := range nonce {
		nonce[i] = atomicLoadByte(r.buf, q0.target+i)
	}
	g, err := sess.ProveAddress(ctx, nonce)
	if err != nil {
		return err
	}
	if err := r.checkExportFits(g); err != nil {
		return err
	}
	for i, q := range r.qps {
		q.remote.RKey, q.remote.VAddr = g.RKey, g.VAddr
		remotes[i].RKey, remotes[i].VAddr = g.RKey, g.VAddr
	}
	return nil
}

// readToken returns the shared secret of --token or --token-file.
func readToken(token, file string) ([]byte, error) {
	switch {
	case token != "" && file != "":
		return nil, errors.New("--token and --token-file: give one")
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		b = []byte(strings.TrimRight(string(b), "\r\n"))
		if len(b) == 0 {
			return nil, fmt.Errorf("--token-file %s: empty", file)
		}
		return b, nil
	}
	return []byte(token), nil
}
