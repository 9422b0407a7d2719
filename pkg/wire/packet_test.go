package wire

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

var testFlow = Flow{
	Src: netip.MustParseAddrPort("10.77.0.12:49552"),
	Dst: netip.MustParseAddrPort("10.77.0.11:4791"),
}

func sampleHeaders(op Opcode) Headers {
	return Headers{
		Opcode: op, SE: true, PKey: 0xffff, DestQP: 0x000011, AckReq: true, PSN: 0xfffffe,
		VA: 0x7f00_1234_5678_9000, RKey: 0x1234, DMALen: 4096,
		SwapAdd: 5, Compare: 7, Syndrome: ACKSyndrome(CreditsInvalid), MSN: 42,
		OrigData: 0xdead, QKey: 0x11111111, SrcQP: 0x21, Imm: 0x11223344, InvRKey: 0x99,
		FlushPlacement: FlushGlobal, FlushSelectivity: FlushMR,
	}
}

// TestEncodeParseEverySupportedOpcode round-trips every supported opcode
// with several payload sizes (pad 0-3) through Encode, Seal and Parse.
func TestEncodeParseEverySupportedOpcode(t *testing.T) {
	for i := 0; i < 256; i++ {
		op := Opcode(i)
		in := op.Info()
		if !in.Supported {
			continue
		}
		sizes := []int{0}
		if in.Flags.Has(FlagPayload) {
			sizes = []int{0, 1, 2, 3, 4, 5, 1023, 1024}
			if in.Flags&(FlagFirst|FlagMiddle) != 0 {
				sizes = []int{0, 4, 1024} // FIRST/MIDDLE carry a full MTU: no pad
			}
		}
		for _, n := range sizes {
			h := sampleHeaders(op)
			payload := make([]byte, n)
			for j := range payload {
				payload[j] = byte(j*7 + 1)
			}
			buf := bytes.Repeat([]byte{0xAA}, h.Len(n)+8)
			got, err := h.Encode(buf, payload)
			require.NoError(t, err)
			require.Equal(t, h.Len(n), got)
			pkt := buf[:got]
			testFlow.Seal(pkt)

			var p Packet
			require.NoError(t, p.Parse(pkt), "%s len %d", op, n)
			require.Equal(t, op, p.Opcode)
			require.Same(t, in, p.Info)
			require.Equal(t, payload, []byte(p.Payload))
			require.Equal(t, PadFor(n), p.PadCount)
			require.Equal(t, make([]byte, PadFor(n)), []byte(p.Pad), "pad zeroed")
			require.Equal(t, uint32(0xfffffe), p.BTH.PSN())
			require.Equal(t, uint32(0x11), p.BTH.DestQP())
			require.True(t, p.BTH.SE())
			require.True(t, p.BTH.AckReq())
			require.Equal(t, in.Headers.Has(HdrRETH), p.RETH != nil)
			require.Equal(t, in.Headers.Has(HdrAETH), p.AETH != nil)
			require.Equal(t, in.Headers.Has(HdrAtomicETH), p.AtomicETH != nil)
			require.Equal(t, in.Headers.Has(HdrAtomicAckETH), p.AtomicAckETH != nil)
			require.Equal(t, in.Headers.Has(HdrDETH), p.DETH != nil)
			require.Equal(t, in.Headers.Has(HdrImmDt), p.ImmDt != nil)
			require.Equal(t, in.Headers.Has(HdrIETH), p.IETH != nil)
			require.Equal(t, in.Headers.Has(HdrFETH), p.FETH != nil)
			require.Equal(t, in.Headers.Has(HdrCNP), p.CNP != nil)
			var back Headers
			back.FromPacket(&p)
			want := h
			// Fields of headers the opcode does not carry are not encoded.
			if p.RETH == nil && p.AtomicETH == nil {
				want.VA, want.RKey = 0, 0
			}
			if p.RETH == nil {
				want.DMALen = 0
			}
			if p.AtomicETH == nil {
				want.SwapAdd, want.Compare = 0, 0
			}
			if p.AETH == nil {
				want.Syndrome, want.MSN = 0, 0
			}
			if p.AtomicAckETH == nil {
				want.OrigData = 0
			}
			if p.DETH == nil {
				want.QKey, want.SrcQP = 0, 0
			}
			if p.ImmDt == nil {
				want.Imm = 0
			}
			if p.IETH == nil {
				want.InvRKey = 0
			}
			if p.FETH == nil {
				want.FlushPlacement, want.FlushSelectivity = 0, 0
			}
			require.Equal(t, want, back, "%s", op)
			v, id := testFlow.Verify(pkt)
			require.Equal(t, ICRCOK, v)
			require.Zero(t, id)
			require.Equal(t, pkt[:len(pkt)-4], p.WithoutICRC())
			require.Equal(t, pkt[:in.HdrLen], p.HeaderBytes())
		}
	}
}

