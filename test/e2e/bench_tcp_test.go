package e2e

import (
	"context"
	"io"
	"net"
	"runtime/trace"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The TCP baselines are what a user weighs rxed against: a plain Go
// net.TCPConn (TCP_NODELAY, Go's default, set explicitly) between
// 127.0.0.1 and 127.0.0.2 in the same process, measured in the same run
// as the RDMA figure it is compared with (b.ReportMetric):
//
//	tcp-MB/s        tcpStream: the sender writes messages of the RDMA run's
//	                size from the same rotating 2 MiB source, the receiver
//	                reads them into one message buffer; MB/s is measured
//	                until the receiver holds the last byte
//	tcp-ratio       RDMA / TCP (bandwidth: goal >= 1.0; latency, per round
//	                trip: goal <= 1.0 at p50 and <= 1.5 at p99)
//	tcp-p50-ns, tcp-p99-ns  tcpPingPong: 8 bytes each way, one Write and one
//	                ReadFull per direction and round trip
//
// Go's net package always waits in the netpoller, so both latency modes
// (poll and event) are compared with the same TCP figure.

// tcpPair returns the two ends of a loopback TCP connection with
// TCP_NODELAY.
func tcpPair(b testing.TB) (*net.TCPConn, *net.TCPConn) {
	b.Helper()
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)})
	require.NoError(b, err)
	defer l.Close()
	type res struct {
		c   *net.TCPConn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.AcceptTCP()
		acc <- res{c, err}
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}
	cc, err := d.Dial("tcp4", l.Addr().String())
	require.NoError(b, err)
	r := <-acc
	require.NoError(b, r.err)
	c := cc.(*net.TCPConn)
	for _, x := range []*net.TCPConn{c, r.c} {
		require.NoError(b, x.SetNoDelay(true))
	}
	return c, r.c
}

// tcpStream moves n messages of size bytes over a TCP connection and
// returns MB/s and the process CPU time it took.
func tcpStream(b testing.TB, n, size int) (float64, time.Duration) {
	snd, rcv := tcpPair(b)
	defer snd.Close()
	defer rcv.Close()
	src := make([]byte, 32*size) // the RDMA run's rotating 2 MiB source
	var wg sync.WaitGroup
	var rerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, size)
		for i := 0; i < n; i++ {
			if _, err := io.ReadFull(rcv, buf); err != nil {
				rerr = err
				return
			}
		}
	}()
	start, cpu0 := time.Now(), processCPU()
	for i := 0; i < n; i++ {
		off := (i % 32) * size
		if _, err := snd.Write(src[off : off+size]); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	el, cpu := time.Since(start), processCPU()-cpu0
	require.NoError(b, rerr)
	return float64(n) * float64(size) / el.Seconds() / 1e6, cpu
}

// slowRTT is goal 4's bound (issue 14): no round trip above 1 ms.
const slowRTT = time.Millisecond

// rtts records round-trip times without allocating during the run.
type rtts struct {
	name string // in the trace's slowrtt messages: which round trips
	ns   []int64
	cs   float64 // the process's context switches per round trip (contextSwitches)
}

// switchesSince records the context switches since cs0 over n round trips.
func (r *rtts) switchesSince(cs0 int64, n int) {
	r.cs = float64(contextSwitches()-cs0) / float64(max(n, 1))
}

func newRTTs(name string, n int) *rtts { return &rtts{name: name, ns: make([]int64, 0, n)} }

// add records d. A round trip slower than slowRTT is also logged to the
// execution trace when one is being taken (`go test -trace`, category
// "slowrtt"), so what every thread of the process did meanwhile can be
// looked up (docs/performance.md, session F: most were a thread that the
// kernel did not run for milliseconds).
func (r *rtts) add(d time.Duration) {
	if d > slowRTT && trace.IsEnabled() {
		trace.Log(context.Background(), "slowrtt", r.name+" "+d.String())
	}
	if len(r.ns) < cap(r.ns) {
		r.ns = append(r.ns, int64(d))
	}
}

// quantiles returns p50, p99 and the maximum in ns (0s when empty).
func (r *rtts) quantiles() (p50, p99, maxNS float64) {
	if len(r.ns) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(r.ns)
	slices.Sort(s)
	at := func(q float64) float64 { return float64(s[min(int(q*float64(len(s))), len(s)-1)]) }
	return at(0.50), at(0.99), float64(s[len(s)-1])
}

// slow counts the round trips above slowRTT. Goal 4 asks for none in
// 100,000; the maximum alone cannot say whether a run had one such round
// trip or many, nor whether TCP's run beside it had as many (on a VM the
// kernel sometimes keeps a thread off the CPU for milliseconds, whatever
// it runs: docs/performance.md, session F).
func (r *rtts) slow() int {
	n := 0
	for _, d := range r.ns {
		if d > int64(slowRTT) {
			n++
		}
	}
	return n
}

