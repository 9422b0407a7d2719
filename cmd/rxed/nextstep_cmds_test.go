package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// allreduce, demo and serve failed saying what broke and not what to do
// about it, unlike the other tools (nextstep_test.go). Each error exit
// below was walked on loopback; the hint is what a newcomer needs next.

// TestAllreduceErrorsSayWhatToDo runs allreduce's error exits.
func TestAllreduceErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	heldUDP, err := net.ListenPacket("udp4", net.JoinHostPort(b, "4791"))
	require.NoError(t, err)
	defer heldUDP.Close()
	heldTCP, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer heldTCP.Close()
	busy := strconv.Itoa(heldTCP.Addr().(*net.TCPAddr).Port)
	tcp := reservePort(t)
	rank := func(r int, peers string, extra ...string) []string {
		return append([]string{"allreduce", "--rank", strconv.Itoa(r), "--peers", peers, "--tcp-port", tcp, "-n", "1", "--timeout", "2s"}, extra...)
	}
	cases := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"an argument", []string{"allreduce", "127.0.0.1"}, 2,
			[]string{`unexpected argument "127.0.0.1"`, "--peers for the other ranks' addresses"}},
		{"engine address not on the host", rank(0, "192.0.2.1,192.0.2.2", "-b", "4K", "-e", "4K"), 1,
			[]string{"opening rank 0's RoCE engine on 192.0.2.1 udp/4791", "not an address of this host (ip addr lists them"}},
		{"engine address in use", rank(0, b+","+a, "-b", "4K", "-e", "4K"), 1,
			[]string{"address already in use", "another engine already has udp/4791 there", "stop it"}},
		// Rank 1's address is b, whose udp/4791 the test holds: the REQs
		// go unanswered, nothing leaves loopback.
		{"next rank not running", rank(0, a+","+b, "-b", "4K", "-e", "4K"), 1,
			[]string{"could not connect to rank 1", "start every rank within --timeout of the first", "is that rank running"}},
		{"TCP port in use", []string{"allreduce", "--net", "mem", "--addr", "10.9.0.1", "--tcp-port", busy, "--ranks", "2",
			"-b", "4K", "-e", "4K", "-n", "1", "--timeout", "2s"}, 1,
			[]string{"tcp, 2 ranks, 4096 bytes", "address already in use", "give every rank another --tcp-port and --cm-port"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCmd(c.args...)
			require.Equalf(t, c.code, r.code, "stderr:\n%s", r.stderr)
			requireOneLineError(t, r, c.want...)
		})
	}

	// Two ranks of different sizes: each refuses the other's ring.
	heldUDP.Close()
	_, _, other := startCmd(rank(1, a+","+b, "-b", "8K", "-e", "8K")...)
	r := runCmd(rank(0, a+","+b, "-b", "4K", "-e", "4K")...)
	requireOneLineError(t, r, "size mismatch", "the ranks disagree about the ring: start every rank with the same --peers, -b and -e")
	o := await(t, other, 30*time.Second)
	requireOneLineError(t, o, "mismatch", "the ranks disagree about the ring")
}

// TestAllreduceNextStepOfRingErrors: the ring errors examples/allreduce
// words (as it words them), and where the ranks are: a neighbour of a
// rank process is another process, the ranks of one process share it.
func TestAllreduceNextStepOfRingErrors(t *testing.T) {
	t.Parallel()
	neighbour := "a neighbour rank stopped or failed: its own error says why"
	start := "start every rank within --timeout of the first"
	cases := []struct {
		err         string
		rankProcess bool
		want        string
	}{
		{"allreduce: rank 0, reduce-scatter step 1: no data from rank 1 within 5s (did it die?)", true, neighbour},
		{"allreduce: rank 0, allgather step 0: rank 1 left the ring (EOF)", true, neighbour},
		{"work completion RETRY_EXC_ERR on the connection to rank 2 (rank 2 stopped acknowledging: did it die?)", true, neighbour},
		{"rank 1 said it finished: true, rank 1: false (within 5s)", true, neighbour},
		{"allreduce: rank 0: no connection from rank 1 within 5s", true, start},
		{"allreduce: rank 0: no answer from rank 1: EOF", true, start},
		{"allreduce: rank 1 refused rank 0: rank count mismatch: rank 1 runs 3 ranks, rank 0 runs 2", false, "the ranks disagree about the ring"},
		{"allreduce: size mismatch: rank 1 has 2048 floats, rank 0 has 1024", true, "the ranks disagree about the ring"},
		{"allreduce: rank 1 expected rank 0 as its neighbour, rank 2 connected", true, "the ranks disagree about the ring"},
		{"allreduce: rank 0: could not connect to rank 1 at 127.0.1.2:7600 within 5s: timeout", false, ""},
	}
	for _, c := range cases {
		got := allreduceNextStep(errors.New(c.err), c.rankProcess)
		if c.want == "" {
			require.Empty(t, got, c.err)
			continue
		}
		require.Contains(t, got, c.want, c.err)
	}
}

