package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// naiveICRC is the specification written out: build the masked byte string
// and run hash/crc32 over it.
func naiveICRC(ip, udp, roce []byte) uint32 {
	var b []byte
	b = append(b, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
	m := append([]byte(nil), ip...)
	if m[0]>>4 == 4 {
		m[1], m[8], m[10], m[11] = 0xFF, 0xFF, 0xFF, 0xFF
	} else {
		m[0] |= 0x0F
		m[1], m[2], m[3], m[7] = 0xFF, 0xFF, 0xFF, 0xFF
	}
	b = append(b, m...)
	u := append([]byte(nil), udp...)
	u[6], u[7] = 0xFF, 0xFF
	b = append(b, u...)
	r := append([]byte(nil), roce...)
	r[4] = 0xFF
	b = append(b, r...)
	return crc32.ChecksumIEEE(b)
}

func TestICRCMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		roce := make([]byte, 12+rng.IntN(300))
		for j := range roce {
			roce[j] = byte(rng.Uint32())
		}
		var ip []byte
		switch i % 3 {
		case 0:
			ip = make([]byte, 20)
			ip[0] = 0x45
		case 1:
			ip = make([]byte, 40)
			ip[0] = 0x60
		case 2: // IPv4 with options: the generic (copying) path
			ip = make([]byte, 24)
			ip[0] = 0x46
		}
		for j := 1; j < len(ip); j++ {
			ip[j] = byte(rng.Uint32())
		}
		udp := make([]byte, 8)
		for j := range udp {
			udp[j] = byte(rng.Uint32())
		}
		require.Equal(t, naiveICRC(ip, udp, roce), ICRC(ip, udp, roce))
	}
}

func TestGFInverse(t *testing.T) {
	// x * x^-1 = 1, and un-advancing undoes crc32's zero-byte advance.
	require.Equal(t, uint32(gfOne), gfMul(gfX, gfDivX(gfOne)))
	for _, n := range []int{0, 1, 7, 100, 4096, 65535} {
		r := uint32(0x12345678)
		adv := r
		for range n {
			adv = ieee[byte(adv)] ^ adv>>8
		}
		require.Equal(t, r, unadvance(adv, n), "n=%d", n)
	}
}

func TestSolveIDAllValues(t *testing.T) {
	for id := 0; id < 1<<16; id++ {
		got, ok := solveID(lin2(byte(id>>8), byte(id)))
		if !ok || got != uint16(id) {
			t.Fatalf("id %#x: got %#x ok=%v", id, got, ok)
		}
	}
}

// TestFlowVerifySolvesIDAndDF: Verify finds the sender's IPv4 ID under
// either DF hypothesis, and VerifyIPv4 says which (the pcap recorder's
// bug, lead's task list: it wrote DF set for a packet that verified only
// with DF clear, so the frame's ICRC failed).
func TestFlowVerifySolvesIDAndDF(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	src := netip.MustParseAddrPort("10.77.0.12:49552")
	dst := netip.MustParseAddrPort("10.77.0.11:4791")
	f := Flow{Src: src, Dst: dst}
	for i := 0; i < 300; i++ {
		pkt := make([]byte, 16+4*rng.IntN(1100))
		for j := range pkt {
			pkt[j] = byte(rng.Uint32())
		}
		id := uint16(rng.Uint32())
		df := i%3 != 0
		var ip [20]byte
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(28+len(pkt)))
		binary.BigEndian.PutUint16(ip[4:], id)
		if df {
			ip[6] = 0x40
		}
		ip[9] = 17
		copy(ip[12:], src.Addr().AsSlice())
		copy(ip[16:], dst.Addr().AsSlice())
		var udp [8]byte
		binary.BigEndian.PutUint16(udp[0:], src.Port())
		binary.BigEndian.PutUint16(udp[2:], dst.Port())
		binary.BigEndian.PutUint16(udp[4:], uint16(8+len(pkt)))
		n := len(pkt) - 4
		binary.LittleEndian.PutUint32(pkt[n:], ICRC(ip[:], udp[:], pkt[:n]))

		v, got := f.Verify(pkt)
		require.Equal(t, ICRCOK, v)
		require.Equal(t, id, got)
		// VerifyIPv4 tells the DF hypothesis too, and the header rebuilt
		// from what it solved is the sender's: its ICRC verifies.
		v, got, dfClear := f.VerifyIPv4(pkt)
		require.Equal(t, ICRCOK, v)
		require.Equal(t, id, got)
		require.Equal(t, !df, dfClear)
		var hdrs [28]byte
		f.PutHeaders(hdrs[:], len(pkt))
		SetIPv4Unseen(hdrs[:20], got, dfClear)
		require.Equal(t, ip[4:8], hdrs[4:8], "ID and flags")
		require.Zero(t, IPv4Checksum(hdrs[:20]))
		require.Equal(t, ICRCOK, VerifyICRC(hdrs[:20], hdrs[20:], pkt))
		// The wrong direction or port must not verify.
		v, _ = f.Reverse().Verify(pkt)
		require.Equal(t, ICRCBad, v)
	}
}