func TestEncodeErrors(t *testing.T) {
	h := sampleHeaders(RCWriteOnly)
	_, err := h.Encode(make([]byte, h.Len(100)-1), make([]byte, 100))
	require.ErrorIs(t, err, ErrShortBuffer)
	h = sampleHeaders(RCAck)
	_, err = h.Encode(make([]byte, 100), make([]byte, 4))
	require.ErrorIs(t, err, ErrBadLength)
	_, _, err = h.EncodeHeaders(make([]byte, 100), -1)
	require.ErrorIs(t, err, ErrBadLength)

	// EncodeHeaders leaves the payload area to the caller.
	h = sampleHeaders(RCSendOnly)
	buf := make([]byte, 64)
	off, n, err := h.EncodeHeaders(buf, 5)
	require.NoError(t, err)
	require.Equal(t, BTHLen, off)
	require.Equal(t, 12+5+3+4, n)
	copy(buf[off:], "hello")
	var p Packet
	require.NoError(t, p.Parse(buf[:n]))
	require.Equal(t, "hello", string(p.Payload))
}

// TestParseErrors covers each defect and the order in which they are found.
func TestParseErrors(t *testing.T) {
	build := func(op Opcode, payload int) []byte {
		h := sampleHeaders(op)
		h.SE, h.AckReq = false, false
		b := make([]byte, h.Len(payload))
		_, err := h.Encode(b, make([]byte, payload))
		require.NoError(t, err)
		return b
	}
	with := func(b []byte, f func([]byte)) []byte { c := append([]byte(nil), b...); f(c); return c }
	for _, tc := range []struct {
		name string
		pkt  []byte
		err  error
	}{
		{"empty", nil, ErrTruncated},
		{"11 bytes", build(RCSendOnly, 0)[:11], ErrTruncated},
		{"BTH without ICRC", build(RCSendOnly, 0)[:12], ErrTruncated},
		{"BTH+3", build(RCSendOnly, 0)[:15], ErrTruncated},
		{"ack without AETH", append(build(RCAck, 0)[:12], 0, 0, 0, 0), ErrTruncated},
		{"read request RETH cut", build(RCReadRequest, 0)[:28], ErrTruncated},
		{"truncated beats bad version", with(build(RCAck, 0)[:16], func(b []byte) { b[1] = 1 }), ErrTruncated},
		{"tver 1", with(build(RCSendOnly, 0), func(b []byte) { b[1] |= 1 }), ErrBadVersion},
		{"tver beats opcode", with(build(RCSendOnly, 0), func(b []byte) { b[0], b[1] = 0x18, 8 }), ErrBadVersion},
		{"reserved 0x15", with(build(RCSendOnly, 16), func(b []byte) { b[0] = 0x15 }), ErrBadOpcode},
		{"RD 0x44", with(build(RCSendOnly, 16), func(b []byte) { b[0] = 0x44 }), ErrBadOpcode},
		{"XRC 0xA4", with(build(RCSendOnly, 16), func(b []byte) { b[0] = 0xA4 }), ErrBadOpcode},
		{"vendor 0xFF", with(build(RCSendOnly, 16), func(b []byte) { b[0] = 0xFF }), ErrBadOpcode},
		{"pad > payload", with(build(RCSendOnly, 0), func(b []byte) { b[1] = 0x30 }), ErrBadPadding},
		{"pad on read request", with(build(RCReadRequest, 0), func(b []byte) { b[1] = 0x20 }), ErrBadPadding},
		{"pad on FIRST", with(build(RCSendFirst, 8), func(b []byte) { b[1] = 0x20 }), ErrBadPadding},
		{"pad on MIDDLE", with(build(RCWriteMiddle, 8), func(b []byte) { b[1] = 0x10 }), ErrBadPadding},
		{"unaligned area", append(build(RCSendOnly, 0)[:12], 1, 2, 3, 4, 5, 0, 0, 0, 0), ErrBadPadding},
		{"bytes after ack", append(build(RCAck, 0)[:16], 1, 2, 3, 4, 0, 0, 0, 0), ErrBadLength},
		{"cnp 20 reserved", append(build(CNP, 0)[:28], 0, 0, 0, 0, 1, 1, 1, 1), ErrBadLength},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Packet
			err := p.Parse(tc.pkt)
			require.ErrorIs(t, err, tc.err)
			require.Equal(t, tc.pkt, p.Raw)
			require.Nil(t, p.RETH)
			require.Nil(t, p.AETH)
			require.Nil(t, p.Payload)
		})
	}
}