// TestDemoErrorsSayWhatToDo runs demo's error exits.
func TestDemoErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	cases := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"bad port", []string{"demo", "--port", "-1"}, 2, []string{"--port -1: want 0..65535"}},
		{"bad fault spec", []string{"demo", "--fault", "bogus"}, 2, []string{"--fault: ", "(want loss=P,"}},
		{"two families", []string{"demo", "--addr", "::1", "--addr", b}, 2, []string{"engines A and B need addresses of one family"}},
		{"pcap directory missing", []string{"demo", "--addr", a, "--addr", b, "--pcap", "/nonexistent/demo.pcap"}, 1,
			[]string{"--pcap: open /nonexistent/demo.pcap", "its directory must exist"}},
		{"address not on the host", []string{"demo", "--addr", "192.0.2.1", "--addr", b}, 1,
			[]string{"FAILED: opening engine A on 192.0.2.1", "not an address of this host (ip addr lists them"}},
		{"every packet lost", []string{"demo", "--addr", a, "--addr", b, "--port", "0", "--fault", "loss=1"}, 1,
			[]string{"FAILED: A: wr 1 completed with RETRY_EXC_ERR", "ask --fault for less loss"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCmd(c.args...)
			require.Equalf(t, c.code, r.code, "stderr:\n%s", r.stderr)
			requireOneLineError(t, r, c.want...)
		})
	}
}

// TestDemoNextStepOfFailedSteps: a step whose packets did not get through
// (with and without --fault) and one whose data came back wrong.
func TestDemoNextStepOfFailedSteps(t *testing.T) {
	t.Parallel()
	lost := &demoStepError{fmt.Errorf("A: no completion for wr 2: %w", errors.New("context deadline exceeded"))}
	require.Contains(t, demoNextStep(lost, false), "does a firewall filter UDP between the two --addr")
	require.Contains(t, demoNextStep(fmt.Errorf("connect: %w", lost), true), "ask --fault for less loss")
	require.Contains(t, demoNextStep(&demoCheckError{"RDMA READ: A's buffer does not hold B's bytes"}, false), "that is a bug, please report it")
	require.Empty(t, demoNextStep(errors.New("connect A: ib: Modify: something"), false))
}

// TestServeErrorsSayWhatToDo runs serve's error exits that had no hint
// (the socket ones have theirs: TestEngineAddressInUseSaysWhatToDo,
// TestTCPSocketErrorsSayWhatToDo).
func TestServeErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	a, _ := addrPair(t)
	common := []string{"serve", "--addr", a, "--export", "x=anon,size=4K", "-p", "0"}
	cases := []struct {
		name  string
		extra []string
		code  int
		want  []string
	}{
		{"config file missing", []string{"--config", "/nonexistent/rxed.conf"}, 2,
			[]string{"config: open /nonexistent/rxed.conf", "give the path of an existing file"}},
		{"token file missing", []string{"--token-file", "/nonexistent/token"}, 2,
			[]string{"--token-file: open /nonexistent/token", "give the path of an existing file"}},
		{"pcap directory missing", []string{"--pcap", "/nonexistent/serve.pcap"}, 1,
			[]string{"--pcap: open /nonexistent/serve.pcap", "its directory must exist"}},
		// It got "listen %!s(<nil>): address bogus: missing port in address"
		// from the daemon.
		{"metrics address without a port", []string{"--metrics", "bogus"}, 2,
			[]string{`--metrics "bogus": want HOST:PORT, e.g. 127.0.0.1:9479`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCmd(append(append([]string{}, common...), c.extra...)...)
			require.Equalf(t, c.code, r.code, "stderr:\n%s", r.stderr)
			requireOneLineError(t, r, c.want...)
		})
	}
	// An anonymous export the host cannot map (size=1000T where the
	// kernel refuses it; the daemon formats the cause, so by its words).
	err := fmt.Errorf("export x: %v", fmt.Errorf("mr: mmap anonymous: %w", syscall.ENOMEM))
	require.Contains(t, serveNextStep(err), "not enough memory for that export: give it a smaller size=")
	require.Contains(t, serveNextStep(fmt.Errorf("opening: %w", syscall.EADDRINUSE)), "another process has that address and port")
}
