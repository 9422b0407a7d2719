package wire_test

import (
	"fmt"
	"net/netip"

	"github.com/rxed/rxed/pkg/wire"
)

// Build an RDMA WRITE ONLY, seal it for the wire, and parse and verify it
// on the receiving side, which sees only addresses and ports.
func Example() {
	local := netip.MustParseAddrPort("10.77.0.12:49552")
	remote := netip.MustParseAddrPort("10.77.0.11:4791")

	h := wire.Headers{
		Opcode: wire.RCWriteOnly, PKey: 0xffff, DestQP: 0x11, AckReq: true, PSN: 100,
		VA: 0x7f0000001000, RKey: 0x2d1, DMALen: 5,
	}
	buf := make([]byte, 2048)
	n, err := h.Encode(buf, []byte("hello"))
	if err != nil {
		panic(err)
	}
	pkt := buf[:n]
	wire.Flow{Src: local, Dst: remote}.Seal(pkt)

	var p wire.Packet
	if err := p.Parse(pkt); err != nil {
		panic(err)
	}
	v, id := wire.Flow{Src: local, Dst: remote}.Verify(pkt)
	fmt.Println(p.Opcode, p.BTH.PSN(), p.RETH.DMALen(), string(p.Payload), p.PadCount, v, id)
	// Output: RC_RDMA_WRITE_ONLY 100 5 hello 3 ok 0
}

func ExampleSyndrome() {
	for _, s := range []wire.Syndrome{wire.ACKSyndrome(wire.CreditsInvalid), wire.RNRSyndrome(14), wire.NAKSyndrome(wire.NAKRemoteAccess)} {
		fmt.Printf("0x%02x %s %d\n", uint8(s), s.Kind(), s.Value())
	}
	// Output:
	// 0x1f ACK 31
	// 0x2e RNR_NAK 14
	// 0x62 NAK 2
}