// tcpPingPong is n round trips of size bytes each way over TCP; it
// returns the round-trip times and process CPU ns per round trip.
func tcpPingPong(b testing.TB, n, size int) (*rtts, float64) {
	return tcpRequestResponse(b, n, size, size)
}

// tcpRequestResponse is n round trips over TCP of a req-byte request
// answered by a resp-byte response (the server writes the response from
// memory it already has, as a key-value server answers a GET): what an
// RDMA READ of resp bytes replaces. It returns the round-trip times and
// process CPU ns per round trip.
func tcpRequestResponse(b testing.TB, n, req, resp int) (*rtts, float64) {
	a, c := tcpPair(b)
	defer a.Close()
	defer c.Close()
	go func() { // the server: read a request, write the response
		in, out := make([]byte, req), make([]byte, resp)
		for {
			if _, err := io.ReadFull(c, in); err != nil {
				return
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}()
	r := newRTTs("tcp", n)
	out, in := make([]byte, req), make([]byte, resp)
	cpu0, cs0 := processCPU(), contextSwitches()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := a.Write(out); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(a, in); err != nil {
			b.Fatal(err)
		}
		r.add(time.Since(t0))
	}
	cpu := processCPU() - cpu0
	r.switchesSince(cs0, n)
	return r, float64(cpu.Nanoseconds()) / float64(n)
}

// reportLatencyVsTCP reports the RDMA round trips' quantiles and their
// ratios to the TCP ping-pong's of the same run, and both runs' context
// switches per round trip.
func reportLatencyVsTCP(b *testing.B, rdma, tcp *rtts) {
	p50, p99, mx := rdma.quantiles()
	t50, t99, tmx := tcp.quantiles()
	b.ReportMetric(p50, "p50-ns")
	b.ReportMetric(p99, "p99-ns")
	b.ReportMetric(mx, "max-ns")
	b.ReportMetric(t50, "tcp-p50-ns")
	b.ReportMetric(t99, "tcp-p99-ns")
	b.ReportMetric(tmx, "tcp-max-ns")
	b.ReportMetric(float64(rdma.slow()), "over-1ms")
	b.ReportMetric(float64(tcp.slow()), "tcp-over-1ms")
	b.ReportMetric(rdma.cs, "cs/rtt")
	b.ReportMetric(tcp.cs, "tcp-cs/rtt")
	if t50 > 0 && t99 > 0 {
		b.ReportMetric(p50/t50, "tcp-p50-ratio")
		b.ReportMetric(p99/t99, "tcp-p99-ratio")
	}
}

// BenchmarkTCPStream64K is the TCP stream alone (one op: a 64 KiB
// message), for comparing runs of the WRITE benchmark across sessions.
func BenchmarkTCPStream64K(b *testing.B) {
	b.SetBytes(benchMsg)
	b.ReportAllocs()
	mbs, _ := tcpStream(b, b.N, benchMsg)
	b.ReportMetric(mbs, "tcp-MB/s")
}

// BenchmarkTCPPingPong8 is the TCP ping-pong alone (one op: a round trip
// of 8 bytes each way).
func BenchmarkTCPPingPong8(b *testing.B) {
	b.ReportAllocs()
	start := time.Now()
	r, _ := tcpPingPong(b, b.N, 8)
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "tcp-ns/rtt")
	p50, p99, mx := r.quantiles()
	b.ReportMetric(p50, "tcp-p50-ns")
	b.ReportMetric(p99, "tcp-p99-ns")
	b.ReportMetric(mx, "tcp-max-ns")
	b.ReportMetric(float64(r.slow()), "tcp-over-1ms")
}

// TestRTTsSlowCountsAboveTheBound: the over-1ms metric counts round trips
// strictly above slowRTT, every one of them, and ignores the rest.
func TestRTTsSlowCountsAboveTheBound(t *testing.T) {
	r := newRTTs("t", 8)
	for _, d := range []time.Duration{time.Microsecond, slowRTT, slowRTT + 1, 3 * time.Millisecond, 500 * time.Microsecond, 2 * slowRTT} {
		r.add(d)
	}
	if got := r.slow(); got != 3 {
		t.Fatalf("slow() = %d, want 3 (slowRTT+1, 3 ms, 2 ms; slowRTT itself is not above)", got)
	}
	if got := newRTTs("empty", 0).slow(); got != 0 {
		t.Fatalf("empty slow() = %d", got)
	}
}
