package qp

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStateStrings(t *testing.T) {
	want := map[State]string{Reset: "RESET", Init: "INIT", RTR: "RTR", RTS: "RTS", SQD: "SQD", SQE: "SQE", Err: "ERR"}
	for s, name := range want {
		require.Equal(t, name, s.String())
		require.True(t, s.Valid())
	}
	// ibv_qp_state numbering.
	require.Equal(t, 0, int(Reset))
	require.Equal(t, 6, int(Err))
	require.False(t, State(7).Valid())
	require.False(t, State(-1).Valid())
	require.Equal(t, "State(7)", State(7).String())
}

func TestStatePostRules(t *testing.T) {
	send := map[State]bool{Reset: false, Init: false, RTR: false, RTS: true, SQD: true, SQE: true, Err: true}
	recv := map[State]bool{Reset: false, Init: true, RTR: true, RTS: true, SQD: true, SQE: true, Err: true}
	for s := Reset; s <= Err; s++ {
		require.Equal(t, send[s], s.CanPostSend(), "%v", s)
		require.Equal(t, recv[s], s.CanPostRecv(), "%v", s)
	}
	require.False(t, State(7).CanPostSend())
	require.False(t, State(7).CanPostRecv())
	require.False(t, State(-1).CanPostRecv())
}

func TestTypeStrings(t *testing.T) {
	require.Equal(t, "RC", RC.String())
	require.Equal(t, "UC", UC.String())
	require.Equal(t, "UD", UD.String())
	require.Equal(t, "GSI", GSI.String())
	require.Equal(t, 2, int(RC)) // IBV_QPT_RC
	require.Equal(t, 3, int(UC))
	require.Equal(t, 4, int(UD))
	require.Equal(t, 1, int(GSI)) // IB_QPT_GSI
	require.False(t, Type(0).Valid())
	require.False(t, Type(5).Valid())
	require.Equal(t, "Type(8)", Type(8).String())
	require.True(t, RC.Connected() && UC.Connected() && !UD.Connected() && !GSI.Connected())
	require.True(t, UD.Datagram() && GSI.Datagram() && !RC.Datagram())
}

func TestMTU(t *testing.T) {
	for m, n := range map[MTU]int{MTU256: 256, MTU512: 512, MTU1024: 1024, MTU2048: 2048, MTU4096: 4096} {
		require.Equal(t, n, m.Bytes())
		got, err := MTUFromBytes(n)
		require.NoError(t, err)
		require.Equal(t, m, got)
		require.Equal(t, m, MTUFloor(n))
		require.Equal(t, m, MTUFloor(n+1))
	}
	require.Equal(t, 1, int(MTU256))
	require.Equal(t, 5, int(MTU4096))
	require.Equal(t, "1024", MTU1024.String())
	require.Equal(t, 0, MTU(0).Bytes())
	require.Equal(t, 0, MTU(6).Bytes())
	require.Equal(t, "MTU(6)", MTU(6).String())
	for _, bad := range []int{0, 255, 257, 1500, 8192, -1} {
		_, err := MTUFromBytes(bad)
		require.Error(t, err, "%d", bad)
	}
	require.Equal(t, MTU(0), MTUFloor(255))
	require.Equal(t, MTU1024, MTUFloor(1500))
	require.Equal(t, MTU4096, MTUFloor(9000))
}

func TestAttrMaskString(t *testing.T) {
	require.Equal(t, "0", AttrMask(0).String())
	require.Equal(t, "IBV_QP_STATE", AttrState.String())
	require.Equal(t, "IBV_QP_RQ_PSN|IBV_QP_DEST_QPN", (AttrDestQPN | AttrRQPSN).String())
	require.Equal(t, "IBV_QP_STATE|0x4000000", (AttrState | 1<<26).String())
	// IBV_QP_* values.
	require.Equal(t, AttrMask(1<<20), AttrDestQPN)
	require.Equal(t, AttrMask(1<<7), AttrAV)
	require.Equal(t, AttrMask(1<<25), AttrRateLimit)
	require.True(t, (AttrAV | AttrPort).Has(AttrAV))
	require.False(t, AttrAV.Has(AttrAV|AttrPort))
}

