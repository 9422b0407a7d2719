package e2e

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
)

// readLatSize is the READ round trip's size: a 4 KiB block or a
// key-value entry read in one one-sided request.
const readLatSize = 4096

// BenchmarkReadLatency4K is an RDMA READ of 4 KiB, one at a time, in each
// latencyMode, against what the same application does over TCP: an
// 8-byte request answered by a 4 KiB response from a server goroutine
// (tcpRequestResponse, same run). The responder's side of the READ runs
// in its engine only: no application goroutine on that side wakes up,
// which is the point of one-sided access. Metrics as the other latency
// benchmarks (reportLatencyVsTCP): p50-ns, p99-ns, max-ns, the TCP
// request/response's quantiles and the ratios, and both sides' context
// switches per round trip (cs/rtt, tcp-cs/rtt).
func BenchmarkReadLatency4K(b *testing.B) {
	for _, mode := range latencyModes {
		b.Run(mode, func(b *testing.B) { benchReadLatency4K(b, mode) })
	}
}

func benchReadLatency4K(b *testing.B, mode string) {
	rounds := max(b.N, 100)
	tcp, tcpCPU := tcpRequestResponse(b, rounds, 8, readLatSize)
	floor := sysFloorRTT(b, rounds, []int{readRequestLen}, []int{readLatSize + readResponseOverhead})
	lat := newRTTs("rdma", b.N)
	na, nb := benchNodes(b)
	o := qpOpts{mtu: benchMTU, timeout: 14}
	a, bq := na.createQP(o), nb.createQP(o)
	connectQPs(b, na, a, nb, bq, o)
	wcs := make([]ib.WC, 1)
	wa := newCQWait(mode)
	// The remote block changes every round (its first 8 bytes are the
	// round number, written by nb's own CPU, not through the engine):
	// the check below proves each READ fetched the memory as it was at
	// that moment, not an earlier reply.
	remote := nb.buf[:readLatSize]
	local := na.buf[1<<20 : 1<<20+readLatSize]
	b.ReportAllocs()
	var cpu time.Duration
	apk := allocsPerPacket(na, nb, func() {
		b.ResetTimer()
		cpu0, cs0 := processCPU(), contextSwitches()
		for i := 1; i <= b.N; i++ {
			remote[0], remote[readLatSize-1] = byte(i), byte(i>>8)
			t0 := time.Now()
			if err := a.PostSend(ib.SendWR{Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
				SGL:        []ib.SGE{{Addr: na.mr.IOVA() + 1<<20, Length: readLatSize, LKey: na.mr.LKey()}},
				RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()}); err != nil {
				b.Fatal(err)
			}
			if n, err := wa.next(na.scq, wcs, nil); err != nil || n != 1 || wcs[0].Status != ib.WCSuccess {
				b.Fatalf("read: %v %v", err, wcs[0].Status)
			}
			lat.add(time.Since(t0))
			if local[0] != byte(i) || local[readLatSize-1] != byte(i>>8) {
				b.Fatalf("round %d: READ returned stale data (%d, %d)", i, local[0], local[readLatSize-1])
			}
		}
		cpu = processCPU() - cpu0
		lat.switchesSince(cs0, b.N)
		b.StopTimer()
	})
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/tcpCPU, "tcp-cpu-ratio")
	reportLatencyVsTCP(b, lat, tcp)
	reportMachineStalls(b, lat, mode)
	reportVsFloor(b, lat, floor)
	b.ReportMetric(apk, "allocs/pkt")
}
