//go:build linux

package transport

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
)

// fakeRawConn runs writeBatch's attempts at once, as a socket that never
// has to wait would.
type fakeRawConn struct{}

func (fakeRawConn) Control(f func(uintptr)) error { f(0); return nil }
func (fakeRawConn) Read(f func(uintptr) bool) error {
	for !f(0) {
	}
	return nil
}
func (fakeRawConn) Write(f func(uintptr) bool) error {
	for !f(0) {
	}
	return nil
}

// mtuKernel stands in for sendmmsg on an IPv4 route of MTU mtu and an
// IP_PMTUDISC_DO socket: a datagram over the MTU is refused (EMSGSIZE), a
// GSO message whose segments would exceed it too (gsoErr: EINVAL on older
// kernels, EMSGSIZE on newer ones, udp_send_skb);
// like the real call it sends messages from the first until one is
// refused, and reports that refusal only when it is the first.
type mtuKernel struct {
	t      *testing.T
	y      *sockSys
	mtu    int
	gsoErr error
	sent   []int // the lengths of the datagrams that went out
}

func (k *mtuKernel) send(uintptr) bool {
	y := k.y
	msgs := readPacked(k.t, y, y.txEnd)
	n := 0
	for i := y.txOff; i < y.txEnd; i++ {
		m := msgs[i]
		var err error
		switch {
		case m.segSize > 0 && m.segSize+28 > k.mtu:
			err = k.gsoErr
		case m.segSize == 0 && len(m.data)+28 > k.mtu:
			err = unix.EMSGSIZE
		}
		if err != nil {
			if n == 0 {
				y.txN, y.txErr = 0, err
				return true
			}
			break
		}
		if m.segSize == 0 {
			k.sent = append(k.sent, len(m.data))
		} else {
			for off := 0; off < len(m.data); off += m.segSize {
				k.sent = append(k.sent, min(m.segSize, len(m.data)-off))
			}
		}
		n++
	}
	y.txN, y.txErr = n, nil
	return true
}

// TestWriteBatchSendsPastARefusedDatagram: a datagram the kernel refuses
// (EMSGSIZE: longer than the path MTU, which IP_PMTUDISC_DO does not
// fragment) is the only one lost; the rest of the batch goes out and Send
// reports the refusal. writeBatch returned at the first refusal, dropping
// every datagram behind it: an oversized request took the ACKs and small
// packets batched after it along (rdma_rxe sends each packet on its own).
//
// Bug (found by the transport audit, session AF): writeBatch returned at
// the first refused message, silently dropping the rest of the batch.
func TestWriteBatchSendsPastARefusedDatagram(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lens     []int
		gso      bool
		wantSent []int
		wantErr  error
	}{
		{name: "all fit", lens: []int{100, 1400, 7}, wantSent: []int{100, 1400, 7}},
		{name: "one too long in the middle", lens: []int{100, 4000, 101, 102},
			wantSent: []int{100, 101, 102}, wantErr: unix.EMSGSIZE},
		{name: "first too long", lens: []int{4000, 100}, wantSent: []int{100}, wantErr: unix.EMSGSIZE},
		{name: "every one too long", lens: []int{4000, 4000, 5000}, wantErr: unix.EMSGSIZE},
		{name: "gso run too long, then a short one", lens: []int{4000, 4000, 4000, 100}, gso: true,
			wantSent: []int{100}, wantErr: unix.EMSGSIZE},
		{name: "gso run too long, ended by a short one, then more", lens: []int{4000, 4000, 101, 102}, gso: true,
			wantSent: []int{101, 102}, wantErr: unix.EMSGSIZE},
		{name: "gso run that fits, then one too long, then another run", lens: []int{100, 100, 4000, 200, 200}, gso: true,
			wantSent: []int{100, 100, 200, 200}, wantErr: unix.EMSGSIZE},
		{name: "more than one round of mmsghdrs", lens: []int{1, 9000, 2, 3, 9000, 4, 5, 6, 9000, 7}, gso: false,
			wantSent: []int{1, 2, 3, 4, 5, 6, 7}, wantErr: unix.EMSGSIZE},
	} {
		for _, gsoErr := range []error{unix.EINVAL, unix.EMSGSIZE} {
			t.Run(fmt.Sprint(tc.name, "/gso refused with ", gsoErr), func(t *testing.T) {
				s := &udpSocket{conn: &udpConn{log: slog.New(slog.DiscardHandler)}, local: netip.MustParseAddrPort("127.0.0.1:4791")}
				y := &s.sys
				y.allocTx(4)
				y.gso.Store(tc.gso)
				k := &mtuKernel{t: t, y: y, mtu: 1500, gsoErr: gsoErr}
				y.rc, y.sendFn = fakeRawConn{}, k.send
				sent, _, err := s.writeBatch(dgramsOfLens(tc.lens...), nil, netip.MustParseAddrPort("127.0.0.2:4791"), netip.Addr{}, ipTraffic{})
				if tc.wantErr == nil {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, tc.wantErr)
				}
				require.Equal(t, tc.wantSent, k.sent)
				require.Equal(t, len(tc.wantSent), sent)
			})
		}
	}
}

// TestSendPastEMSGSIZEInNetns is the same with the kernel: in a network
// namespace of its own whose loopback has an MTU of 1500, a batch with a
// 4000-byte datagram in the middle delivers the others. The counters see
// each datagram once: the four sent in SentPackets, the two refused in
// the error (TestSendCountsEachDatagramOnce's bug: none was counted sent).
func TestSendPastEMSGSIZEInNetns(t *testing.T) {
	why := netns.Available()
	testenv.Need(t, why == "", "%s", why)
	ns, err := netns.Create(fmt.Sprintf("rxed-msgsize-%d", os.Getpid()))
	require.NoError(t, err)
	defer ns.Delete()
	require.NoError(t, ns.IP("link", "set", "lo", "mtu", "1500"))
	for _, m := range offloadModes {
		cfg := UDPConfig{Addrs: []netip.Addr{lo1}, DisableGSO: m.noGSO, DisableGRO: m.noGRO}
		var a, b Conn
		require.NoError(t, ns.Do(func() error { // the sockets stay in the namespace
			var err error
			if a, err = OpenUDP(cfg); err == nil {
				if b, err = OpenUDP(cfg); err != nil {
					a.Close()
				}
			}
			return err
		}))
		bufs := dgramsOfLens(100, 100, 4000, 4000, 101, 102)
		err = a.Send(bufs, Endpoint{Remote: b.LocalAddrs()[0]})
		require.ErrorIs(t, err, unix.EMSGSIZE, m.name)
		require.Equal(t, 2, Refused(err, len(bufs)), m.name)
		st := a.(StatsReporter).Stats()
		require.Equal(t, uint64(4), st.SentPackets, m.name)
		require.Equal(t, uint64(100+100+101+102), st.SentBytes, m.name)
		got := receiveN(t, b, 4, MaxDatagramSize)
		want := [][]byte{bufs[0], bufs[1], bufs[4], bufs[5]}
		for i := range want {
			require.Equal(t, want[i], got[i].data, "%s: datagram %d", m.name, i)
		}
		a.Close()
		b.Close()
	}
}