// TestParseTruncateEveryPrefix cuts a packet of every supported opcode at
// every length: each prefix must either parse (then it is a shorter valid
// packet) or fail with a sentinel, never panic or read out of range.
func TestParseTruncateEveryPrefix(t *testing.T) {
	for i := 0; i < 256; i++ {
		op := Opcode(i)
		if !op.Info().Supported {
			continue
		}
		n := 0
		if op.Info().Flags.Has(FlagPayload) {
			n = 37
			if op.Info().Flags&(FlagFirst|FlagMiddle) != 0 {
				n = 36
			}
		}
		h := sampleHeaders(op)
		full := make([]byte, h.Len(n))
		_, err := h.Encode(full, make([]byte, n))
		require.NoError(t, err)
		for cut := 0; cut <= len(full); cut++ {
			// Copy into an exactly sized slice so that any read past the
			// end panics under the race detector's bounds checks too.
			b := append(make([]byte, 0, cut), full[:cut]...)
			var p Packet
			err := p.Parse(b)
			switch {
			case cut == len(full):
				require.NoError(t, err, "%s full", op)
			case cut < op.Info().HdrLen+ICRCLen:
				require.ErrorIs(t, err, ErrTruncated, "%s cut %d", op, cut)
			case err == nil:
				require.LessOrEqual(t, len(p.Payload)+p.PadCount+op.Info().HdrLen+ICRCLen, cut)
			default:
				require.True(t, isSentinel(err), "%s cut %d: %v", op, cut, err)
			}
		}
	}
}

func isSentinel(err error) bool {
	switch err {
	case ErrTruncated, ErrBadOpcode, ErrBadVersion, ErrBadPadding, ErrBadLength:
		return true
	}
	return false
}

func TestParseAllocs(t *testing.T) {
	h := sampleHeaders(RCWriteOnly)
	pkt := make([]byte, h.Len(4096))
	_, err := h.Encode(pkt, make([]byte, 4096))
	require.NoError(t, err)
	testFlow.Seal(pkt)
	var p Packet
	allocs := testing.AllocsPerRun(100, func() {
		if p.Parse(pkt) != nil {
			t.Fatal("parse")
		}
		if v, _ := testFlow.Verify(pkt); v != ICRCOK {
			t.Fatal("verify")
		}
		if _, err := h.Encode(pkt, pkt[28:28+4096]); err != nil {
			t.Fatal(err)
		}
		testFlow.Seal(pkt)
	})
	require.Zero(t, allocs)
}

