package transport

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSendGatherJoinsPieces sends datagrams in pieces, with GSO on and
// off, in runs of equal lengths (which GSO packs into one message) and
// mixed lengths, and checks every datagram arrives as its pieces joined.
func TestSendGatherJoinsPieces(t *testing.T) {
	for _, noGSO := range []bool{false, true} {
		t.Run(map[bool]string{false: "gso", true: "nogso"}[noGSO], func(t *testing.T) {
			open := func(a string) Conn {
				c, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr(a)}, BatchSize: 8, DisableGSO: noGSO})
				require.NoError(t, err)
				t.Cleanup(func() { c.Close() })
				return c
			}
			snd, rcv := open("127.0.0.1"), open("127.0.0.2")
			gs, ok := snd.(GatherSender)
			require.True(t, ok)
			var dgrams []Gather
			var want [][]byte
			add := func(h, p, tr int) {
				i := len(dgrams)
				g := Gather{bytes.Repeat([]byte{byte(i)}, h), bytes.Repeat([]byte{byte(100 + i)}, p), bytes.Repeat([]byte{byte(200 + i)}, tr)}
				dgrams = append(dgrams, g)
				want = append(want, bytes.Join(g[:], nil))
			}
			// 20 datagrams of 1028 bytes (a GSO run longer than the batch
			// of 8), then odd shapes: payload only, header only, a shorter
			// one ending a run, and an empty one.
			for range 20 {
				add(28, 996, 4)
			}
			add(0, 500, 0)
			add(40, 0, 0)
			add(12, 1000, 16) // 1028 again: starts a new run
			add(12, 100, 4)   // shorter: ends it
			add(0, 0, 0)
			require.NoError(t, gs.SendGather(dgrams, Endpoint{Remote: rcv.LocalAddrs()[0]}))
			got := receiveN(t, rcv, len(want), MaxDatagramSize)
			require.Equal(t, len(want), len(got))
			for i := range want {
				require.Equal(t, want[i], got[i].data, "datagram %d", i)
			}
			st := snd.(interface{ Stats() Stats }).Stats()
			require.Equal(t, uint64(len(want)), st.SentPackets)
			if noGSO {
				require.Zero(t, st.GSOSends)
			} else if kgso, _ := probeOffloadsForTest(); kgso {
				require.Positive(t, st.GSOSends, "the 1028-byte runs go out as GSO messages")
			}
		})
	}
}

// TestSendGatherRefusesOversize: a datagram longer than MaxDatagramSize
// in total is refused before anything is sent.
func TestSendGatherRefusesOversize(t *testing.T) {
	c, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	require.NoError(t, err)
	defer c.Close()
	big := Gather{make([]byte, 100), make([]byte, MaxDatagramSize), nil}
	err = c.(GatherSender).SendGather([]Gather{big}, Endpoint{Remote: netip.MustParseAddrPort("127.0.0.2:4791")})
	require.ErrorIs(t, err, ErrTooLarge)
	require.NoError(t, c.(GatherSender).SendGather(nil, Endpoint{Remote: netip.MustParseAddrPort("127.0.0.2:4791")}))
	c.Close()
	err = c.(GatherSender).SendGather([]Gather{{[]byte{1}}}, Endpoint{Remote: netip.MustParseAddrPort("127.0.0.2:4791")})
	require.Error(t, err)
}
