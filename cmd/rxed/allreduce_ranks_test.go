package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests below run each rank of a ring (and rdmacm_process_test.go each
// rdma_cm tool) as its own process: this test binary re-executed into
// TestAllreduceRankHelperProcess, which runs `rxed ARGS...` (the arguments
// after --) and exits with its status.
const rankArgsEnv = "RXED_TEST_ALLREDUCE_RANK_ARGS"

func TestAllreduceRankHelperProcess(t *testing.T) {
	if os.Getenv(rankArgsEnv) != "1" {
		return // a no-op except as a rank process started by the tests below
	}
	args := os.Args
	for len(args) > 0 && args[0] != "--" {
		args = args[1:]
	}
	require.NotEmpty(t, args, "no -- before the command's arguments")
	setMaxProcs = runtime.GOMAXPROCS // a process of its own, as main sets it
	exitFunc = syscall.Exit          // not os.Exit: the testing package refuses os.Exit(0) in a test
	exit(run(args[1:], os.Stdout, os.Stderr))
}

// rankProc is one rank process.
type rankProc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	code           int
}

func startRank(t *testing.T, args ...string) *rankProc {
	t.Helper()
	return startProcess(t, append([]string{"allreduce"}, args...)...)
}

// startProcess runs `rxed ARGS...` as a process of its own (this test
// binary re-executed).
func startProcess(t *testing.T, args ...string) *rankProc {
	t.Helper()
	return startProcessEnv(t, os.Environ(), args...)
}

// startProcessEnv is startProcess with the process's environment.
func startProcessEnv(t *testing.T, env []string, args ...string) *rankProc {
	t.Helper()
	p := &rankProc{stdout: newSyncBuffer(), stderr: newSyncBuffer(), done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], append([]string{"-test.run=^TestAllreduceRankHelperProcess$", "--"}, args...)...)
	p.cmd.Env = append(env, rankArgsEnv+"=1")
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	require.NoError(t, p.cmd.Start())
	go func() {
		err := p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		if err != nil && p.code == 0 {
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *rankProc) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("rank process %v did not exit within %v (a hang)\nstdout:\n%s\nstderr:\n%s", p.cmd.Args, d, p.stdout, p.stderr)
	}
}

// stderrOf is the process's stderr; a race report in it fails the test
// (a rank process runs the race-enabled test binary). The one race these
// tests found, in pkg/rdmacm (the MAD sender read before it was published
// while a neighbour's REQ arrived during Enable), is fixed.
func (p *rankProc) stderrOf(t *testing.T) string {
	t.Helper()
	s := p.stderr.String()
	require.NotContainsf(t, s, "WARNING: DATA RACE", "data race in rank process %v:\n%s", p.cmd.Args, s)
	return s
}

// Rank processes take their addresses from 127.0.9.1 .. 127.0.9.254, a
// block of their own (addrPair's 127.0.2.x is shared with every other test
// of the package, and with other runs of it on the machine), skipping an
// address whose UDP 4791 is bound by someone else; each test gives its
// addresses back when it ends.
var (
	rankAddrMu   sync.Mutex
	rankAddrNext = 1
	rankAddrUsed = map[int]bool{}
)

// rankAddrs returns n loopback addresses for n rank processes.
func rankAddrs(t *testing.T, n int) []string {
	t.Helper()
	rankAddrMu.Lock()
	defer rankAddrMu.Unlock()
	var got []int
	for tries := 0; len(got) < n && tries < 254; tries++ {
		i := rankAddrNext
		rankAddrNext = rankAddrNext%254 + 1
		if rankAddrUsed[i] {
			continue
		}
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 9, byte(i)), Port: 4791})
		if err != nil {
			continue // someone else's
		}
		c.Close()
		rankAddrUsed[i] = true
		got = append(got, i)
	}
	require.Lenf(t, got, n, "no %d free addresses in 127.0.9.x", n)
	t.Cleanup(func() {
		rankAddrMu.Lock()
		defer rankAddrMu.Unlock()
		for _, i := range got {
			delete(rankAddrUsed, i)
		}
	})
	as := make([]string, n)
	for k, i := range got {
		as[k] = fmt.Sprintf("127.0.9.%d", i)
	}
	return as
}

