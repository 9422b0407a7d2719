//go:build linux

package transport

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fakeKernelConn is a udpConn of one socket bound to local whose sends go
// to mtuKernel (a route of MTU 1500 under IP_PMTUDISC_DO), batches of up
// to four messages, as TestSendCountsEachDatagramOnce's.
func fakeKernelConn(t *testing.T, local string, gso bool) (*udpConn, *mtuKernel) {
	c := &udpConn{log: slog.New(slog.DiscardHandler), closed: make(chan struct{})}
	s := &udpSocket{conn: c, local: netip.MustParseAddrPort(local)}
	s.addr = s.local.Addr()
	c.socks, c.locals = []*udpSocket{s}, []netip.AddrPort{s.local}
	y := &s.sys
	y.allocTx(4)
	y.gso.Store(gso)
	k := &mtuKernel{t: t, y: y, mtu: 1500, gsoErr: unix.EMSGSIZE}
	y.rc, y.sendFn = fakeRawConn{}, k.send
	return c, k
}

// TestPcapRecorderRecordsTheSentOfAPartlyRefusedBatch: when the kernel
// refuses some datagrams of a batch (over the path MTU) and sends the
// rest, the capture holds exactly the ones it sent, in order, through
// Send and SendGather, with GSO or without.
//
// Bug (follow-up item 1 of the transport's counters): the recorder wrote
// nothing when the inner Send returned an error, so the datagrams that
// went out were missing from the capture.
func TestPcapRecorderRecordsTheSentOfAPartlyRefusedBatch(t *testing.T) {
	lens := []int{100, 4000, 101, 4000, 4000, 102, 103}
	for _, gso := range []bool{false, true} {
		for _, gather := range []bool{false, true} {
			t.Run(fmt.Sprintf("gso %v gather %v", gso, gather), func(t *testing.T) {
				c, k := fakeKernelConn(t, "127.0.0.1:4791", gso)
				var w bytes.Buffer
				r, err := NewPcapRecorder(c, &w, PcapOptions{})
				require.NoError(t, err)
				bufs := dgramsOfLens(lens...)
				ep := Endpoint{Remote: netip.MustParseAddrPort("127.0.0.2:4791")}
				if gather {
					g := make([]Gather, len(bufs))
					for i, b := range bufs {
						g[i] = Gather{b[:len(b)/2], b[len(b)/2:]}
					}
					err = r.SendGather(g, ep)
				} else {
					err = r.Send(bufs, ep)
				}
				require.ErrorIs(t, err, unix.EMSGSIZE)
				require.Equal(t, 3, Refused(err, len(bufs)))
				require.Equal(t, []int{100, 101, 102, 103}, k.sent)

				frames := readPcap(t, w.Bytes())
				var got []int // the recorded datagrams' positions
				for _, f := range frames {
					require.Equal(t, netip.MustParseAddr("127.0.0.1"), netip.AddrFrom4([4]byte(f.ip4.SrcIP.To4())))
					p := f.udp.Payload
					i := int(p[0]) - 1 // dgramsOfLens fills datagram i with i+1
					require.Equal(t, bufs[i], []byte(p))
					got = append(got, i)
				}
				require.Equal(t, []int{0, 2, 5, 6}, got, "the sent datagrams, recorded")
			})
		}
	}
}
