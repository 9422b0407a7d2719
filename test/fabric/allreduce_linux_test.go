//go:build linux

package fabric

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/examples/allreduce"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// The ring allreduce runs as a real job would: one process per host,
// started inside the host's namespace (this test binary re-executed into
// TestAllreduceRankProcess by `ip netns exec`), each opening its own rxed
// device on its host's address and joining the ring over rdma_cm
// (allreduce.DialRDMA: Listen for the previous rank, Dial the next, across
// the bridge). Each process measures its own CPU time (getrusage), so the
// per-host CPU here is each host's, not a share of one process's.

// rankJobEnv carries a rank process's job (JSON rankJob) to it.
const rankJobEnv = "RXFAB_ALLREDUCE_RANK"

// rankJob is what one rank process is told to do.
type rankJob struct {
	Rank    int
	Peers   []netip.Addr // every rank's address, in rank order
	Sizes   []int        // bytes per allreduce, one ring each
	Iters   int          // timed allreduces per size, after one warm-up
	Loss    float64      // this host's injected loss both ways (0: none)
	Seed    int64
	CMPort  uint16
	Timeout time.Duration
}

// rankReport is a rank process's one line of output (after rankReportTag).
type rankReport struct {
	Rank    int
	Sizes   []sizeReport
	Error   string // the first failure, if any
	CPU     time.Duration
	Lost    [2]uint64 // datagrams the fault dropped: sent, received
	Seen    [2]uint64
	Retrans uint64 // retransmit_timeouts + rcvd_seq_err (NAK sequence errors received)
	Fatal   uint64 // retry_exceeded_err + send_err
}

type sizeReport struct {
	Bytes int
	Time  time.Duration // mean per allreduce, as this rank saw it
	BusBW float64       // GB/s
	Wrong int           // elements whose bits differ from the same-order sum
	CPU   time.Duration // this process's CPU per timed allreduce
}

const rankReportTag = "RXFAB-RANK-REPORT "

// TestAllreduceRankProcess is one rank of the ring in its own process: a
// no-op unless started by runRing.
func TestAllreduceRankProcess(t *testing.T) {
	spec := os.Getenv(rankJobEnv)
	if spec == "" {
		return
	}
	var job rankJob
	require.NoError(t, json.Unmarshal([]byte(spec), &job))
	rep := runRank(job)
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	fmt.Printf("%s%s\n", rankReportTag, b)
}

// runRank opens the host's device and runs the job's rings; a failure
// ends it (its neighbours see the disconnect or the silence and fail too).
func runRank(job rankJob) (rep rankReport) {
	rep.Rank = job.Rank
	var faulty *transport.Faulty
	cfg := ib.Config{Addrs: []netip.Addr{job.Peers[job.Rank]}, Workers: 1}
	if job.Loss > 0 {
		cfg.Fault = &transport.FaultConfig{Loss: job.Loss, Seed: job.Seed}
		cfg.Wrap = func(c transport.Conn) (transport.Conn, error) { faulty, _ = c.(*transport.Faulty); return c, nil }
	}
	dev, err := ib.OpenDevice(cfg)
	if err == nil {
		err = rdmacm.Enable(dev, nil)
	}
	if err != nil {
		rep.Error = fmt.Sprintf("rank %d device on %v: %v", job.Rank, job.Peers[job.Rank], err)
		return rep
	}
	defer func() {
		c := dev.Counters()
		rep.Retrans = c["retransmit_timeouts"] + c["rcvd_seq_err"]
		rep.Fatal = c["retry_exceeded_err"] + c["send_err"]
		if faulty != nil {
			s, r := faulty.FaultStats()
			rep.Lost, rep.Seen = [2]uint64{s.Lost, r.Lost}, [2]uint64{s.Seen, r.Seen}
		}
		dev.Close()
		rep.CPU, _ = processCPU()
	}()
	ctx := context.Background()
	n := len(job.Peers)
	for _, size := range job.Sizes {
		cfg := allreduce.Config{Rank: job.Rank, Ranks: n, Count: size / 4, Timeout: job.Timeout}
		r, err := allreduce.DialRDMA(ctx, dev, cfg, allreduce.RDMAConfig{
			Listen: netip.AddrPortFrom(job.Peers[job.Rank], job.CMPort),
			Next:   netip.AddrPortFrom(job.Peers[(job.Rank+1)%n], job.CMPort)})
		if err != nil {
			rep.Error = fmt.Sprintf("%d bytes: joining the ring: %v", size, err)
			return rep
		}
		res := allreduce.MeasureRank(ctx, r, job.Rank, n, job.Iters, processCPU)
		if res.Failed != nil {
			r.Close()
			rep.Error = fmt.Sprintf("%d bytes: %v", size, res.Failed)
			return rep
		}
		if err := r.Leave(ctx); err != nil {
			rep.Error = fmt.Sprintf("%d bytes: leaving: %v", size, err)
			return rep
		}
		rep.Sizes = append(rep.Sizes, sizeReport{Bytes: size, Time: res.Time, BusBW: res.BusBW, Wrong: res.Wrong, CPU: res.CPU})
	}
	return rep
}

