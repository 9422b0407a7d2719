package transport

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// Throughput benchmarks move b.N datagrams from one endpoint to another over
// loopback with a bounded window of datagrams in flight (so nothing is lost
// to a full socket buffer). b.SetBytes makes MB/s the payload rate; pkts/s
// is reported too, and allocs/op is per datagram. BenchmarkRawUDP is the
// baseline the engine's figures are compared with: plain net.UDPConn,
// one WriteToUDPAddrPort / ReadFromUDPAddrPort per datagram.

const benchWindowBatches = 4

// benchWatchdog closes the receiving socket of a benchmark still running
// after this long: a lost datagram would otherwise hang it until go
// test's timeout. Benchmarks run about a second per b.N.
const benchWatchdog = 60 * time.Second

// pump runs the windowed transfer: send is called from a separate goroutine
// with at most batch datagrams; recv returns how many arrived.
func pump(b *testing.B, batch, size int, send func([][]byte) error, recv func() (int, error), abort func()) {
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = payload(i, size)
	}
	window := benchWindowBatches * batch
	acks := make(chan int, window+1)
	sendErr := make(chan error, 1)
	watchdog := time.AfterFunc(benchWatchdog, abort) // a lost datagram would hang the window
	defer watchdog.Stop()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	go func() {
		sent, acked := 0, 0
		for sent < b.N {
			for sent-acked >= window {
				acked += <-acks
			}
			k := min(batch, b.N-sent, window-(sent-acked))
			if err := send(bufs[:k]); err != nil {
				sendErr <- err
				return
			}
			sent += k
		}
		sendErr <- nil
	}()
	for got := 0; got < b.N; {
		n, err := recv()
		if err != nil {
			b.Fatalf("receive after %d of %d: %v", got, b.N, err)
		}
		got += n
		acks <- n
	}
	el := time.Since(start)
	b.StopTimer()
	if err := <-sendErr; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "pkts/s")
}

func benchConn(b *testing.B, size int, cfg UDPConfig, rxAddrs ...netip.Addr) {
	cfg.Addrs = []netip.Addr{lo1}
	a, err := OpenUDP(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	if len(rxAddrs) > 0 {
		cfg.Addrs = rxAddrs
	}
	c, err := OpenUDP(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ep := Endpoint{Local: a.LocalAddrs()[0], Remote: c.LocalAddrs()[0]}
	r := newRxSet(c.BatchSize(), MaxDatagramSize)
	pump(b, a.BatchSize(), size,
		func(bufs [][]byte) error { return a.Send(bufs, ep) },
		func() (int, error) { return c.Receive(r.bufs, r.sizes, r.eps) },
		func() { c.Close() })
}

var benchSizes = []struct {
	name string
	size int
}{{"64B", 64}, {"4KiB", 4096}}

func BenchmarkUDPConn(b *testing.B) {
	for _, s := range benchSizes {
		for _, m := range offloadModes {
			b.Run(s.name+"/"+m.name, func(b *testing.B) {
				benchConn(b, s.size, UDPConfig{DisableGSO: m.noGSO, DisableGRO: m.noGRO})
			})
		}
		// A receiver on two addresses multiplexes through reader goroutines.
		b.Run(s.name+"/gso+gro/two-sockets", func(b *testing.B) {
			benchConn(b, s.size, UDPConfig{}, lo1, lo2)
		})
	}
}

func BenchmarkRawUDP(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			a, err := net.ListenUDP("udp4", &net.UDPAddr{IP: lo1.AsSlice()})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: lo1.AsSlice()})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			_ = c.SetReadBuffer(DefaultSocketBufferBytes)
			to := c.LocalAddr().(*net.UDPAddr).AddrPort()
			rbuf := make([]byte, MaxDatagramSize)
			pump(b, DefaultBatchSize, s.size,
				func(bufs [][]byte) error {
					for _, d := range bufs {
						if _, err := a.WriteToUDPAddrPort(d, to); err != nil {
							return err
						}
					}
					return nil
				},
				func() (int, error) {
					_, _, err := c.ReadFromUDPAddrPort(rbuf)
					return 1, err
				},
				func() { c.Close() })
		})
	}
}

func BenchmarkMemNetwork(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			mn := NewMemNetwork()
			a, _ := mn.Listen(ap("10.0.0.1:1"))
			c, _ := mn.Listen(ap("10.0.0.2:1"))
			defer a.Close()
			defer c.Close()
			ep := Endpoint{Remote: ap("10.0.0.2:1")}
			r := newRxSet(DefaultBatchSize, MaxDatagramSize)
			pump(b, DefaultBatchSize, s.size,
				func(bufs [][]byte) error { return a.Send(bufs, ep) },
				func() (int, error) { return c.Receive(r.bufs, r.sizes, r.eps) },
				func() { c.Close() })
		})
	}
}

// Round-trip latency of one 8-byte datagram (echoed by a goroutine), for
// our Conn and for plain sockets; ns/op is the round-trip time.
func BenchmarkUDPConnRoundTrip(b *testing.B) {
	a := openTestUDP(b, UDPConfig{Addrs: []netip.Addr{lo1}})
	c := openTestUDP(b, UDPConfig{Addrs: []netip.Addr{lo1}})
	go func() {
		r := newRxSet(c.BatchSize(), MaxDatagramSize)
		echo := make([][]byte, 1)
		for {
			n, err := c.Receive(r.bufs, r.sizes, r.eps)
			if err != nil {
				return
			}
			for i := range n {
				echo[0] = r.bufs[i][:r.sizes[i]]
				if c.Send(echo, Endpoint{Remote: r.eps[i].Remote}) != nil {
					return
				}
			}
		}
	}()
	msg := [][]byte{make([]byte, 8)}
	ep := Endpoint{Remote: c.LocalAddrs()[0]}
	r := newRxSet(1, 64)
	watchdog := time.AfterFunc(benchWatchdog, func() { a.Close() }) // a lost datagram would hang the loop
	defer watchdog.Stop()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := a.Send(msg, ep); err != nil {
			b.Fatal(err)
		}
		if _, err := a.Receive(r.bufs, r.sizes, r.eps); err != nil {
			b.Fatalf("round trip %d of %d (closed by the %v watchdog if a datagram was lost): %v", i, b.N, benchWatchdog, err)
		}
	}
}

func BenchmarkRawUDPRoundTrip(b *testing.B) {
	a, err := net.ListenUDP("udp4", &net.UDPAddr{IP: lo1.AsSlice()})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: lo1.AsSlice()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if _, err := c.WriteToUDPAddrPort(buf[:n], from); err != nil {
				return
			}
		}
	}()
	to := c.LocalAddr().(*net.UDPAddr).AddrPort()
	msg, buf := make([]byte, 8), make([]byte, 64)
	watchdog := time.AfterFunc(benchWatchdog, func() { a.Close() }) // a lost datagram would hang the loop
	defer watchdog.Stop()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := a.WriteToUDPAddrPort(msg, to); err != nil {
			b.Fatal(err)
		}
		if _, _, err := a.ReadFromUDPAddrPort(buf); err != nil {
			b.Fatalf("round trip %d of %d (closed by the %v watchdog if a datagram was lost): %v", i, b.N, benchWatchdog, err)
		}
	}
}