// FuzzParse: Parse never panics; whatever it accepts re-encodes to a
// packet that parses to the same fields and payload, and that packet,
// sealed, passes both ICRC verifiers (also with any IPv4 ID) and fails
// them with a bit flipped.
func FuzzParse(f *testing.F) {
	for i := 0; i < 256; i++ {
		op := Opcode(i)
		if !op.Info().Supported {
			continue
		}
		h := sampleHeaders(op)
		n := 0
		if op.Info().Flags.Has(FlagPayload) && op.Info().Flags&(FlagFirst|FlagMiddle) == 0 {
			n = 5
		}
		b := make([]byte, h.Len(n))
		if _, err := h.Encode(b, make([]byte, n)); err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if err := p.Parse(b); err != nil {
			if !isSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		var h Headers
		h.FromPacket(&p)
		out := make([]byte, h.Len(len(p.Payload)))
		n, err := h.Encode(out, p.Payload)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var q Packet
		if err := q.Parse(out[:n]); err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		var h2 Headers
		h2.FromPacket(&q)
		if h != h2 || !bytes.Equal(p.Payload, q.Payload) {
			t.Fatalf("round trip mismatch: %+v vs %+v", h, h2)
		}
		// Verify never panics on anything Parse accepted.
		testFlow.Verify(b)
		testFlow.Reverse().Verify(b)

		// The verifiers agree with the sealer: the re-encoded packet
		// sealed on a flow verifies on it, through Flow.Verify and
		// through VerifyICRC over the headers Linux sends; sent with any
		// IPv4 ID (rxe's per-destination counter), Flow.Verify still
		// accepts it and solves that ID; a flipped payload bit fails.
		pkt := out[:n]
		id := uint16(len(b))*0x9E37 ^ binary.BigEndian.Uint16(b[4:])
		for _, fl := range []Flow{testFlow, testFlow6} {
			fl.Seal(pkt)
			if v, got := fl.Verify(pkt); v != ICRCOK || got != 0 {
				t.Fatalf("%v: sealed packet verifies %v (ID %d)", fl, v, got)
			}
			var hdr [48]byte
			hl := fl.PutHeaders(hdr[:], len(pkt))
			if v := VerifyICRC(hdr[:hl], hdr[hl:hl+8], pkt); v != ICRCOK {
				t.Fatalf("%v: VerifyICRC of the sealed packet: %v", fl, v)
			}
			if fl.IsIPv4() {
				ip := bytes.Clone(hdr[:hl])
				SetIPv4ID(ip, id)
				binary.LittleEndian.PutUint32(pkt[len(pkt)-ICRCLen:], ICRC(ip, hdr[hl:hl+8], pkt[:len(pkt)-ICRCLen]))
				if v, got := fl.Verify(pkt); v != ICRCOK || got != id {
					t.Fatalf("%v: packet sent with IPv4 ID %d verifies %v with ID %d", fl, id, v, got)
				}
				fl.Seal(pkt)
			}
			pkt[BTHLen] ^= 0x10
			if v, _ := fl.Verify(pkt); v == ICRCOK && !fl.IsIPv4() {
				t.Fatalf("%v: a flipped bit verifies", fl)
			}
			if v := VerifyICRC(hdr[:hl], hdr[hl:hl+8], pkt); v == ICRCOK {
				t.Fatalf("%v: VerifyICRC: a flipped bit verifies", fl)
			}
			pkt[BTHLen] ^= 0x10
		}
	})
}

// testFlow6 is an IPv6 flow: Verify checks all 32 bits there.
var testFlow6 = Flow{
	Src: netip.MustParseAddrPort("[fd00::12]:49552"),
	Dst: netip.MustParseAddrPort("[fd00::11]:4791"),
}
