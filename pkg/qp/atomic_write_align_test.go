package qp

import (
	"encoding/binary"
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// Bug (found by the memory audit, session AF): an ATOMIC_WRITE whose
// target is not 8-byte aligned was carried out (under a striped lock,
// atomic only against the other unaligned operations) and acknowledged.
// rdma_rxe refuses it (rxe_mr_do_atomic_write: RESPST_ERR_MISALIGNED_ATOMIC,
// IBA A19.4.2), a class C invalid request NAK that moves the QP to ERR,
// as for a misaligned CmpSwap or FetchAdd; memory is left untouched.
func TestMisalignedAtomicWriteIsInvalidRequest(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	binary.NativeEndian.PutUint64(l.a.buf[0:], 0x1122334455667788)
	l.post(SendWR{ID: 1, Opcode: WRAtomicWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 8)},
		RemoteAddr: l.b.m.IOVA() + 12, RKey: l.b.m.RKey()})
	l.deliver(l.b, l.a, l.a.env.take()...)
	out := l.b.env.take()
	require.Len(t, out, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(out[0]))
	require.Equal(t, wire.RCAck, p.Opcode)
	require.Equal(t, wire.SynNAK, p.AETH.Syndrome().Kind())
	require.Equal(t, uint8(wire.NAKInvalidRequest), p.AETH.Syndrome().NAKCode())
	require.Equal(t, Err, l.b.q.State())
	require.Equal(t, make([]byte, 24), l.b.buf[:24], "nothing stored")

	// An aligned one still lands.
	m := newLink(t, RC, 7, 7)
	binary.NativeEndian.PutUint64(m.a.buf[0:], 0x1122334455667788)
	m.post(SendWR{ID: 1, Opcode: WRAtomicWrite, Flags: Signaled, SGL: []SGE{m.a.sge(0, 8)},
		RemoteAddr: m.b.m.IOVA() + 16, RKey: m.b.m.RKey()})
	m.deliver(m.b, m.a, m.a.env.take()...)
	require.Equal(t, []wire.Opcode{wire.RCAck}, opcodes(m.b.env.take()))
	require.Equal(t, uint64(0x1122334455667788), binary.NativeEndian.Uint64(m.b.buf[16:]))
}