// startRing starts one process per peer; extra(rank) adds flags.
func startRing(t *testing.T, peers []string, extra func(rank int) []string) []*rankProc {
	tcp := reservePort(t)
	var ps []*rankProc
	for r := range peers {
		args := []string{"--rank", fmt.Sprint(r), "--peers", strings.Join(peers, ","), "--tcp-port", tcp}
		ps = append(ps, startRank(t, append(args, extra(r)...)...))
	}
	return ps
}

// tableLines returns the nccl-tests data lines of a rank's output.
func tableLines(out string) [][]string {
	var ls [][]string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 13 && f[2] == "float" {
			ls = append(ls, f)
		}
	}
	return ls
}

// N processes, both transports, every size bit-exact on every rank.
func TestAllreduceRanksProcesses(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ps := startRing(t, rankAddrs(t, n), func(int) []string {
				return []string{"-b", "4K", "-e", "16K", "-n", "2", "--timeout", "30s"}
			})
			for r, p := range ps {
				p.wait(t, 3*time.Minute)
				stderr := p.stderrOf(t)
				require.Equalf(t, 0, p.code, "rank %d\nstdout:\n%s\nstderr:\n%s", r, p.stdout, stderr)
				require.Empty(t, stderr)
				out := p.stdout.String()
				require.Contains(t, out, fmt.Sprintf("rank %d of %d", r, n))
				// each rank process of the loopback ring takes its share of the CPUs
				// (chooseProcs), unless the environment says otherwise
				want := fmt.Sprintf("GOMAXPROCS %d (every address is a loopback address", max(runtime.NumCPU()/n, 1))
				if env := os.Getenv("GOMAXPROCS"); env != "" || runtime.NumCPU() < 2 {
					want = fmt.Sprintf("GOMAXPROCS %d,", runtime.GOMAXPROCS(0))
				}
				require.Contains(t, out, want)
				ls := tableLines(out)
				require.Len(t, ls, 3, out) // 4K, 8K, 16K
				for i, f := range ls {
					require.Equal(t, fmt.Sprint(4096<<i), f[0])
					require.Equal(t, "0", f[8], "rank %d rdma #wrong: %v", r, f)
					require.Equal(t, "0", f[12], "rank %d tcp #wrong: %v", r, f)
				}
			}
		})
	}
}

// requireRankFailed checks that every process exited 1 with one line on
// stderr naming its rank and every want.
func requireRankFailed(t *testing.T, ps []*rankProc, skip int, d time.Duration, want ...string) {
	t.Helper()
	for r, p := range ps {
		if r == skip {
			continue
		}
		p.wait(t, d)
		msg := strings.TrimRight(p.stderrOf(t), "\n")
		require.Equalf(t, 1, p.code, "rank %d exit status\nstdout:\n%s\nstderr:\n%s", r, p.stdout, msg)
		require.NotContainsf(t, msg, "\n", "rank %d: more than one line:\n%s", r, msg)
		require.Containsf(t, msg, fmt.Sprintf("rxed allreduce: rank %d of ", r), "rank %d", r)
		for _, w := range want {
			require.Containsf(t, msg, w, "rank %d", r)
		}
	}
}

// Rank 1 starts its sweep at 8 KiB, rank 0 at 4 KiB: both refuse the
// ring with the sizes in the message.
func TestAllreduceRanksSizeMismatch(t *testing.T) {
	ps := startRing(t, rankAddrs(t, 2), func(r int) []string {
		return []string{"-b", fmt.Sprint(4096 << r), "-e", "16K", "-n", "1", "--timeout", "30s"}
	})
	requireRankFailed(t, ps, -1, time.Minute, "size mismatch", "1024", "2048")
}

