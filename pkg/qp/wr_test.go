package qp

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWROpcodeValues(t *testing.T) {
	// enum ibv_wr_opcode, and the kernel's IB_WR_REG_MR.
	want := map[WROpcode]uint32{
		WRRDMAWrite: 0, WRRDMAWriteWithImm: 1, WRSend: 2, WRSendWithImm: 3, WRRDMARead: 4,
		WRAtomicCmpAndSwp: 5, WRAtomicFetchAndAdd: 6, WRLocalInv: 7, WRBindMW: 8,
		WRSendWithInv: 9, WRTSO: 10, WRDriver1: 11, WRFlush: 14, WRAtomicWrite: 15, WRRegMR: 0x20,
	}
	for op, v := range want {
		require.Equal(t, v, uint32(op), "%v", op)
		require.NotContains(t, op.String(), "WROpcode(")
	}
	require.Equal(t, "SEND_WITH_IMM", WRSendWithImm.String())
	require.Equal(t, "WROpcode(99)", WROpcode(99).String())
	require.Equal(t, SendFlags(1), Fence)
	require.Equal(t, SendFlags(2), Signaled)
	require.Equal(t, SendFlags(4), Solicited)
	require.Equal(t, SendFlags(8), Inline)
	require.Equal(t, "SIGNALED|SOLICITED", (Signaled | Solicited).String())
	require.Equal(t, "0", SendFlags(0).String())
	require.Equal(t, "FENCE|0x100", (Fence | 0x100).String())
}

func TestWROpcodeValidFor(t *testing.T) {
	// rxe_wr_opcode_info: which QP types accept which opcode.
	cases := []struct {
		op             WROpcode
		rc, uc, ud, gs bool
	}{
		{WRRDMAWrite, true, true, false, false},
		{WRRDMAWriteWithImm, true, true, false, false},
		{WRSend, true, true, true, true},
		{WRSendWithImm, true, true, true, true},
		{WRRDMARead, true, false, false, false},
		{WRAtomicCmpAndSwp, true, false, false, false},
		{WRAtomicFetchAndAdd, true, false, false, false},
		{WRLocalInv, true, false, false, false},
		{WRBindMW, true, true, false, false},
		{WRSendWithInv, true, true, true, false}, // rxe_wr_opcode_info; fails unsent on UC and UD
		{WRRegMR, true, false, false, false},
		{WRFlush, true, false, false, false},
		{WRAtomicWrite, true, false, false, false},
		{WRTSO, false, false, false, false},
		{WROpcode(200), false, false, false, false},
	}
	for _, c := range cases {
		require.Equal(t, c.rc, c.op.ValidFor(RC), "%v RC", c.op)
		require.Equal(t, c.uc, c.op.ValidFor(UC), "%v UC", c.op)
		require.Equal(t, c.ud, c.op.ValidFor(UD), "%v UD", c.op)
		require.Equal(t, c.gs, c.op.ValidFor(GSI), "%v GSI", c.op)
		for _, bad := range []Type{0, 5, 8, 63, -1} {
			require.False(t, c.op.ValidFor(bad), "%v on type %d", c.op, bad)
		}
	}
}

