package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// Bug (found by the protocol audit, session AF): the responder took a
// WRITE_LAST (or a WRITE_ONLY) while more than one MTU of the RETH's DMA
// length was still to come, as long as it carried a full MTU: the WRITE
// ended short, its last bytes never written, and was acknowledged as
// done. IBA makes a WRITE whose packets do not add up to its DMA length
// an invalid request (class C: NAK, QP to ERR); rxe's check_rkey only
// compares each packet with the MTU, so a requester that sends such a
// packet (rxed did, after a READ hold: TestReadHoldEndKeepsPartlySent-
// WritePSNs) corrupted the target silently.
func TestWriteEndingBeforeItsDMALengthIsInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		pick func(req [][]byte) [][]byte
	}{
		// FIRST, MIDDLE, then the LAST under the second MIDDLE's PSN.
		{"last", func(req [][]byte) [][]byte {
			last := append([]byte(nil), req[3]...)
			wire.BTH(last).SetPSN(wire.BTH(req[2]).PSN())
			return [][]byte{req[0], req[1], last}
		}},
		// The FIRST relabelled ONLY: one MTU of a 1024-byte WRITE.
		{"only", func(req [][]byte) [][]byte {
			only := append([]byte(nil), req[0]...)
			wire.BTH(only).SetOpcode(wire.RCWriteOnly)
			return [][]byte{only}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLink(t, RC, 7, 7)
			for i := range l.a.buf[:1024] {
				l.a.buf[i] = byte(i*5 + 1)
			}
			l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 1024)},
				RemoteAddr: l.b.m.IOVA() + 4096, RKey: l.b.m.RKey()})
			req := l.a.env.take()
			require.Equal(t, []wire.Opcode{wire.RCWriteFirst, wire.RCWriteMiddle, wire.RCWriteMiddle,
				wire.RCWriteLast}, opcodes(req))
			pk := tc.pick(req)
			l.deliver(l.b, l.a, pk...)
			resp := l.b.env.take()
			require.NotEmpty(t, resp)
			var p wire.Packet
			require.NoError(t, p.Parse(resp[len(resp)-1]))
			require.Equal(t, wire.SynNAK, p.AETH.Syndrome().Kind(), "the short WRITE is not acknowledged")
			require.Equal(t, uint8(wire.NAKInvalidRequest), p.AETH.Syndrome().NAKCode())
			require.Equal(t, PSN(wire.BTH(pk[len(pk)-1]).PSN()), PSN(p.BTH.PSN()))
			require.Equal(t, Err, l.b.q.State())
		})
	}
}
