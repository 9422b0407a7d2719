package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The CLI edges of issue 15: the servers' --listen, explicit zeros, size
// suffixes, usage errors' exit status.

// requireRefused checks nothing accepts TCP connections at addr: the
// server bound another address only.
func requireRefused(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("%s accepted a connection: the server listens on more than its --listen address", addr)
	}
}

// Issue 15: perf's TCP exchange listened on every address with no way to
// restrict it. With --listen it accepts on that address only.
func TestPerfListenAddress(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	common := []string{"-p", port, "-n", "20", "-s", "4K", "--timeout", "20s", "--progress", "0"}
	sout, _, sdone := startCmd(append([]string{"perf", "write", "--addr", a, "--listen", a}, common...)...)
	sout.waitFor(t, "Waiting for client", 20*time.Second)
	requireRefused(t, net.JoinHostPort(b, port))
	cli := runCmd(append([]string{"perf", "write", "--addr", b}, append(common, a)...)...)
	requireOK(t, "client", cli)
	requireOK(t, "server", await(t, sdone, 60*time.Second))
	require.Contains(t, cli.stdout, " 4096 ", "-s 4K ran 4096-byte messages")
}

// Issue 15: as perf, for pingpong's exchange (address:port form).
func TestPingpongListenAddress(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	common := []string{"-p", port, "-n", "10", "-s", "1K", "--timeout", "20s"}
	sout, _, sdone := startCmd(append([]string{"pingpong", "--addr", a, "--listen", net.JoinHostPort(a, port)}, common...)...)
	sout.waitFor(t, "local address", 20*time.Second)
	requireRefused(t, net.JoinHostPort(b, port))
	cli := runCmd(append([]string{"pingpong", "--addr", b}, append(common, a)...)...)
	requireOK(t, "client", cli)
	requireOK(t, "server", await(t, sdone, 60*time.Second))
	require.Contains(t, cli.stdout, "20480 bytes in", "-s 1K: 10 iterations of 1024 bytes each way")
}

// Issue 15: an explicit 0 silently ran the default; it is a usage error
// now, as perftest refuses -s 0, -t 0 and -D 0. A bad --listen, a size
// without a number, and --listen on a client are usage errors too.
func TestZeroAndBadSizeFlags(t *testing.T) {
	t.Parallel()
	a, _ := addrPair(t)
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"perf", "write", "--addr", a, "-s", "0"}, []string{"-s 0"}},
		{[]string{"perf", "write", "--addr", a, "-s", "0K"}, []string{"-s 0"}},
		{[]string{"perf", "write", "--addr", a, "--lat", "-s", "0"}, []string{"-s 0"}},
		{[]string{"perf", "write", "--addr", a, "-n", "0"}, []string{"-n 0"}},
		{[]string{"perf", "read", "--addr", a, "-t", "0"}, []string{"-t 0"}},
		{[]string{"perf", "write", "--addr", a, "-D", "0"}, []string{"-D 0"}},
		{[]string{"perf", "read", "--addr", a, "-o", "0"}, []string{"-o 0"}},
		{[]string{"perf", "write", "--addr", a, "-m", "0"}, []string{"-m 0"}},
		{[]string{"perf", "write", "--addr", a, "-s", "4Q"}, []string{"4Q"}},
		{[]string{"perf", "write", "--addr", a, "-s", "2G"}, []string{"too large"}},
		{[]string{"perf", "write", "--addr", a, "--listen", "nowhere"}, []string{"--listen", "nowhere"}},
		{[]string{"perf", "write", "--addr", a, "--listen", a, "10.0.0.1"}, []string{"--listen"}},
		{[]string{"pingpong", "--addr", a, "-s", "0"}, []string{"-s 0"}},
		{[]string{"pingpong", "--addr", a, "-s", "lots"}, []string{"lots"}},
		{[]string{"pingpong", "--addr", a, "-n", "0"}, []string{"-n 0"}},
		{[]string{"pingpong", "--addr", a, "--listen", "nowhere"}, []string{"--listen", "nowhere"}},
		{[]string{"pingpong", "--addr", a, "--listen", a, "10.0.0.1"}, []string{"--listen"}},
		{[]string{"serve", "--addr", a, "--export", "x=anon,size=1M", "--max-read", "0"}, []string{"--max-read 0"}},
		{[]string{"serve", "--addr", a, "--export", "x=anon,size=1M", "--session-bytes", "ten"}, []string{"ten"}},
		{[]string{"allreduce", "--net", "mem", "-b", "0"}, []string{"-b 0"}},
		{[]string{"allreduce", "--net", "mem", "-b", "4X"}, []string{"4X"}},
		{[]string{"allreduce", "--net", "mem", "-b", "8K", "-e", "4K"}, []string{"-e 4096"}},
		{[]string{"allreduce", "--net", "mem", "--ranks", "1"}, []string{"--ranks"}},
		{[]string{"allreduce", "--net", "tcp"}, []string{"--net"}},
		{[]string{"allreduce", "--rank", "0"}, []string{"--peers"}},
		{[]string{"kv", "bench", "--addr", a, "--server", a, "-s", "2K"}, []string{"-s 2048"}},
		{[]string{"kv", "bench", "--addr", a, "--server", "127.0.0.1", "--extent", "0"}, []string{"--extent 0"}},
		{[]string{"kv", "serve", "--addr", a, "--buckets", "0"}, []string{"--buckets 0"}},
		{[]string{"kv", "serve", "--addr", a, "--probe", "0"}, []string{"--probe 0"}},
		{[]string{"kv", "get", "--addr", a, "127.0.0.1"}, []string{"want SERVER KEY"}},
		{[]string{"kv", "put", "--addr", a, "not-an-ip", "k", "v"}, []string{"not-an-ip"}},
		{[]string{"kv", "del", "127.0.0.1", "k"}, []string{"--addr"}},
		{[]string{"serve", "--addr", a}, []string{"--export"}},
	}
	for _, c := range cases {
		r := runCmd(c.args...)
		requireOneLineError(t, r, c.want...)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
	}
}