func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// runRing starts one rank process per host of a fresh 8-host network and
// returns their reports in rank order, once every one has exited 0.
// loss, if not nil, is host i's (0-based) injected loss.
func runRing(t *testing.T, sizes []int, iters int, loss func(i int) float64) []rankReport {
	hs := network(t, hosts)
	peers := make([]netip.Addr, len(hs))
	for i, h := range hs {
		peers[i] = h.addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	type proc struct {
		cmd      *exec.Cmd
		out, err bytes.Buffer
		done     error
	}
	ps := make([]*proc, len(hs))
	var wg sync.WaitGroup
	for i, h := range hs {
		job := rankJob{Rank: i, Peers: peers, Sizes: sizes, Iters: iters, Seed: int64(16 + i), CMPort: 7471, Timeout: time.Minute}
		if loss != nil {
			job.Loss = loss(i)
		}
		spec, err := json.Marshal(job)
		require.NoError(t, err)
		p := &proc{cmd: h.ns.Command(ctx, os.Args[0], "-test.run=^TestAllreduceRankProcess$", "-test.count=1")}
		p.cmd.Env = append(os.Environ(), rankJobEnv+"="+string(spec))
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		p.cmd.WaitDelay = 5 * time.Second
		require.NoError(t, p.cmd.Start())
		ps[i] = p
		wg.Add(1)
		go func() { defer wg.Done(); p.done = p.cmd.Wait() }()
	}
	wg.Wait()
	reps := make([]rankReport, len(ps))
	for i, p := range ps {
		require.NotContainsf(t, p.err.String(), "WARNING: DATA RACE", "rank %d:\n%s", i, p.err.String())
		var line string
		sc := bufio.NewScanner(&p.out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), rankReportTag); ok {
				line = l
			}
		}
		require.NotEmptyf(t, line, "rank %d (%v) printed no report\nstdout:\n%s\nstderr:\n%s", i, p.done, p.out.String(), p.err.String())
		require.NoError(t, json.Unmarshal([]byte(line), &reps[i]))
		require.Emptyf(t, reps[i].Error, "rank %d failed", i)
		require.NoErrorf(t, p.done, "rank %d\nstderr:\n%s", i, p.err.String())
		require.Equal(t, i, reps[i].Rank)
		require.Len(t, reps[i].Sizes, len(sizes), "rank %d", i)
		require.Zero(t, reps[i].Fatal, "rank %d: retry_exceeded_err+send_err", i)
		for k, s := range reps[i].Sizes {
			require.Equal(t, sizes[k], s.Bytes)
			require.Zerof(t, s.Wrong, "rank %d, %d bytes: elements differing from the same-order sum", i, s.Bytes)
			require.Positive(t, s.Time, "rank %d, %d bytes: no time measured", i, s.Bytes)
		}
	}
	return reps
}

// logRing reports each size's bus bandwidth (the slowest rank's view: the
// ring runs at its pace; each rank sends busbw bytes a second to its next,
// so the fabric carries n times that) and the CPU per host per allreduce, as a share
// of a core over the allreduce's time.
func logRing(t *testing.T, label string, reps []rankReport, iters int) {
	for k := range reps[0].Sizes {
		var times, cpus []time.Duration
		bw := reps[0].Sizes[k].BusBW
		for _, r := range reps {
			s := r.Sizes[k]
			times, cpus = append(times, s.Time), append(cpus, s.CPU)
			bw = min(bw, s.BusBW)
		}
		slowest := slices.Max(times)
		var sum time.Duration
		for _, c := range cpus {
			sum += c
		}
		mean := sum / time.Duration(len(cpus))
		t.Logf("%s: %d ranks, %d KiB, %d timed allreduces, every rank bit-exact: %v per allreduce (slowest rank), "+
			"bus bandwidth %.1f MB/s (%.0f MB/s over the fabric's links); CPU per host per allreduce %v mean (min %v, max %v), %.0f%% of a core per host",
			label, len(reps), reps[0].Sizes[k].Bytes>>10, iters, slowest.Round(10*time.Microsecond), bw*1e3, bw*1e3*float64(len(reps)),
			mean.Round(10*time.Microsecond), slices.Min(cpus).Round(10*time.Microsecond), slices.Max(cpus).Round(10*time.Microsecond),
			100*mean.Seconds()/slowest.Seconds())
	}
}

// The ring allreduce (reduce-scatter then all-gather by RDMA WRITE with
// immediate, ranks connected by rdma_cm) across the eight hosts, one rank
// process per host: every rank's vector equals the same-order sum bit for
// bit, at every size.
func TestEightHostAllreduce(t *testing.T) {
	const iters = 3
	reps := runRing(t, []int{64 << 10, 1 << 20, 4 << 20}, iters, nil)
	logRing(t, "allreduce", reps, iters)
	for _, r := range reps {
		require.Zero(t, r.Lost, "rank %d: no fault configured", r.Rank)
	}
}

// The same ring with 2% loss both ways on host 2's link (rxed's fault
// injection in rank 1's process): every allreduce completes bit-exact, and
// the loss really happened and was recovered (its peers' NAK sequence
// errors and retransmit timers).
func TestEightHostAllreduceLossyLink(t *testing.T) {
	const iters, lossy = 3, 1
	reps := runRing(t, []int{1 << 20}, iters, func(i int) float64 {
		if i == lossy {
			return 0.02
		}
		return 0
	})
	logRing(t, "allreduce, 2% loss on host 2's link", reps, iters)
	l := reps[lossy]
	var retrans uint64
	for _, r := range reps {
		retrans += r.Retrans
	}
	t.Logf("host 2: the fault dropped %d of %d datagrams sent, %d of %d received; all hosts' retransmit_timeouts+rcvd_seq_err %d",
		l.Lost[0], l.Seen[0], l.Lost[1], l.Seen[1], retrans)
	require.NotZero(t, l.Lost[0]+l.Lost[1], "the lossy link lost nothing")
	require.NotZero(t, retrans, "loss with no recovery counted anywhere")
}