func TestFlowSealMatchesLinuxHeader(t *testing.T) {
	for _, tc := range []struct{ src, dst string }{
		{"10.0.0.1:49152", "10.0.0.2:4791"},
		{"[::ffff:10.0.0.1]:49152", "[::ffff:10.0.0.2]:4791"},
		{"[fd77::11]:50000", "[fd77::12]:4791"},
	} {
		f := Flow{Src: netip.MustParseAddrPort(tc.src), Dst: netip.MustParseAddrPort(tc.dst)}
		pkt := make([]byte, 12+64+4)
		pkt[0] = byte(RCSendOnly)
		f.Seal(pkt)
		var ip [40]byte
		var udp [8]byte
		h := f.headers(&ip, &udp, len(pkt))
		if f.IsIPv4() {
			require.Equal(t, byte(0x40), h[6], "DF")
			require.Equal(t, []byte{0, 0}, h[4:6], "ID 0")
		}
		require.Equal(t, ICRCOK, VerifyICRC(h, udp[:], pkt))
		v, id := f.Verify(pkt)
		require.Equal(t, ICRCOK, v)
		require.Zero(t, id)
	}
}

func TestVerifyUnverifiable(t *testing.T) {
	f := Flow{Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")}
	v, _ := f.Verify(make([]byte, 15))
	require.Equal(t, ICRCUnverifiable, v)
	v, _ = Flow{}.Verify(make([]byte, 64))
	require.Equal(t, ICRCUnverifiable, v)
	mixed := Flow{Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("[fd00::1]:4791")}
	v, _ = mixed.Verify(make([]byte, 64))
	require.Equal(t, ICRCUnverifiable, v)
	require.Equal(t, ICRCUnverifiable, VerifyICRC(nil, nil, make([]byte, 10)))
	// Short headers must not panic.
	require.NotPanics(t, func() { ICRC(nil, nil, nil); ICRC([]byte{0x60}, []byte{1}, []byte{1, 2}) })
}

// TestInvPowCacheConcurrent hammers the length cache from several
// goroutines with colliding slots; every answer must equal the uncached
// square-and-multiply result.
func TestInvPowCacheConcurrent(t *testing.T) {
	ref := func(n int) uint32 {
		r := uint32(gfOne)
		for range 8 * n {
			r = gfDivX(r)
		}
		return r
	}
	lengths := []int{0, 1, 64, 128, 1046, 1110, 4146, 4210} // several share a slot
	want := map[int]uint32{}
	for _, n := range lengths {
		want[n] = ref(n)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				n := lengths[(i+g)%len(lengths)]
				if got := invPowBytes(n); got != want[n] {
					errs <- fmt.Sprintf("n=%d: got %#x want %#x", n, got, want[n])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestSealGatherMatchesSeal: sealing a packet given in pieces gives the
// ICRC Seal gives the joined packet, for both families, every split of
// headers, payload and trailer, payload lengths around the pad and the
// CRC's fast-path thresholds; the payload is left untouched.
func TestSealGatherMatchesSeal(t *testing.T) {
	flows := []Flow{
		{Src: netip.MustParseAddrPort("10.0.0.1:4791"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")},
		{Src: netip.MustParseAddrPort("[fd00::1]:49152"), Dst: netip.MustParseAddrPort("[fd00::2]:4791")},
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for _, f := range flows {
		for _, hdrLen := range []int{BTHLen, BTHLen + RETHLen, BTHLen + RETHLen + ImmDtLen} {
			for _, plen := range []int{0, 1, 3, 4, 63, 64, 65, 1000, 4096} {
				pad := PadFor(plen)
				pkt := make([]byte, hdrLen+plen+pad+ICRCLen)
				for i := range pkt[:hdrLen+plen] {
					pkt[i] = byte(rng.Uint32())
				}
				f.Seal(pkt)
				want := binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:])
				payload := append([]byte(nil), pkt[hdrLen:hdrLen+plen]...)
				trailer := make([]byte, pad+ICRCLen)
				f.SealGather(pkt[:hdrLen], payload, trailer)
				require.Equal(t, want, binary.LittleEndian.Uint32(trailer[pad:]), "%v hdr %d payload %d", f, hdrLen, plen)
				require.True(t, bytes.Equal(pkt[hdrLen:hdrLen+plen], payload), "payload untouched")
				v, _ := f.Verify(bytes.Join([][]byte{pkt[:hdrLen], payload, trailer}, nil))
				require.Equal(t, ICRCOK, v)
			}
		}
	}
	// Too short to be a packet: left alone.
	tr := []byte{1, 2, 3, 4}
	flows[0].SealGather(make([]byte, BTHLen-1), nil, tr)
	require.Equal(t, []byte{1, 2, 3, 4}, tr)
	flows[0].SealGather(make([]byte, BTHLen), nil, tr[:3])
	require.Equal(t, []byte{1, 2, 3, 4}, tr)
}

// TestPutHeadersAreTheSealedOnes: the headers PutHeaders writes (IPv4 with
// its checksum, IPv6, UDP) are the ones Seal's ICRC covers, and SetIPv4ID
// keeps the IPv4 checksum right.
func TestPutHeadersAreTheSealedOnes(t *testing.T) {
	for _, f := range []Flow{
		{Src: netip.MustParseAddrPort("10.0.0.1:49152"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")},
		{Src: netip.MustParseAddrPort("[::ffff:10.0.0.1]:49152"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")},
		{Src: netip.MustParseAddrPort("[fd00::1]:49152"), Dst: netip.MustParseAddrPort("[fd00::2]:4791")},
	} {
		pkt := make([]byte, BTHLen+100+ICRCLen)
		for i := range pkt {
			pkt[i] = byte(i * 7)
		}
		f.Seal(pkt)
		var h [48]byte
		for i := range h {
			h[i] = 0xAA // PutHeaders must not depend on what was there
		}
		n := f.PutHeaders(h[:], len(pkt))
		want := map[bool]int{true: 20, false: 40}[f.IsIPv4()]
		require.Equal(t, want, n, "%v", f)
		require.Equal(t, binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:]), ICRC(h[:n], h[n:n+8], pkt[:len(pkt)-ICRCLen]), "%v", f)
		require.Equal(t, uint16(8+len(pkt)), binary.BigEndian.Uint16(h[n+4:]), "UDP length")
		require.Zero(t, binary.BigEndian.Uint16(h[n+6:]), "UDP checksum 0, as rxe sends")
		if n == 20 {
			require.Zero(t, IPv4Checksum(h[:20]), "IPv4 header checksum verifies")
			SetIPv4ID(h[:20], 0xBEEF)
			require.Equal(t, uint16(0xBEEF), binary.BigEndian.Uint16(h[4:]))
			require.Zero(t, IPv4Checksum(h[:20]))
			v, id := f.Verify(pkt)
			require.Equal(t, ICRCOK, v)
			require.Zero(t, id)
		}
	}
}

// TestFlowWords4AreTheHeadersMaskedWords checks the short-packet ICRC of
// an IPv4 flow, whose masked header words come from the flow itself
// (words4), against the headers Seal describes written out and masked
// (headers, then maskedIPv4): for plain and IPv4-mapped addresses, ports
// at both ends of their range, and every UDP length a short packet has
// (the slicing and the hash/crc32 tails), and long ones (the vector pass
// on CPUs that have it), for Seal's path and SealGather's.
func TestFlowWords4AreTheHeadersMaskedWords(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 20))
	flows := []Flow{
		{Src: netip.MustParseAddrPort("10.0.0.1:49152"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")},
		{Src: netip.MustParseAddrPort("[::ffff:192.168.7.9]:1"), Dst: netip.MustParseAddrPort("[::ffff:127.0.0.1]:65535")},
		{Src: netip.MustParseAddrPort("255.254.253.252:65535"), Dst: netip.MustParseAddrPort("1.2.3.4:0")},
	}
	for range 20 {
		var s, d [4]byte
		for i := range 4 {
			s[i], d[i] = byte(rng.Uint32()), byte(rng.Uint32())
		}
		flows = append(flows, Flow{Src: netip.AddrPortFrom(netip.AddrFrom4(s), uint16(rng.Uint32())),
			Dst: netip.AddrPortFrom(netip.AddrFrom4(d), uint16(rng.Uint32()))})
	}
	lengths := []int{} // n: packet without ICRC
	for n := BTHLen; n < BTHLen+foldMin; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, BTHLen+foldMin, BTHLen+RETHLen+4096, 8972) // the vector pass, where the CPU has it
	for _, f := range flows {
		for _, n := range lengths {
			roce := make([]byte, n)
			for i := range roce {
				roce[i] = byte(rng.Uint32())
			}
			var ip ipHeaderBuf
			var udp [8]byte
			h := f.headers(&ip, &udp, n+ICRCLen)
			w0, w1, w2, w3, ok := f.words4(8 + n + ICRCLen)
			require.True(t, ok, "%v", f)
			m0, m1, m2, m3, _ := maskedIPv4(h, udp[:], roce)
			require.Equal(t, [4]uint64{m0, m1, m2, m3}, [4]uint64{w0, w1, w2, w3 | le32(roce)<<32}, "%v n=%d", f, n)
			want := icrcGeneric(h, udp[:], roce)
			require.Equal(t, want, f.icrc(roce), "%v n=%d", f, n)
			// SealGather takes the same words, with a RETH's worth of
			// extension headers in the block when the packet has them.
			if hl := BTHLen + RETHLen; n >= hl {
				trailer := make([]byte, ICRCLen)
				f.SealGather(roce[:hl], roce[hl:], trailer)
				require.Equal(t, want, binary.LittleEndian.Uint32(trailer), "SealGather %v n=%d", f, n)
			}
		}
	}
	v6 := Flow{Src: netip.MustParseAddrPort("[fd77::11]:50000"), Dst: netip.MustParseAddrPort("[fd77::12]:4791")}
	_, _, _, _, ok := v6.words4(100)
	require.False(t, ok, "an IPv6 flow has no IPv4 words")
}

// FuzzFlowICRC: for any IPv4 flow and packet, the ICRC Seal and Verify
// compute from the flow's words (words4) is the one of the headers
// written out and masked (icrcGeneric), and SealGather, with the packet
// cut into headers, payload and trailer anywhere, writes the same.
func FuzzFlowICRC(f *testing.F) {
	f.Add([]byte{10, 0, 0, 1, 10, 0, 0, 2}, uint16(49152), uint16(4791), make([]byte, 16), 12, 4)
	f.Add([]byte{127, 0, 0, 1, 127, 0, 0, 2}, uint16(1), uint16(65535), make([]byte, 4128), 28, 4100)
	f.Fuzz(func(t *testing.T, addrs []byte, sport, dport uint16, roce []byte, hdrLen, payLen int) {
		if len(addrs) < 8 || len(roce) < BTHLen {
			return
		}
		fl := Flow{Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte(addrs[:4])), sport),
			Dst: netip.AddrPortFrom(netip.AddrFrom4([4]byte(addrs[4:8])), dport)}
		var ip ipHeaderBuf
		var udp [8]byte
		h := fl.headers(&ip, &udp, len(roce)+ICRCLen)
		want := icrcGeneric(h, udp[:], roce)
		if got := fl.icrc(roce); got != want {
			t.Fatalf("%v length %d: %08x, want %08x", fl, len(roce), got, want)
		}
		// SealGather: hdr at least a BTH, then payload, then the trailer
		// (its bytes before the ICRC slot).
		hdrLen = BTHLen + int(uint(hdrLen)%uint(len(roce)-BTHLen+1))
		payLen = int(uint(payLen) % uint(len(roce)-hdrLen+1))
		trailer := append(append([]byte(nil), roce[hdrLen+payLen:]...), 0, 0, 0, 0)
		fl.SealGather(roce[:hdrLen], roce[hdrLen:hdrLen+payLen], trailer)
		if got := binary.LittleEndian.Uint32(trailer[len(trailer)-ICRCLen:]); got != want {
			t.Fatalf("SealGather %d+%d+%d: %08x, want %08x", hdrLen, payLen, len(trailer), got, want)
		}
	})
}
