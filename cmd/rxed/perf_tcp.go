package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rxed/rxed/pkg/oob"
)

// rxed perf tcp is qperf's tcp_lat and tcp_bw in perftest's tables: the
// same two processes (or hosts) and message size as an `rxed perf` run,
// over a plain TCP connection (Go's net.TCPConn, TCP_NODELAY), so an
// operator weighs rxed against what they would use instead on their own
// machines (issue 14). The in-process TCP baselines of test/e2e pass each
// message between two goroutines of one process, which on loopback the
// Go runtime does on one thread; two processes pay a thread wake-up per
// message instead (docs/performance.md, session T).
//
// The exchange is rxed's own (neither perftest nor qperf speak it): the
// client sends a hello, the server checks it and answers, then
//
//	--lat  the client sends -s bytes, the server echoes them, -n times;
//	       each side takes a timestamp per iteration and reports, as
//	       perftest's send_lat does, half the differences of consecutive
//	       ones (one way); with --reply N the server answers each request
//	       with N bytes instead and the full round trip is reported, as
//	       read_lat does (-s 8 --reply 4096 is what one 4 KiB RDMA READ,
//	       or a key-value GET, replaces)
//	bw     the client streams -n messages of -s bytes, the server reads
//	       them all and answers with one byte; the client reports the
//	       bandwidth from its first write to that byte, the server from
//	       the end of the first message to the end of the last (perftest's
//	       MB/s: 2^20 bytes)

// tcpHello is the client's first message: tcpMagic, the test ('L'
// latency, 'B' bandwidth), three zero bytes, the message size and the
// reply size (uint32 each; the reply 0 for bandwidth) and the iterations
// (uint64), big-endian.
type tcpHello struct {
	kind  byte
	size  uint32
	reply uint32 // latency: the server's answer to each message (size for a ping-pong)
	iters uint64
}

const (
	tcpMagic  = "rxedtcp1"
	tcpAccept = "rxedtcpK" // the server's answer to a hello it takes

	// The hello's fields (byte offsets; helloKind+1..helloSize are zero).
	helloKind   = 8
	helloSize   = 12
	helloReply  = 16
	helloIters  = 20
	tcpHelloLen = 28
)

// appendTCPHello appends h's wire form to b.
func appendTCPHello(b []byte, h tcpHello) []byte {
	b = append(b, tcpMagic...)
	b = append(b, h.kind, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, h.size)
	b = binary.BigEndian.AppendUint32(b, h.reply)
	return binary.BigEndian.AppendUint64(b, h.iters)
}

// parseTCPHello parses and checks a hello: what a server accepts.
func parseTCPHello(b []byte) (tcpHello, error) {
	if len(b) != tcpHelloLen || string(b[:helloKind]) != tcpMagic {
		return tcpHello{}, errors.New("not an rxed perf tcp client (bad hello)")
	}
	h := tcpHello{kind: b[helloKind], size: binary.BigEndian.Uint32(b[helloSize:]),
		reply: binary.BigEndian.Uint32(b[helloReply:]), iters: binary.BigEndian.Uint64(b[helloIters:])}
	if b[helloKind+1] != 0 || b[helloKind+2] != 0 || b[helloKind+3] != 0 {
		return tcpHello{}, errors.New("hello: reserved bytes are not zero")
	}
	if h.kind != 'L' && h.kind != 'B' {
		return tcpHello{}, fmt.Errorf("hello: unknown test %q", h.kind)
	}
	if err := checkTCPTest(h.kind == 'L', uint64(h.size), h.iters); err != nil {
		return tcpHello{}, fmt.Errorf("hello: %v", err)
	}
	if err := checkTCPReply(h.kind == 'L', uint64(h.reply)); err != nil {
		return tcpHello{}, fmt.Errorf("hello: %v", err)
	}
	return h, nil
}

// tcpMaxSize bounds -s: one message is held in memory on each side.
const tcpMaxSize = 1 << 30

// checkTCPTest is what both the flags and a hello must satisfy.
func checkTCPTest(lat bool, size, iters uint64) error {
	switch {
	case size < 1 || size > tcpMaxSize:
		return fmt.Errorf("-s %d: want 1..%d", size, tcpMaxSize)
	case lat && iters < 5:
		return fmt.Errorf("-n %d: latency tests need at least 5 iterations", iters)
	case iters < 1:
		return fmt.Errorf("-n %d: must be positive", iters)
	}
	return nil
}