func TestCheckSendWR(t *testing.T) {
	c := Cap{MaxSendWR: 16, MaxSendSGE: 2, MaxInlineData: 64}
	dst := AddrVector{DGID: netip.MustParseAddr("127.0.0.1")}
	sge := func(n uint32) []SGE { return []SGE{{Addr: 0x1000, Length: n, LKey: 1}} }
	cases := []struct {
		name string
		typ  Type
		wr   SendWR
		want error
	}{
		{"RC send", RC, SendWR{Opcode: WRSend, SGL: sge(100)}, nil},
		{"RC zero-length send", RC, SendWR{Opcode: WRSend}, nil},
		{"RC send 2 SGEs", RC, SendWR{Opcode: WRSend, SGL: []SGE{{Length: 1}, {Length: 2}}}, nil},
		{"RC send 3 SGEs", RC, SendWR{Opcode: WRSend, SGL: []SGE{{}, {}, {}}}, ErrTooManySGE},
		{"RC inline 64", RC, SendWR{Opcode: WRSend, Flags: Inline, Inline: make([]byte, 64)}, nil},
		{"RC inline 65", RC, SendWR{Opcode: WRSend, Flags: Inline, Inline: make([]byte, 65)}, ErrInlineTooLong},
		{"inline ignores SGL count", RC, SendWR{Opcode: WRRDMAWrite, Flags: Inline, SGL: []SGE{{}, {}, {}}}, nil},
		{"RC inline read", RC, SendWR{Opcode: WRRDMARead, Flags: Inline, Inline: []byte{1}}, ErrInlineOpcode},
		{"RC signaled fenced solicited", RC, SendWR{Opcode: WRSend, Flags: Fence | Signaled | Solicited}, nil},
		{"RC IP_CSUM", RC, SendWR{Opcode: WRSend, Flags: IPCsum}, ErrBadFlags},
		{"RC unknown flag", RC, SendWR{Opcode: WRSend, Flags: 1 << 9}, ErrBadFlags},
		{"RC 2 GiB", RC, SendWR{Opcode: WRSend, SGL: []SGE{{Length: 1 << 31}}}, nil},
		{"RC over 2 GiB", RC, SendWR{Opcode: WRSend, SGL: []SGE{{Length: 1 << 31}, {Length: 1}}}, ErrMsgTooLong},
		{"RC atomic", RC, SendWR{Opcode: WRAtomicFetchAndAdd, RemoteAddr: 0x1008, SGL: sge(8)}, nil},
		{"RC atomic unaligned", RC, SendWR{Opcode: WRAtomicCmpAndSwp, RemoteAddr: 0x1004, SGL: sge(8)}, ErrAtomicAlign},
		{"RC atomic 4-byte SGE", RC, SendWR{Opcode: WRAtomicCmpAndSwp, RemoteAddr: 0x1000, SGL: sge(4)}, ErrAtomicSGE},
		{"RC atomic no SGE", RC, SendWR{Opcode: WRAtomicCmpAndSwp, RemoteAddr: 0x1000}, ErrAtomicSGE},
		// rxe's validate_send_wr: at least 8 bytes, in any number of SGEs.
		{"RC atomic 4+4-byte SGEs", RC, SendWR{Opcode: WRAtomicCmpAndSwp, RemoteAddr: 0x1000, SGL: []SGE{{Length: 4}, {Length: 4}}}, nil},
		{"RC atomic 16-byte SGE", RC, SendWR{Opcode: WRAtomicFetchAndAdd, RemoteAddr: 0x1000, SGL: sge(16)}, nil},
		{"RC atomic 3+4-byte SGEs", RC, SendWR{Opcode: WRAtomicFetchAndAdd, RemoteAddr: 0x1000, SGL: []SGE{{Length: 3}, {Length: 4}}}, ErrAtomicSGE},
		{"RC atomic 3 SGEs", RC, SendWR{Opcode: WRAtomicFetchAndAdd, RemoteAddr: 0x1000, SGL: []SGE{{Length: 8}, {}, {}}}, ErrTooManySGE},
		{"RC local inv", RC, SendWR{Opcode: WRLocalInv, InvalidateRKey: 0x1234}, nil},
		{"RC reg mr", RC, SendWR{Opcode: WRRegMR}, nil},
		{"UC read", UC, SendWR{Opcode: WRRDMARead, SGL: sge(8)}, ErrBadOpcode},
		{"UC write", UC, SendWR{Opcode: WRRDMAWrite, SGL: sge(8)}, nil},
		{"UD send", UD, SendWR{Opcode: WRSend, SGL: sge(4096), AV: dst, RemoteQPN: 2}, nil},
		// Not refused: it completes unsent (IBA C10-93.1.1, rxe_requester).
		{"UD send longer than any MTU", UD, SendWR{Opcode: WRSend, SGL: sge(4097), AV: dst}, nil},
		{"UD send no AV", UD, SendWR{Opcode: WRSend, SGL: sge(1)}, ErrNoUDDest},
		{"UD write", UD, SendWR{Opcode: WRRDMAWrite, AV: dst}, ErrBadOpcode},
		{"GSI send", GSI, SendWR{Opcode: WRSend, SGL: sge(256), AV: dst, RemoteQPN: 1}, nil},
		{"TSO", RC, SendWR{Opcode: WRTSO}, ErrBadOpcode},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.wr
			err := CheckSendWR(tc.typ, c, &tc.wr)
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
			require.Equal(t, before, tc.wr)
		})
	}
}

func TestWRLen(t *testing.T) {
	wr := SendWR{Opcode: WRSend, SGL: []SGE{{Length: 1 << 31}, {Length: 1 << 31}, {Length: 5}}}
	require.Equal(t, uint64(1<<32+5), wr.Len(), "no 32-bit overflow")
	wr.Flags = Inline
	wr.Inline = []byte("abc")
	require.Equal(t, uint64(3), wr.Len())
	wr = SendWR{Opcode: WRAtomicFetchAndAdd}
	require.Equal(t, uint64(8), wr.Len())
	rwr := RecvWR{SGL: []SGE{{Length: 7}, {Length: 9}}}
	require.Equal(t, uint64(16), rwr.Len())
	require.NoError(t, CheckRecvWR(2, &rwr))
	require.ErrorIs(t, CheckRecvWR(1, &rwr), ErrTooManySGE)
}

func TestWROpcodeClasses(t *testing.T) {
	require.True(t, WRLocalInv.IsLocal() && WRBindMW.IsLocal() && WRRegMR.IsLocal())
	require.False(t, WRSend.IsLocal())
	require.True(t, WRAtomicCmpAndSwp.IsAtomic() && WRAtomicFetchAndAdd.IsAtomic())
	require.False(t, WRAtomicWrite.IsAtomic())
	require.True(t, WRSend.IsSend() && WRSendWithImm.IsSend() && WRSendWithInv.IsSend())
	require.False(t, WRRDMAWriteWithImm.IsSend())
	require.True(t, WRSendWithImm.HasImm() && WRRDMAWriteWithImm.HasImm())
	require.False(t, WRSendWithInv.HasImm())
}
