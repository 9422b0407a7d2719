package wire

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestVerifyStrength measures what the ID-solving verifier lets through on
// an IPv4 flow, deterministically (fixed packet, fixed seed):
//   - every single-bit error in the covered bytes after the IP header;
//   - random corruption of 1-8 random bytes, which should pass with
//     probability about 2^-15 (two DF hypotheses x 16-bit residual).
func TestVerifyStrength(t *testing.T) {
	h := Headers{Opcode: RCWriteOnly, PKey: 0xffff, DestQP: 0x11, PSN: 99, VA: 0x1000, RKey: 7, DMALen: 1024}
	pkt := make([]byte, h.Len(1024))
	payload := make([]byte, 1024)
	rng := rand.New(rand.NewPCG(42, 42))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	if _, err := h.Encode(pkt, payload); err != nil {
		t.Fatal(err)
	}
	// Seal as rxe would with a non-zero ID.
	var ip ipHeaderBuf
	var udp [8]byte
	hdr := testFlow.headers(&ip, &udp, len(pkt))
	binary.BigEndian.PutUint16(hdr[4:], 0x5a5a)
	n := len(pkt) - ICRCLen
	binary.LittleEndian.PutUint32(pkt[n:], ICRC(hdr, udp[:], pkt[:n]))
	if v, id := testFlow.Verify(pkt); v != ICRCOK || id != 0x5a5a {
		t.Fatalf("baseline: %v %#x", v, id)
	}

	single := 0
	for bit := 0; bit < 8*len(pkt); bit++ {
		if bit/8 == 4 { // BTH byte 4 is masked: flips there are invisible by design
			continue
		}
		pkt[bit/8] ^= 1 << (bit % 8)
		if v, id := testFlow.Verify(pkt); v == ICRCOK {
			single++
			t.Logf("accepted: bit %d of byte %d (id solved as %#x)", bit%8, bit/8, id)
		}
		pkt[bit/8] ^= 1 << (bit % 8)
	}
	t.Logf("single-bit errors accepted: %d of %d", single, 8*len(pkt)-8)
	// About 8440 * 2^-15 = 0.26 expected; deterministic for this packet.
	if single > 3 {
		t.Fatalf("%d single-bit errors accepted", single)
	}

	const trials = 200_000
	accepted := 0
	c := make([]byte, len(pkt))
	for range trials {
		copy(c, pkt)
		for k := 1 + rng.IntN(8); k > 0; k-- {
			i := rng.IntN(len(c))
			if i == 4 {
				i = 5
			}
			c[i] ^= byte(1 + rng.IntN(255))
		}
		if v, _ := testFlow.Verify(c); v == ICRCOK {
			accepted++
		}
	}
	t.Logf("random corruption accepted: %d of %d (2^-15 would be %.1f)", accepted, trials, float64(trials)/32768)
	// Fixed seed: deterministic. The bound is ~5x the expectation.
	if accepted > 30 {
		t.Fatalf("verifier far weaker than 2^-15: %d of %d accepted", accepted, trials)
	}
}
