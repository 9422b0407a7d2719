//go:build linux

package transport

import (
	"net"
	"testing"

	"golang.org/x/net/ipv4"
)

// BenchmarkXNetBatch is golang.org/x/net's ipv4.PacketConn ReadBatch /
// WriteBatch over the same windowed loopback transfer, kept as the reason
// udp_linux.go calls recvmmsg itself: x/net allocates a *net.UDPAddr and its
// IP slice for every message received (see allocs/op, per datagram).
func BenchmarkXNetBatch(b *testing.B) {
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
			pa, pc := ipv4.NewPacketConn(a), ipv4.NewPacketConn(c)
			to := c.LocalAddr()
			wms := make([]ipv4.Message, DefaultBatchSize)
			for i := range wms {
				wms[i].Buffers = make([][]byte, 1)
				wms[i].Addr = to
			}
			rms := make([]ipv4.Message, DefaultBatchSize)
			for i := range rms {
				rms[i].Buffers = [][]byte{make([]byte, MaxDatagramSize)}
			}
			pump(b, DefaultBatchSize, s.size,
				func(bufs [][]byte) error {
					for i, d := range bufs {
						wms[i].Buffers[0] = d
					}
					for off := 0; off < len(bufs); {
						n, err := pa.WriteBatch(wms[off:len(bufs)], 0)
						if err != nil {
							return err
						}
						off += n
					}
					return nil
				},
				func() (int, error) { return pc.ReadBatch(rms, 0) },
				func() { c.Close() })
		})
	}
}