// Issue 15: sizes take K, M and G suffixes (powers of 1024) wherever a
// command takes a size.
func TestSizeSuffixes(t *testing.T) {
	t.Parallel()
	a, _ := addrPair(t)
	for _, c := range []struct {
		s    string
		want uint64
	}{{"4096", 4096}, {"4K", 4096}, {"64k", 64 << 10}, {"1M", 1 << 20}, {"1G", 1 << 30}, {"2KiB", 2048}} {
		o, code, ok := parsePerf([]string{"write", "--addr", a, "-s", c.s}, new(bytes.Buffer))
		require.True(t, ok, "perf -s %s: exit %d", c.s, code)
		require.Equal(t, c.want, o.size, "perf -s %s", c.s)
	}
	pp, _, ok := parsePingpong([]string{"--addr", a, "-s", "8K"}, new(bytes.Buffer))
	require.True(t, ok)
	require.Equal(t, uint(8192), pp.size)
	kb, _, ok := parseKVBench([]string{"--addr", a, "--server", "127.0.0.1", "--extent", "4K", "-s", "1K"}, new(bytes.Buffer))
	require.True(t, ok)
	require.Equal(t, 1024, kb.valueLen)
	require.Equal(t, 4096, kb.tf.config().ExtentSize)
	so, _, ok := parseServe([]string{"--addr", a, "--export", "x=anon,size=1M", "--max-read", "64K"}, new(bytes.Buffer))
	require.True(t, ok)
	require.Equal(t, sizeFlag(64<<10), so.maxRead)
}