// checkTCPReply: a latency test's reply is a message (1..tcpMaxSize), a
// stream has none.
func checkTCPReply(lat bool, reply uint64) error {
	switch {
	case lat && (reply < 1 || reply > tcpMaxSize):
		return fmt.Errorf("--reply %d: want 1..%d", reply, tcpMaxSize)
	case !lat && reply != 0:
		return fmt.Errorf("--reply %d: only for latency tests (--lat)", reply)
	}
	return nil
}

// String is h as the flags that ask for it.
func (h tcpHello) String() string {
	if h.kind == 'L' {
		return fmt.Sprintf("--lat -s %d --reply %d -n %d", h.size, h.reply, h.iters)
	}
	return fmt.Sprintf("-s %d -n %d", h.size, h.iters)
}

type perfTCPOpts struct {
	hello tcpHello
	// testGiven: the test's flags (--lat, -s, -n, --reply) were given. A
	// server started without them runs the test its client asks for; one
	// started with them refuses any other, as perftest's sides must agree.
	testGiven bool
	port      uint
	listen    string
	server    string // the server's address: this side is the client
	wait      time.Duration
	timeout   time.Duration
	gbits     bool
	validate  bool
}

func parsePerfTCP(args []string, stderr io.Writer) (*perfTCPOpts, int, bool) {
	bad := func(format string, a ...any) (*perfTCPOpts, int, bool) {
		fmt.Fprintf(stderr, "rxed perf tcp: "+format+"\n", a...)
		return nil, 2, false
	}
	o := &perfTCPOpts{}
	fs := flag.NewFlagSet("perf tcp", flag.ContinueOnError)
	lat := fs.Bool("lat", false, "latency (ping-pong, as send_lat) instead of bandwidth (a stream, as write_bw)")
	var size sizeFlag
	sizeVar(fs, &size, "s", 0, "message `size` in bytes, K/M/G suffixes (default 65536 for bandwidth, 2 for latency, as perf)")
	iters := fs.Uint64("n", 0, "iterations (default 5000 for bandwidth, 1000 for latency)")
	var reply sizeFlag
	sizeVar(fs, &reply, "reply", 0, "latency: the server answers each message with this many `bytes` (a request/response, reported as a round trip as read_lat does; default: -s, a ping-pong reported one way)")
	fs.UintVar(&o.port, "p", oob.DefaultPort, "TCP `port` of the test connection")
	fs.StringVar(&o.listen, "listen", "", "server: the `address` to listen on (default: every address, port -p); e.g. 10.0.0.1 or [::1]:18515")
	fs.DurationVar(&o.wait, "wait", 0, "server: give up when no client connects within this `duration` (0 waits forever)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "client: connecting and the hello's answer must take less than this `duration`")
	fs.BoolVar(&o.gbits, "report_gbits", false, "report bandwidth in Gb/sec")
	fs.BoolVar(&o.validate, "validate", false, "server: check every byte of the stream or ping (the client sends perf's pattern)")
	rest, code, ok := parseArgsAnywhere(fs, args, stderr)
	if !ok {
		return nil, code, false
	}
	if len(rest) > 1 {
		return bad("more than one server address: %q", rest)
	}
	if len(rest) == 1 {
		o.server = rest[0]
	}
	for _, name := range []string{"lat", "s", "n", "reply"} {
		o.testGiven = o.testGiven || flagSet(fs, name)
	}
	if name, ok := explicitZero(fs, "s", "n", "reply"); ok {
		return bad("%v", errExplicitZero(name))
	}
	if err := checkOOBPort(o.port); err != nil {
		return bad("%v", err)
	}
	if o.listen != "" {
		if o.server != "" {
			return bad("--listen: only for the server (no server address)")
		}
		if _, err := listenAddress(o.listen, o.port); err != nil {
			return bad("%v", err)
		}
	}
	o.hello = tcpHello{kind: 'B', iters: *iters}
	s := uint64(size)
	if *lat {
		o.hello.kind = 'L'
		s = cmp.Or(s, 2)
		o.hello.iters = cmp.Or(o.hello.iters, 1000)
	} else {
		s = cmp.Or(s, 65536)
		o.hello.iters = cmp.Or(o.hello.iters, 5000)
	}
	if err := checkTCPTest(*lat, s, o.hello.iters); err != nil {
		return bad("%v", err)
	}
	r := uint64(reply)
	if *lat {
		r = cmp.Or(r, s)
	}
	if err := checkTCPReply(*lat, r); err != nil {
		return bad("%v", err)
	}
	o.hello.reply = uint32(r)
	o.hello.size = uint32(s)
	return o, 0, true
}

func runPerfTCP(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parsePerfTCP(args, stderr)
	if !ok {
		return code
	}
	if err := perfTCP(context.Background(), o, stdout); err != nil {
		return fail(stderr, "perf tcp", err)
	}
	return 0
}

// perfTCP runs one side: the server when no server address was given.
func perfTCP(ctx context.Context, o *perfTCPOpts, stdout io.Writer) error {
	var c *net.TCPConn
	var h tcpHello
	var err error
	if o.server == "" {
		c, h, err = acceptTCPTest(ctx, o, stdout)
	} else {
		h = o.hello
		c, err = dialTCPTest(ctx, o)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetNoDelay(true); err != nil {
		return err
	}
	writeTCPBanner(stdout, o, h, c)
	if h.kind == 'L' {
		return tcpLatency(c, h, o, stdout)
	}
	return tcpBandwidth(c, h, o, stdout)
}

// acceptTCPTest listens, takes one client and its hello, and answers it.
func acceptTCPTest(ctx context.Context, o *perfTCPOpts, stdout io.Writer) (*net.TCPConn, tcpHello, error) {
	addr, _ := listenAddress(o.listen, o.port)
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, tcpHello{}, err
	}
	defer ln.Close()
	if err := oob.WriteWaitingForClient(stdout); err != nil {
		return nil, tcpHello{}, err
	}
	actx, cancel := withWait(ctx, o.wait)
	defer cancel()
	stop := context.AfterFunc(actx, func() { ln.Close() })
	nc, err := ln.Accept()
	stop()
	if err = waitErr(actx, err); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err() // interrupted: the listener was closed for it
		}
		return nil, tcpHello{}, err
	}
	c := nc.(*net.TCPConn)
	var b [tcpHelloLen]byte
	_ = c.SetReadDeadline(time.Now().Add(max(o.timeout, time.Second)))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return nil, tcpHello{}, fmt.Errorf("reading the client's hello: %v", err)
	}
	h, err := parseTCPHello(b[:])
	if err == nil && o.testGiven && h != o.hello {
		err = fmt.Errorf("asked for %v; this server runs %v (give both sides the same --lat, -s, -n and --reply, or none of them to the server)", h, o.hello)
	}
	if err != nil {
		c.Close()
		return nil, tcpHello{}, fmt.Errorf("client %v: %v", c.RemoteAddr(), err)
	}
	_ = c.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(c, tcpAccept); err != nil {
		c.Close()
		return nil, tcpHello{}, err
	}
	return c, h, nil
}

