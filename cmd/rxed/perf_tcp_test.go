package main

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// perf tcp's hello: what a client sends and a server accepts.
func TestTCPHelloRoundTripsAndChecks(t *testing.T) {
	good := tcpHello{kind: 'L', size: 8, reply: 4096, iters: 1000}
	b := appendTCPHello(nil, good)
	require.Len(t, b, tcpHelloLen)
	h, err := parseTCPHello(b)
	require.NoError(t, err)
	require.Equal(t, good, h)

	bw := tcpHello{kind: 'B', size: 1 << 30, reply: 0, iters: 1}
	h, err = parseTCPHello(appendTCPHello(nil, bw))
	require.NoError(t, err)
	require.Equal(t, bw, h)

	for _, c := range []struct {
		name string
		edit func(b []byte)
		want string
	}{
		{"magic", func(b []byte) { b[0] = 'X' }, "not an rxed perf tcp client"},
		{"reserved", func(b []byte) { b[10] = 1 }, "reserved bytes"},
		{"test", func(b []byte) { b[8] = 'Q' }, `unknown test 'Q'`},
		{"size 0", func(b []byte) { copy(b[12:16], []byte{0, 0, 0, 0}) }, "-s 0"},
		{"size above 1 GiB", func(b []byte) { copy(b[12:16], []byte{0x40, 0, 0, 1}) }, "-s 1073741825"},
		{"latency with 4 iterations", func(b []byte) { copy(b[20:28], []byte{0, 0, 0, 0, 0, 0, 0, 4}) }, "at least 5"},
		{"bandwidth with 0 iterations", func(b []byte) { b[8] = 'B'; clear(b[16:28]) }, "-n 0"},
		{"latency without a reply", func(b []byte) { clear(b[16:20]) }, "--reply 0: want 1.."},
		{"latency reply above 1 GiB", func(b []byte) { copy(b[16:20], []byte{0x40, 0, 0, 1}) }, "--reply 1073741825"},
		{"bandwidth with a reply", func(b []byte) { b[8] = 'B' }, "--reply 4096: only for latency tests"},
	} {
		b := appendTCPHello(nil, good)
		c.edit(b)
		_, err := parseTCPHello(b)
		require.ErrorContains(t, err, c.want, c.name)
	}
}

// Every prefix of a hello, and a hello with a byte more, is refused.
func TestTCPHelloTruncatedAtEveryPrefix(t *testing.T) {
	b := appendTCPHello(nil, tcpHello{kind: 'B', size: 4096, iters: 10})
	require.Len(t, b, tcpHelloLen)
	for n := range b {
		_, err := parseTCPHello(b[:n])
		require.Error(t, err, "prefix of %d bytes", n)
	}
	_, err := parseTCPHello(append(b, 0))
	require.Error(t, err)
}

func FuzzParseTCPHello(f *testing.F) {
	f.Add(appendTCPHello(nil, tcpHello{kind: 'L', size: 2, reply: 2, iters: 1000}))
	f.Add(appendTCPHello(nil, tcpHello{kind: 'L', size: 8, reply: 4096, iters: 1000}))
	f.Add(appendTCPHello(nil, tcpHello{kind: 'B', size: 65536, iters: 5000}))
	f.Add([]byte("rxedtcp1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseTCPHello(b)
		if err != nil {
			return
		}
		// What is accepted is a valid test and round-trips exactly.
		require.NoError(t, checkTCPTest(h.kind == 'L', uint64(h.size), h.iters))
		require.NoError(t, checkTCPReply(h.kind == 'L', uint64(h.reply)))
		require.Equal(t, b, appendTCPHello(nil, h))
	})
}

func TestPerfTCPRejectsBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-s", "0"}, "-s 0: must be positive"},
		{[]string{"-n", "0"}, "-n 0: must be positive"},
		{[]string{"--lat", "-n", "4"}, "at least 5 iterations"},
		{[]string{"-s", "2G"}, "-s 2147483648: want 1..1073741824"},
		{[]string{"-p", "70000"}, "-p 70000 out of range"},
		{[]string{"--listen", "nowhere"}, `--listen "nowhere"`},
		{[]string{"--listen", "127.0.0.1", "127.0.0.2"}, "--listen: only for the server"},
		{[]string{"127.0.0.1", "127.0.0.2"}, "more than one server address"},
		{[]string{"-s", "lots"}, `"lots": want a byte count`},
		{[]string{"--reply", "4K"}, "--reply 4096: only for latency tests"},
		{[]string{"--lat", "--reply", "0"}, "-reply 0: must be positive"},
		{[]string{"--lat", "--reply", "2G"}, "--reply 2147483648: want 1..1073741824"},
	} {
		r := runCmd(append([]string{"perf", "tcp"}, c.args...)...)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
		requireOneLineError(t, r, c.want)
	}
	o, code, ok := parsePerfTCP(nil, io.Discard)
	require.True(t, ok, code)
	require.Equal(t, tcpHello{kind: 'B', size: 65536, iters: 5000}, o.hello, "bandwidth defaults: perf write's")
	o, _, ok = parsePerfTCP([]string{"--lat"}, io.Discard)
	require.True(t, ok)
	require.Equal(t, tcpHello{kind: 'L', size: 2, reply: 2, iters: 1000}, o.hello, "latency defaults: perf send --lat's, a ping-pong")
	o, _, ok = parsePerfTCP([]string{"--lat", "-s", "8", "--reply", "4K"}, io.Discard)
	require.True(t, ok)
	require.Equal(t, tcpHello{kind: 'L', size: 8, reply: 4096, iters: 1000}, o.hello)
}

// tcpRow is the numbers of the last table row in out (perftest's format).
func tcpRow(t *testing.T, out string) []float64 {
	t.Helper()
	var row []float64
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		var nums []float64
		for _, s := range f {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				nums = nil
				break
			}
			nums = append(nums, v)
		}
		if nums != nil {
			row = nums
		}
	}
	require.NotNil(t, row, "no result row in:\n%s", out)
	return row
}

// runTCPPair runs an rxed perf tcp server (with --validate, on a fresh
// address and port) and its client, both with args, and requires both to
// succeed.
func runTCPPair(t *testing.T, args ...string) (srv, cli result) {
	t.Helper()
	a, _ := addrPair(t)
	common := append([]string{"perf", "tcp", "-p", reservePort(t)}, args...)
	srv, cli = runPair(t, append(append([]string{}, common...), "--listen", a, "--wait", "20s", "--validate"),
		"Waiting for client", append(append([]string{}, common...), a))
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	return srv, cli
}

// A latency run between two rxed perf tcp processes: the server checks
// every ping (--validate), both print perftest's latency row with the
// run's size and iterations and consistent figures.
func TestPerfTCPLatencyPingPong(t *testing.T) {
	t.Parallel()
	srv, cli := runTCPPair(t, "--lat", "-s", "100", "-n", "200")
	for _, r := range []result{srv, cli} {
		require.Contains(t, r.stdout, "TCP latency")
		row := tcpRow(t, r.stdout)
		require.Len(t, row, 9, r.stdout)
		require.Equal(t, []float64{100, 200}, row[:2])
		tMin, tMax, typical := row[2], row[3], row[4]
		require.Positive(t, tMin)
		require.LessOrEqual(t, tMin, typical)
		require.LessOrEqual(t, typical, tMax)
	}
}

// A request/response run (-s 8 --reply 4096: what one 4 KiB RDMA READ
// replaces) completes, each 8-byte request answered by exactly 4096 bytes
// (a shorter or longer reply leaves the client waiting or out of step
// with the server's validation of the next request), and says it reports
// round trips, as read_lat does.
func TestPerfTCPRequestResponse(t *testing.T) {
	t.Parallel()
	_, cli := runTCPPair(t, "--lat", "-s", "8", "--reply", "4K", "-n", "100")
	require.Contains(t, cli.stdout, "request of 8 bytes, reply of 4096, as read_lat: round trip")
	row := tcpRow(t, cli.stdout)
	require.Equal(t, []float64{8, 100}, row[:2])
	require.Positive(t, row[4])
	require.False(t, tcpHello{size: 8, reply: 4096}.pingPong())
	require.True(t, tcpHello{size: 8, reply: 8}.pingPong())
}

// A bandwidth run: every byte of the stream reaches the server in order
// (--validate), both report the run's size and count and a bandwidth.
func TestPerfTCPBandwidthStream(t *testing.T) {
	t.Parallel()
	srv, cli := runTCPPair(t, "-s", "4K", "-n", "300")
	for _, r := range []result{srv, cli} {
		require.Contains(t, r.stdout, "TCP bandwidth")
		row := tcpRow(t, r.stdout)
		require.Len(t, row, 5, r.stdout)
		require.Equal(t, []float64{4096, 300, 0}, row[:3], "size, iterations, no peak")
		require.Positive(t, row[3], "BW average")
		require.Positive(t, row[4], "message rate")
	}
}