func TestWCStatusNames(t *testing.T) {
	cases := []struct {
		s    WCStatus
		v    int
		name string
	}{
		{WCSuccess, 0, "SUCCESS"},
		{WCLocLenErr, 1, "LOC_LEN_ERR"},
		{WCLocQPOpErr, 2, "LOC_QP_OP_ERR"},
		{WCLocProtErr, 4, "LOC_PROT_ERR"},
		{WCWRFlushErr, 5, "WR_FLUSH_ERR"},
		{WCMWBindErr, 6, "MW_BIND_ERR"},
		{WCBadRespErr, 7, "BAD_RESP_ERR"},
		{WCLocAccessErr, 8, "LOC_ACCESS_ERR"},
		{WCRemInvReqErr, 9, "REM_INV_REQ_ERR"},
		{WCRemAccessErr, 10, "REM_ACCESS_ERR"},
		{WCRemOpErr, 11, "REM_OP_ERR"},
		{WCRetryExcErr, 12, "RETRY_EXC_ERR"},
		{WCRNRRetryExcErr, 13, "RNR_RETRY_EXC_ERR"},
		{WCRemAbortErr, 16, "REM_ABORT_ERR"},
		{WCFatalErr, 19, "FATAL_ERR"},
		{WCGeneralErr, 21, "GENERAL_ERR"},
		{WCTMRndvIncomplete, 23, "TM_RNDV_INCOMPLETE"},
	}
	for _, c := range cases {
		require.Equal(t, c.v, int(c.s))
		require.Equal(t, c.name, c.s.String())
		require.NotEqual(t, "unknown", c.s.Description())
	}
	require.Equal(t, "transport retry counter exceeded", WCRetryExcErr.Description())
	require.Equal(t, "Work Request Flushed Error", WCWRFlushErr.Description())
	require.Equal(t, "WCStatus(24)", WCStatus(24).String())
	require.Equal(t, "WCStatus(-1)", WCStatus(-1).String())
	require.Equal(t, "unknown", WCStatus(99).Description())
	require.NoError(t, WCSuccess.Err())
	require.ErrorContains(t, WCRemAccessErr.Err(), "REM_ACCESS_ERR")
	require.Equal(t, "REM_ACCESS_ERR", fmt.Sprint(WCRemAccessErr))
}

func TestWCOpcodes(t *testing.T) {
	require.Equal(t, 128, int(WCRecv))
	require.Equal(t, 129, int(WCRecvRDMAWithImm))
	require.True(t, WCRecv.IsRecv() && WCRecvRDMAWithImm.IsRecv())
	require.False(t, WCSend.IsRecv())
	require.Equal(t, "RECV_RDMA_WITH_IMM", WCRecvRDMAWithImm.String())
	require.Equal(t, "WCOpcode(77)", WCOpcode(77).String())

	want := map[WROpcode]WCOpcode{
		WRRDMAWrite: WCRDMAWrite, WRRDMAWriteWithImm: WCRDMAWrite, WRSend: WCSend,
		WRSendWithImm: WCSend, WRSendWithInv: WCSend, WRRDMARead: WCRDMARead,
		WRAtomicCmpAndSwp: WCCompSwap, WRAtomicFetchAndAdd: WCFetchAdd,
		WRLocalInv: WCLocalInv, WRBindMW: WCBindMW, WRRegMR: WCRegMR,
		WRFlush: WCFlush, WRAtomicWrite: WCAtomicWrite,
	}
	for wr, wc := range want {
		got, ok := wr.WCOpcode()
		require.True(t, ok, "%v", wr)
		require.Equal(t, wc, got, "%v", wr)
	}
	_, ok := WRTSO.WCOpcode()
	require.False(t, ok)
}
