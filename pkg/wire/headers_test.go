package wire

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

func TestBTHFields(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		hex                       string
		op                        Opcode
		se, m, fecn, becn, ackreq bool
		pad                       int
		tver                      uint8
		pkey                      uint16
		qp, psn                   uint32
		resv6, resv7              uint8
	}{
		{name: "rxe send first", hex: "0000ffff000000110080a1b2", op: RCSendFirst, pkey: 0xffff, qp: 0x11, psn: 0x80a1b2},
		{name: "all bits", hex: "06f7123480ffffffffffffff", op: RCWriteFirst, se: true, m: true, pad: 3, tver: 7, pkey: 0x1234, fecn: true, qp: 0xffffff, ackreq: true, psn: 0xffffff, resv6: 0, resv7: 0x7f},
		{name: "becn resv6", hex: "8100ffff7f000001000000ff", op: CNP, pkey: 0xffff, becn: true, resv6: 0x3f, qp: 1, psn: 0xff},
		{name: "ack req psn wrap", hex: "1100ffff00abcdef80fffffe", op: RCAck, pkey: 0xffff, qp: 0xabcdef, ackreq: true, psn: 0xfffffe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := BTH(unhex(t, tc.hex))
			require.Equal(t, tc.op, b.Opcode())
			require.Equal(t, tc.se, b.SE())
			require.Equal(t, tc.m, b.M())
			require.Equal(t, tc.pad, b.PadCount())
			require.Equal(t, tc.tver, b.TVer())
			require.Equal(t, tc.pkey, b.PKey())
			require.Equal(t, tc.fecn, b.FECN())
			require.Equal(t, tc.becn, b.BECN())
			require.Equal(t, tc.resv6, b.Resv6())
			require.Equal(t, tc.qp, b.DestQP())
			require.Equal(t, tc.ackreq, b.AckReq())
			require.Equal(t, tc.resv7, b.Resv7())
			require.Equal(t, tc.psn, b.PSN())

			// Setters reproduce the bytes (reserved bits copied by hand).
			c := make(BTH, BTHLen)
			c.SetOpcode(tc.op)
			c.SetSE(tc.se)
			c.SetM(tc.m)
			c.SetPadCount(tc.pad)
			c.SetTVer(tc.tver)
			c.SetPKey(tc.pkey)
			c[4] = tc.resv6
			c.SetFECN(tc.fecn)
			c.SetBECN(tc.becn)
			c.SetDestQP(tc.qp)
			c[8] = tc.resv7
			c.SetAckReq(tc.ackreq)
			c.SetPSN(tc.psn)
			require.Equal(t, tc.hex, hex.EncodeToString(c))
		})
	}
	// Setters clear as well as set, and mask to field width.
	b := BTH(unhex(t, "fffffffffffffffffffffff"+"f"))
	b.SetSE(false)
	b.SetM(false)
	b.SetAckReq(false)
	b.SetFECN(false)
	b.SetBECN(false)
	b.SetPadCount(4) // only two bits
	b.SetDestQP(0x1_000002)
	b.SetPSN(0x1_000003)
	require.Equal(t, "ff0fffff3f0000027f000003", hex.EncodeToString(b))
}

func TestRETHAtomicETHFields(t *testing.T) {
	r := RETH(unhex(t, "0123456789abcdef"+"deadbeef"+"00001000"))
	require.Equal(t, uint64(0x0123456789abcdef), r.VA())
	require.Equal(t, uint32(0xdeadbeef), r.RKey())
	require.Equal(t, uint32(4096), r.DMALen())
	c := make(RETH, RETHLen)
	c.SetVA(r.VA())
	c.SetRKey(r.RKey())
	c.SetDMALen(r.DMALen())
	require.Equal(t, []byte(r), []byte(c))

	a := AtomicETH(unhex(t, "0000000000001000"+"00c0ffee"+"1111111122222222"+"3333333344444444"))
	require.Equal(t, uint64(0x1000), a.VA())
	require.Equal(t, uint32(0xc0ffee), a.RKey())
	require.Equal(t, uint64(0x1111111122222222), a.SwapAdd())
	require.Equal(t, uint64(0x3333333344444444), a.Compare())
	ca := make(AtomicETH, AtomicETHLen)
	ca.SetVA(a.VA())
	ca.SetRKey(a.RKey())
	ca.SetSwapAdd(a.SwapAdd())
	ca.SetCompare(a.Compare())
	require.Equal(t, []byte(a), []byte(ca))

	aa := AtomicAckETH(unhex(t, "fedcba9876543210"))
	require.Equal(t, uint64(0xfedcba9876543210), aa.OrigData())
	ca2 := make(AtomicAckETH, AtomicAckETHLen)
	ca2.SetOrigData(aa.OrigData())
	require.Equal(t, []byte(aa), []byte(ca2))
}

