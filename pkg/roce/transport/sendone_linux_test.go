//go:build linux

package transport

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSendOneMessage: a batch that makes one message goes out with
// sendto (one piece, no control data) or sendmsg (pieces, or a GSO
// message's UDP_SEGMENT), not sendmmsg (sendOne, session N); each shape
// arrives whole and in order, and a refused send reports the kernel's
// error through either call.
func TestSendOneMessage(t *testing.T) {
	kgso, _ := probeOffloadsForTest()
	type shape struct {
		name    string
		bufs    [][]byte // Send
		gathers []Gather // SendGather, when set
		gso     bool     // one UDP_SEGMENT message when the kernel has GSO
	}
	shapes := []shape{
		{name: "one piece (sendto, raw)", bufs: [][]byte{bytes.Repeat([]byte{7}, 60)}},
		{name: "one piece at rawSendMax (sendto, raw)", bufs: [][]byte{bytes.Repeat([]byte{8}, rawSendMax)}},
		{name: "one piece over rawSendMax (sendto)", bufs: [][]byte{bytes.Repeat([]byte{9}, rawSendMax+1)}},
		{name: "empty datagram (sendto)", bufs: [][]byte{{}}},
		{name: "pieces (sendmsg)", gathers: []Gather{{[]byte("headers-"), []byte("payload-"), []byte("icrc")}}},
		{name: "payload only (sendto of the one iovec)", gathers: []Gather{{nil, []byte("payload"), nil}}},
		{name: "a GSO run (sendmsg with UDP_SEGMENT)", bufs: dgramsOfLens(1000, 1000, 1000, 400), gso: true},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			snd := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
			rcv := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo2}})
			to := Endpoint{Remote: rcv.LocalAddrs()[0]}
			var want [][]byte
			if sh.gathers != nil {
				for _, g := range sh.gathers {
					want = append(want, bytes.Join(g[:], nil))
				}
				require.NoError(t, snd.(GatherSender).SendGather(sh.gathers, to))
			} else {
				want = sh.bufs
				require.NoError(t, snd.Send(sh.bufs, to))
			}
			got := receiveN(t, rcv, len(want), MaxDatagramSize)
			require.Len(t, got, len(want))
			for i := range want {
				require.Equal(t, want[i], got[i].data, "datagram %d", i)
				require.Equal(t, addrOf(snd, lo1), got[i].ep.Remote, "datagram %d's source", i)
			}
			st := snd.(StatsReporter).Stats()
			require.Equal(t, uint64(len(want)), st.SentPackets)
			if sh.gso && kgso {
				require.Equal(t, uint64(1), st.GSOSends, "the run is one message")
			} else {
				require.Zero(t, st.GSOSends)
			}
		})
	}

	// Port 0 is refused by udp_sendmsg (EINVAL) whichever call carries
	// the message.
	snd := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	nowhere := Endpoint{Remote: netip.AddrPortFrom(lo2, 0)}
	require.ErrorIs(t, snd.Send([][]byte{[]byte("x")}, nowhere), unix.EINVAL, "sendto")
	require.ErrorIs(t, snd.(GatherSender).SendGather([]Gather{{[]byte("h"), []byte("p"), nil}}, nowhere), unix.EINVAL, "sendmsg")
	require.ErrorIs(t, snd.Send([][]byte{[]byte("x"), []byte("yy")}, nowhere), unix.EINVAL, "sendmmsg")
}

// TestSockOutcome: what a socket call's return comes to (EINTR is retried
// before it gets here): a count, "wait" for EAGAIN, or the error.
func TestSockOutcome(t *testing.T) {
	for _, tc := range []struct {
		r    uintptr
		e    unix.Errno
		n    int
		done bool
		err  error
	}{
		{r: 3, e: 0, n: 3, done: true},
		{r: 0, e: 0, n: 0, done: true},
		{e: unix.EAGAIN, done: false},
		{e: unix.EMSGSIZE, done: true, err: unix.EMSGSIZE},
		{e: unix.ECONNREFUSED, done: true, err: unix.ECONNREFUSED},
	} {
		n, done, err := sockOutcome(tc.r, tc.e)
		require.Equal(t, tc.n, n, "%v", tc.e)
		require.Equal(t, tc.done, done, "%v", tc.e)
		if tc.err == nil {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, tc.err)
		}
	}
}