// Rank 0 is told of 2 ranks, rank 1 of 3: both refuse at once (well within
// the 30 s timeout), naming the counts.
func TestAllreduceRanksCountMismatch(t *testing.T) {
	as := rankAddrs(t, 3)
	tcp := reservePort(t)
	common := []string{"--tcp-port", tcp, "-b", "4K", "-e", "4K", "-n", "1", "--timeout", "30s"}
	start := time.Now()
	ps := []*rankProc{
		startRank(t, append([]string{"--rank", "0", "--peers", strings.Join(as[:2], ",")}, common...)...),
		startRank(t, append([]string{"--rank", "1", "--peers", strings.Join(as, ",")}, common...)...),
	}
	requireRankFailed(t, ps, -1, time.Minute, "rank count mismatch")
	require.Less(t, time.Since(start), 30*time.Second, "a mismatch must not wait for the timeout")
}

// One of four rank processes is killed (SIGKILL: no disconnect) while the
// ring runs (it has joined it for 16 MiB, 20 iterations), or while the
// ring is being set up: every other rank exits with an error, none hangs.
func TestAllreduceRanksKilledRank(t *testing.T) {
	for _, when := range []string{"running", "setup"} {
		t.Run(when, func(t *testing.T) { testKilledRank(t, when) })
	}
}

func testKilledRank(t *testing.T, when string) {
	sizes := []string{"-b", "16M", "-e", "16M", "-n", "20"}
	wait := "# rank 2 joined the rdma ring for 16777216 bytes"
	if when == "setup" { // killed between two sizes' rings
		sizes, wait = []string{"-b", "4K", "-e", "64M", "-n", "2"}, "# rank 2 joined the tcp ring for 4096 bytes"
	}
	ps := startRing(t, rankAddrs(t, 4), func(int) []string {
		return append(sizes, "--timeout", "5s", "-v")
	})
	ps[2].stdout.waitFor(t, wait, 2*time.Minute)
	if when == "setup" {
		ps[2].stdout.waitFor(t, "        4096 ", time.Minute)
	}
	require.NoError(t, ps[2].cmd.Process.Signal(syscall.SIGKILL))
	ps[2].wait(t, 10*time.Second)
	requireRankFailed(t, ps, 2, time.Minute, "bytes: allreduce: ")
	var all bytes.Buffer
	for _, p := range ps {
		all.WriteString(p.stderrOf(t))
	}
	t.Logf("errors after killing rank 2 (%s):\n%s", when, all.String())
}

func TestAllreduceRankBadFlags(t *testing.T) {
	requireOneLineError(t, runCmd("allreduce", "--rank", "0"), "--peers")
	requireOneLineError(t, runCmd("allreduce", "--peers", "127.0.0.1,127.0.0.2"), "--rank")
	requireOneLineError(t, runCmd("allreduce", "--rank", "2", "--peers", "127.0.0.1,127.0.0.2"), "--rank 2")
	requireOneLineError(t, runCmd("allreduce", "--rank", "0", "--peers", "127.0.0.1"), "at least 2")
	requireOneLineError(t, runCmd("allreduce", "--rank", "0", "--peers", "127.0.0.1,127.0.0.1"), "twice")
	requireOneLineError(t, runCmd("allreduce", "--rank", "0", "--peers", "127.0.0.1,::1"), "IPv4")
	requireOneLineError(t, runCmd("allreduce", "--rank", "0", "--peers", "127.0.0.1,127.0.0.2", "--ranks", "3"), "--ranks")
	requireOneLineError(t, runCmd("allreduce", "--rank", "0", "--peers", "127.0.0.1,127.0.0.2", "--net", "mem"), "udp")
	requireOneLineError(t, runCmd("allreduce", "--rank", "0", "--peers", "127.0.0.1,127.0.0.2", "--cpus", "-1"), "--cpus -1")
}
