package e2e

import (
	"runtime"
	"testing"
	"time"
)

// BenchmarkThreadWake measures what waking a sleeping thread costs on
// this machine, the unit the latency benchmarks' tails are made of: two
// goroutines pass a token back and forth over unbuffered channels, one
// op being a round trip. Locked to an OS thread each (locked), every pass
// wakes the other thread from its futex sleep, usually on the other CPU;
// unlocked, the Go scheduler runs both on one thread and a pass is a
// goroutine switch. On the 2-vCPU VM: locked 36-50 us per round trip, so
// 18-25 us per wake-up, unlocked 0.4 us (docs/performance.md, session G).
// A round trip of any kind that wakes a thread per packet pays the first
// figure; cs/rtt in the latency benchmarks counts those wake-ups.
func BenchmarkThreadWake(b *testing.B) {
	for _, locked := range []bool{false, true} {
		name := "unlocked"
		if locked {
			name = "locked"
		}
		b.Run(name, func(b *testing.B) { benchThreadWake(b, locked) })
	}
}

func benchThreadWake(b *testing.B, locked bool) {
	ping, pong := make(chan struct{}), make(chan struct{})
	go func() {
		if locked {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
		}
		for range ping {
			pong <- struct{}{}
		}
	}()
	defer close(ping)
	if locked {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	lat := newRTTs("wake", b.N)
	cs0 := contextSwitches()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		ping <- struct{}{}
		<-pong
		lat.add(time.Since(t0))
	}
	b.StopTimer()
	lat.switchesSince(cs0, b.N)
	p50, p99, _ := lat.quantiles()
	b.ReportMetric(p50, "p50-ns")
	b.ReportMetric(p99, "p99-ns")
	b.ReportMetric(lat.cs, "cs/rtt")
}