// Issue 15: a client rxed serve cannot serve learned it from "sent 0
// bytes" (a latency or send test), a remote access error (a message
// larger than the export) or a stall; now an rxed client is refused
// during the exchange with the reason, and --validate checks its writes
// by reading the export back (serve is rxed) instead of saying the peer
// is not rxed.
func TestServeRefusesWhatItCannotServe(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port, roPort := reservePort(t), reservePort(t)
	dir := t.TempDir()
	rw, ro := filepath.Join(dir, "rw"), filepath.Join(dir, "ro")
	require.NoError(t, os.WriteFile(rw, make([]byte, 64<<10), 0o644))
	require.NoError(t, os.WriteFile(ro, make([]byte, 64<<10), 0o644))
	startServe(t, "--addr", a, "-p", port, "--export", "data=file:"+rw)
	perf := func(p string, test ...string) result {
		args := append([]string{"perf", test[0], "--addr", b, "-p", p, "-n", "20", "--timeout", "10s", "--progress", "0"}, test[1:]...)
		return runCmd(append(args, a)...)
	}
	for _, c := range []struct {
		test []string
		want []string
	}{
		{[]string{"write", "--lat"}, []string{"refused the session", "does not run this test"}},
		{[]string{"read", "--lat"}, []string{"refused the session", "does not run this test"}},
		{[]string{"send"}, []string{"refused the session", "does not run this test"}},
		{[]string{"write", "-s", "128K"}, []string{"-s 131072", "export is 65536 bytes"}},
		{[]string{"read", "-a"}, []string{"-s 8388608", "export is 65536 bytes"}},
	} {
		r := perf(port, c.test...)
		requireOneLineError(t, r, c.want...)
		require.Equal(t, 1, r.code, "%v", c.test)
	}

	// --validate: the writes are read back and compared; no "not rxed".
	r := perf(port, "write", "-s", "64K", "--validate")
	requireOK(t, "perf write --validate against serve", r)
	require.Empty(t, r.stderr)
	got, err := os.ReadFile(rw)
	require.NoError(t, err)
	require.Equal(t, -1, checkPattern(got), "the export holds what perf wrote")
	r = perf(port, "read", "-s", "4K", "--validate")
	requireOK(t, "perf read --validate against serve", r)
	require.Contains(t, r.stderr, "the peer is rxed serve")

	// A read-only export takes no WRITE.
	startServe(t, "--addr", a, "--port", "4792", "-p", roPort, "--export", "data=file:"+ro+",ro")
	r = runCmd("perf", "write", "--addr", b, "--port", "4792", "-p", roPort, "-n", "20", "-s", "4K", "--timeout", "10s", "--progress", "0", a)
	requireOneLineError(t, r, "refused the session", "read-only")
	r = runCmd("perf", "read", "--addr", b, "--port", "4792", "-p", roPort, "-n", "20", "-s", "4K", "--timeout", "10s", "--progress", "0", a)
	requireOK(t, "perf read of a read-only export", r)
}

// Issue 15: every usage error exits 2, in every command: an unknown flag
// (for each registered command, so a new one is covered too) and a
// missing or malformed argument of the commands whose checks used to
// exit 1.
func TestEveryCommandUsageErrorExits2(t *testing.T) {
	t.Parallel()
	sub := map[string][]string{"perf": {"write"}, "kv": {"get"}}
	for name := range commands {
		args := append(append([]string{name}, sub[name]...), "--no-such-flag")
		r := runCmd(args...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
		if name == "decode" {
			require.Contains(t, r.stderr, "no-such-flag") // then its usage, as flag's default
			continue
		}
		requireOneLineError(t, r, "no-such-flag")
	}
	require.Equal(t, 0, runCmd("demo", "-h").code, "help is not an error")
	// decode with two files: a line naming the problem before its usage
	// (newcomer walkthrough, item 4: the usage alone).
	r := runCmd("decode", "A", "B")
	require.Equal(t, 2, r.code)
	require.True(t, strings.HasPrefix(r.stderr, "rxed decode: want one capture file, got 2: A B\n"), r.stderr)
	for _, args := range [][]string{
		{"kv", "get", "--addr", "127.0.2.1", "127.0.0.1"},
		{"kv", "put", "--addr", "127.0.2.1", "127.0.0.1", "k"},
		{"kv", "serve"},
		{"allreduce", "-e", "1K"},
		{"allreduce", "--peers", "127.0.0.1,127.0.0.2"},
		{"serve", "--addr", "127.0.2.1"},
	} {
		r := runCmd(args...)
		require.NotEmpty(t, r.stderr, "%v", args)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
	}
}
