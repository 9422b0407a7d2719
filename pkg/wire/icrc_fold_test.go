package wire

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// randomHeaders returns an IPv4 (20 bytes) or IPv6 (40 bytes) header and a
// UDP header of random content with the right version nibble.
func randomHeaders(rng *rand.Rand, v6 bool) (ip, udp []byte) {
	ip = make([]byte, 20)
	if v6 {
		ip = make([]byte, 40)
	}
	udp = make([]byte, 8)
	for i := range ip {
		ip[i] = byte(rng.Uint32())
	}
	for i := range udp {
		udp[i] = byte(rng.Uint32())
	}
	if v6 {
		ip[0] = 0x60 | ip[0]&0x0F
	} else {
		ip[0] = 0x45
	}
	return ip, udp
}

// TestICRCLongPacketsMatchNaive: for packets long enough for the vector
// pass (every payload length over the range where its steps change: one
// accumulator or four, 64- and 16-byte blocks left over, a tail of 0-15
// bytes; then an MTU-sized and a jumbo one), ICRC and SealGather (with no,
// one and two extension headers, and one too long to share the first
// block) give the CRC of the masked byte string, with the vector pass and
// without.
func TestICRCLongPacketsMatchNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 14))
	lengths := []int{4096 + RETHLen, 9000}
	for n := BTHLen + foldMin - 40; n < BTHLen+1300; n++ {
		lengths = append(lengths, n)
	}
	forEachFoldMode(t, func(t *testing.T) {
		for _, v6 := range []bool{false, true} {
			ip, udp := randomHeaders(rng, v6)
			for _, n := range lengths {
				roce := make([]byte, n)
				for i := range roce {
					roce[i] = byte(rng.Uint32())
				}
				want := naiveICRC(ip, udp, roce)
				require.Equal(t, want, ICRC(ip, udp, roce), "v6 %v length %d", v6, n)
			}
		}
		flows := []Flow{
			{Src: netip.MustParseAddrPort("10.0.0.1:49152"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")},
			{Src: netip.MustParseAddrPort("[fd00::1]:49152"), Dst: netip.MustParseAddrPort("[fd00::2]:4791")},
		}
		for _, f := range flows {
			for _, hdrLen := range []int{BTHLen, BTHLen + RETHLen, BTHLen + RETHLen + ImmDtLen, BTHLen + AtomicETHLen} {
				for _, plen := range []int{foldMin - 1, foldMin, foldMin + 5, 447, 448, 1021, 4096} {
					pad := PadFor(plen)
					pkt := make([]byte, hdrLen+plen+pad+ICRCLen)
					for i := range pkt[:hdrLen+plen] {
						pkt[i] = byte(rng.Uint32())
					}
					var ipb ipHeaderBuf
					var udpb [8]byte
					h := f.headers(&ipb, &udpb, len(pkt))
					want := naiveICRC(h, udpb[:], pkt[:len(pkt)-ICRCLen])
					payload := append([]byte(nil), pkt[hdrLen:hdrLen+plen]...)
					trailer := make([]byte, pad+ICRCLen)
					f.SealGather(pkt[:hdrLen], payload, trailer)
					require.Equal(t, want, binary.LittleEndian.Uint32(trailer[pad:]), "%v hdr %d payload %d", f, hdrLen, plen)
					require.True(t, bytes.Equal(pkt[hdrLen:hdrLen+plen], payload), "payload untouched")
				}
			}
		}
	})
}

// FuzzICRC: any packet with any IPv4 or IPv6 header gets the CRC of the
// masked byte string, and a flipped payload bit changes it.
func FuzzICRC(f *testing.F) {
	f.Add(false, []byte{0x45, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 300))
	f.Add(true, make([]byte, 40), make([]byte, 4112))
	f.Fuzz(func(t *testing.T, v6 bool, hdr, roce []byte) {
		ip := make([]byte, 20)
		if v6 {
			ip = make([]byte, 40)
		}
		copy(ip, hdr)
		if v6 {
			ip[0] = 0x60 | ip[0]&0x0F
		} else {
			ip[0] = 0x45
		}
		udp := make([]byte, 8)
		copy(udp, hdr[min(len(hdr), len(ip)):])
		if len(roce) < BTHLen {
			return
		}
		got := ICRC(ip, udp, roce)
		if want := naiveICRC(ip, udp, roce); got != want {
			t.Fatalf("v6 %v length %d: %08x, want %08x", v6, len(roce), got, want)
		}
		roce[len(roce)-1] ^= 1
		if ICRC(ip, udp, roce) == got {
			t.Fatalf("a flipped bit kept the ICRC")
		}
	})
}
