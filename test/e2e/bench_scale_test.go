package e2e

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
)

// BenchmarkScaleQPs connects many RC QP pairs between two devices over
// loopback UDP (4096 by default) and then measures 64 KiB RDMA WRITE
// bandwidth spread round-robin over the first 16 of them and over all of
// them, on the same devices, with benchDepth WRITEs in flight in total in
// both (so the difference is what the number of QPs costs: per-QP state
// out of cache, the shards' bookkeeping, timers). It runs only when
// RXED_SCALE_QPS is set ("1": 4096 QPs, or a number), because setting up
// takes a while:
//
//	RXED_SCALE_QPS=1 go test -run '^$' -bench ScaleQPs -benchtime 20000x ./test/e2e
//
// Each sub-benchmark reports, beside MB/s and its TCP stream baseline of
// the same run (tcp-MB/s, tcp-ratio):
//
//	B/qp            heap bytes per QP (runtime.MemStats.HeapAlloc after a GC,
//	                before and after creating and connecting; both devices'
//	                QPs counted), queues as perftest's ib_write_bw sizes them
//	create-qps/s    QPs created per second (ibv_create_qp, both devices)
//	connect-pairs/s pairs moved to RTS towards each other per second (six
//	                ModifyQP calls each)
//	ratio-16        MB/s over all QPs / MB/s over 16 (the qps=all run; the
//	                qps=16 run comes first)
func BenchmarkScaleQPs(b *testing.B) {
	v := os.Getenv("RXED_SCALE_QPS")
	if v == "" {
		b.Skip("set RXED_SCALE_QPS=1 (4096 QPs) or RXED_SCALE_QPS=<n> to run the scale benchmark")
	}
	nqp := 4096
	if k, err := strconv.Atoi(v); err == nil && k > 16 {
		nqp = k
	}
	na, nb := benchNodes(b)
	o := qpOpts{mtu: benchMTU, timeout: 14}
	o.defaults()
	c := ib.QPCap{MaxSendWR: 128, MaxRecvWR: 128, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}
	mk := func(n *node) *ib.QP {
		q, err := n.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: n.scq, RecvCQ: n.rcq, Cap: c})
		if err != nil {
			b.Fatalf("create QP: %v", err)
		}
		return q
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	h0 := heap()
	qa, qb := make([]*ib.QP, nqp), make([]*ib.QP, nqp)
	t0 := time.Now()
	for i := range qa {
		qa[i], qb[i] = mk(na), mk(nb)
	}
	created := time.Since(t0)
	t1 := time.Now()
	for i := range qa {
		connectQPs(b, na, qa[i], nb, qb[i], o)
	}
	connected := time.Since(t1)
	perQP := float64(heap()-h0) / float64(2*nqp)
	createRate := float64(2*nqp) / created.Seconds()
	connectRate := float64(nqp) / connected.Seconds()
	var bw16 float64
	for _, k := range []int{16, nqp} {
		name := fmt.Sprintf("qps=%d", k)
		if k == nqp {
			name = fmt.Sprintf("qps=all(%d)", k)
		}
		b.Run(name, func(b *testing.B) {
			tcp, _ := tcpStream(b, b.N, benchMsg)
			b.SetBytes(benchMsg)
			b.ReportAllocs()
			retries0 := retries(na, nb)
			b.ResetTimer()
			start := time.Now()
			runWritesRoundRobin(b, na, nb, qa[:k], benchDepth, b.N)
			el := time.Since(start)
			b.StopTimer()
			mbs := float64(b.N) * benchMsg / el.Seconds() / 1e6
			if k == 16 {
				bw16 = mbs
			} else if bw16 > 0 {
				b.ReportMetric(mbs/bw16, "ratio-16")
			}
			b.ReportMetric(tcp, "tcp-MB/s")
			b.ReportMetric(mbs/tcp, "tcp-ratio")
			b.ReportMetric(perQP, "B/qp")
			b.ReportMetric(createRate, "create-qps/s")
			b.ReportMetric(connectRate, "connect-pairs/s")
			b.ReportMetric(float64(retries(na, nb)-retries0), "retries")
		})
	}
}

// runWritesRoundRobin keeps depth signalled 64 KiB WRITEs in flight in
// total, each new one on the next QP of qps in turn, until n completed.
func runWritesRoundRobin(b *testing.B, na, nb *node, qps []*ib.QP, depth, n int) {
	posted, done, next := 0, 0, 0
	wcs := make([]ib.WC, 64)
	post := func() {
		off := (posted % 32) * benchMsg
		q := qps[next]
		next = (next + 1) % len(qps)
		if err := q.PostSend(ib.SendWR{ID: uint64(posted), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL: []ib.SGE{sge(na, off, benchMsg)}, RemoteAddr: nb.mr.IOVA() + uint64(off), RKey: nb.mr.RKey()}); err != nil {
			b.Fatal(err)
		}
		posted++
	}
	for posted < depth && posted < n {
		post()
	}
	for done < n {
		c, err := waitWCs(na.scq, wcs, true, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, wc := range wcs[:c] {
			if wc.Status != ib.WCSuccess {
				b.Fatalf("wc %v", wc.Status)
			}
			done++
			if posted < n {
				post()
			}
		}
	}
}