// dialTCPTest connects to the server and has it accept o's hello.
func dialTCPTest(ctx context.Context, o *perfTCPOpts) (*net.TCPConn, error) {
	dctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", oobAddress(o.server, o.port))
	if err != nil {
		return nil, err
	}
	c := nc.(*net.TCPConn)
	_ = c.SetDeadline(time.Now().Add(o.timeout))
	var ans [len(tcpAccept)]byte
	_, err = c.Write(appendTCPHello(nil, o.hello))
	if err == nil {
		_, err = io.ReadFull(c, ans[:])
	}
	if err != nil || string(ans[:]) != tcpAccept {
		c.Close()
		return nil, fmt.Errorf("%s did not accept the test (not an rxed perf tcp server, or it refused the parameters: see its output)", c.RemoteAddr())
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// writeTCPBanner prints what perftest's banner would say of this run.
func writeTCPBanner(w io.Writer, o *perfTCPOpts, h tcpHello, c *net.TCPConn) {
	what := "bandwidth (a stream, as write_bw)"
	switch {
	case h.kind == 'L' && h.pingPong():
		what = "latency (ping-pong, as send_lat: one way)"
	case h.kind == 'L':
		what = fmt.Sprintf("latency (request of %d bytes, reply of %d, as read_lat: round trip)", h.size, h.reply)
	}
	fmt.Fprintf(w, "%s                    TCP %s\n", oob.ResultLine, what)
	fmt.Fprintf(w, " Connection type : TCP (Go net.TCPConn, TCP_NODELAY)\n")
	fmt.Fprintf(w, " local address: %v remote address: %v\n", c.LocalAddr(), c.RemoteAddr())
	if h.kind == 'L' {
		_ = oob.WriteLatencyHeader(w, false)
	} else {
		_ = oob.WriteBWHeader(w, o.gbits)
	}
}

// pingPong reports whether each reply is the size of its request: a
// ping-pong, reported one way as send_lat does; otherwise a request and
// its reply are reported as one round trip, as read_lat does.
func (h tcpHello) pingPong() bool { return h.reply == h.size }

// tcpLatency is the ping-pong or request/response: the client writes
// first, the server answers each message.
func tcpLatency(c *net.TCPConn, h tcpHello, o *perfTCPOpts, w io.Writer) error {
	client := o.server != ""
	req, reply := make([]byte, h.size), make([]byte, h.reply)
	if client {
		fillPattern(req) // what the server's --validate checks
	}
	stamps := make([]time.Duration, 0, h.iters)
	start := time.Now()
	for i := range h.iters {
		if !client {
			if _, err := io.ReadFull(c, req); err != nil {
				return fmt.Errorf("iteration %d: reading the request: %v", i, err)
			}
			if o.validate {
				if j := checkPattern(req); j >= 0 {
					return fmt.Errorf("validation: iteration %d: byte %d is %#02x, want %#02x", i, j, req[j], patternByte(j))
				}
			}
		}
		stamps = append(stamps, time.Since(start))
		out := req
		if !client {
			out = reply
		}
		if _, err := c.Write(out); err != nil {
			return fmt.Errorf("iteration %d: writing: %v", i, err)
		}
		if client {
			if _, err := io.ReadFull(c, reply); err != nil {
				return fmt.Errorf("iteration %d: reading the reply: %v", i, err)
			}
		}
	}
	factor := 1
	if h.pingPong() {
		factor = 2
	}
	st, err := oob.ComputeLatency(diffs(stamps), factor)
	if err != nil {
		return err
	}
	if err := oob.WriteLatencyResult(w, uint64(h.size), int(h.iters), st); err != nil {
		return err
	}
	_, err = io.WriteString(w, oob.ResultLine)
	return err
}

// diffs are the differences of consecutive stamps (perftest's latency
// samples).
func diffs(stamps []time.Duration) []time.Duration {
	d := make([]time.Duration, 0, max(len(stamps)-1, 0))
	for i := 1; i < len(stamps); i++ {
		d = append(d, stamps[i]-stamps[i-1])
	}
	return d
}

// tcpBandwidth is the stream: the client writes, the server reads and
// answers with one byte once it has everything.
func tcpBandwidth(c *net.TCPConn, h tcpHello, o *perfTCPOpts, w io.Writer) error {
	msg := make([]byte, h.size)
	var start, end time.Time
	if o.server != "" {
		fillPattern(msg)
		start = time.Now()
		for i := range h.iters {
			if _, err := c.Write(msg); err != nil {
				return fmt.Errorf("message %d: %v", i, err)
			}
		}
		var done [1]byte
		if _, err := io.ReadFull(c, done[:]); err != nil {
			return fmt.Errorf("waiting for the server to take the stream: %v", err)
		}
		end = time.Now()
	} else {
		for i := range h.iters {
			if _, err := io.ReadFull(c, msg); err != nil {
				return fmt.Errorf("message %d: %v", i, err)
			}
			if i == 0 {
				start = time.Now()
			}
			if o.validate {
				if j := checkPattern(msg); j >= 0 {
					return fmt.Errorf("validation: message %d: byte %d is %#02x, want %#02x", i, j, msg[j], patternByte(j))
				}
			}
		}
		end = time.Now()
		if _, err := c.Write([]byte{1}); err != nil {
			return err
		}
	}
	// A stream has no per-message completions, so no peak (perftest's
	// -N prints 0).
	r := oob.AverageBW(uint64(h.size), h.iters, end.Sub(start), o.gbits)
	if err := oob.WriteBWResult(w, r, nil, o.gbits); err != nil {
		return err
	}
	_, err := io.WriteString(w, oob.ResultLine)
	return err
}