func TestSmallHeaders(t *testing.T) {
	d := DETH(unhex(t, "11111111"+"00"+"000021"))
	require.Equal(t, uint32(0x11111111), d.QKey())
	require.Equal(t, uint8(0), d.Reserved())
	require.Equal(t, uint32(0x21), d.SrcQP())
	cd := make(DETH, DETHLen)
	cd.SetQKey(d.QKey())
	cd.SetSrcQP(d.SrcQP())
	require.Equal(t, []byte(d), []byte(cd))

	i := ImmDt(unhex(t, "11223344"))
	require.Equal(t, uint32(0x11223344), i.Imm())
	ci := make(ImmDt, 4)
	ci.SetImm(0x11223344)
	require.Equal(t, []byte(i), []byte(ci))

	ie := IETH(unhex(t, "0a0b0c0d"))
	require.Equal(t, uint32(0x0a0b0c0d), ie.RKey())
	cie := make(IETH, 4)
	cie.SetRKey(0x0a0b0c0d)
	require.Equal(t, []byte(ie), []byte(cie))

	f := FETH(unhex(t, "00000012"))
	require.Equal(t, uint8(FlushPersistent), f.PlacementType())
	require.Equal(t, uint8(FlushMR), f.Selectivity())
	cf := make(FETH, 4)
	cf.Set(FlushPersistent, FlushMR)
	require.Equal(t, []byte(f), []byte(cf))

	c := CNPBody(unhex(t, "0000000000000001"+"8000000000000000"))
	require.Equal(t, uint64(1), c.Reserved1())
	require.Equal(t, uint64(1)<<63, c.Reserved2())
}

func TestAETHSyndrome(t *testing.T) {
	for _, tc := range []struct {
		syn   Syndrome
		kind  SyndromeKind
		value uint8
		name  string
	}{
		{ACKSyndrome(0), SynACK, 0, "ACK"},
		{ACKSyndrome(CreditsInvalid), SynACK, 31, "ACK"},
		{RNRSyndrome(0), SynRNR, 0, "RNR_NAK"},
		{RNRSyndrome(14), SynRNR, 14, "RNR_NAK"},
		{NAKSyndrome(NAKPSNSeqErr), SynNAK, 0, "NAK"},
		{NAKSyndrome(NAKInvalidRequest), SynNAK, 1, "NAK"},
		{NAKSyndrome(NAKRemoteAccess), SynNAK, 2, "NAK"},
		{NAKSyndrome(NAKRemoteOp), SynNAK, 3, "NAK"},
		{NAKSyndrome(NAKInvalidRDRequest), SynNAK, 4, "NAK"},
		{0x40, SynReserved, 0, "RESERVED"},
		{0x80, SynReserved, 0, "RESERVED"},
	} {
		require.Equal(t, tc.kind, tc.syn.Kind(), "%#x", uint8(tc.syn))
		require.Equal(t, tc.value, tc.syn.Value())
		require.Equal(t, tc.name, tc.syn.Kind().String())
	}
	require.Equal(t, Syndrome(0x60), NAKSyndrome(0))
	require.Equal(t, Syndrome(0x3f), RNRSyndrome(0xff), "masked to five bits")
	require.Equal(t, uint8(31), ACKSyndrome(31).Credits())
	require.Equal(t, uint8(14), RNRSyndrome(14).RNRTimer())
	require.Equal(t, uint8(3), NAKSyndrome(3).NAKCode())
	require.Equal(t, "REMOTE_OPERATIONAL_ERROR", NAKCodeName(NAKRemoteOp))
	require.Equal(t, "RESERVED", NAKCodeName(9))

	a := AETH(unhex(t, "1f123456"))
	require.Equal(t, ACKSyndrome(31), a.Syndrome())
	require.Equal(t, uint32(0x123456), a.MSN())
	c := make(AETH, AETHLen)
	c.SetSyndrome(ACKSyndrome(31))
	c.SetMSN(0x123456)
	require.Equal(t, []byte(a), []byte(c))
}