// tcpServer starts an rxed perf tcp server on a fresh address and port.
func tcpServer(t *testing.T, args ...string) (addr string, done <-chan result) {
	t.Helper()
	a, _ := addrPair(t)
	port := reservePort(t)
	out, _, done := startCmd(append([]string{"perf", "tcp", "--listen", a, "-p", port, "--wait", "20s"}, args...)...)
	out.waitFor(t, "Waiting for client", 20*time.Second)
	return net.JoinHostPort(a, port), done
}

// A server reached by something that is not an rxed perf tcp client says
// so in one line and exits 1.
func TestPerfTCPServerRefusesAStranger(t *testing.T) {
	t.Parallel()
	addr, done := tcpServer(t, "--lat")
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(bytes.Repeat([]byte("GET / HTTP/1.0\r\n"), 2)[:tcpHelloLen])
	require.NoError(t, err)
	r := await(t, done, 30*time.Second)
	require.Equal(t, 1, r.code)
	requireOneLineError(t, r, "not an rxed perf tcp client")
	n, _ := c.Read(make([]byte, 8))
	require.Zero(t, n, "the server answered a stranger")
}

// A server started for one test refuses a client that asks for another,
// as perftest's two sides must agree; one started without the test's flags
// runs what its client asks for (the other tests).
func TestPerfTCPServerRefusesAnotherTest(t *testing.T) {
	t.Parallel()
	addr, done := tcpServer(t, "--lat", "-s", "100")
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	cli := runCmd("perf", "tcp", "--lat", "-s", "8", "-p", port, host)
	requireOneLineError(t, cli, "did not accept the test")
	r := await(t, done, 30*time.Second)
	requireOneLineError(t, r, "asked for --lat -s 8 --reply 8 -n 1000; this server runs --lat -s 100 --reply 100 -n 1000")
}

// --validate catches a ping that is not perf's pattern.
func TestPerfTCPServerValidatesThePing(t *testing.T) {
	t.Parallel()
	addr, done := tcpServer(t, "--validate") // the test comes from the client's hello
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(appendTCPHello(nil, tcpHello{kind: 'L', size: 16, reply: 16, iters: 10}))
	require.NoError(t, err)
	ans := make([]byte, len(tcpAccept))
	_, err = io.ReadFull(c, ans)
	require.NoError(t, err)
	require.Equal(t, tcpAccept, string(ans))
	ping := make([]byte, 16)
	fillPattern(ping)
	ping[5] ^= 0xff
	_, err = c.Write(ping)
	require.NoError(t, err)
	r := await(t, done, 30*time.Second)
	requireOneLineError(t, r, "validation: iteration 0: byte 5")
}

// A client whose server is not rxed perf tcp (here: a listener that
// closes every connection) says so in one line and exits 1.
func TestPerfTCPClientAgainstAStranger(t *testing.T) {
	t.Parallel()
	a, _ := addrPair(t)
	port := strconv.Itoa(closingListener(t, a).Port)
	r := runCmd("perf", "tcp", "--lat", "-p", port, "--timeout", "5s", a)
	require.Equal(t, 1, r.code)
	requireOneLineError(t, r, "did not accept the test")

	// And with nothing listening at all: the connection's own error.
	r = runCmd("perf", "tcp", "-p", reservePort(t), "--timeout", "5s", a)
	require.Equal(t, 1, r.code)
	requireOneLineError(t, r, "connection refused")
}

// A server whose client never comes gives up after --wait.
func TestPerfTCPServerWait(t *testing.T) {
	t.Parallel()
	a, _ := addrPair(t)
	r := runCmd("perf", "tcp", "--listen", a, "-p", reservePort(t), "--wait", "50ms")
	require.Equal(t, 1, r.code)
	requireOneLineError(t, r, "no client within --wait 50ms")
}

// The latency samples are the differences of consecutive stamps, as
// perftest's are of consecutive posts.
func TestTCPLatencySamplesAreStampDifferences(t *testing.T) {
	require.Equal(t, 3, len(diffs([]time.Duration{1, 3, 6, 10})))
	require.Equal(t, []time.Duration{2, 3, 4}, diffs([]time.Duration{1, 3, 6, 10}))
	require.Empty(t, diffs(nil))
}
