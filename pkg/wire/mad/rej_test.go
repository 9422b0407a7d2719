package mad

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// rejSampleData is the REJ of rdmacm_rej_no_listener.pcap: no listener, so
// local comm ID 0, message rejected REQ, reason 8 (invalid service ID).
func rejSampleData(t testing.TB) []byte {
	return data(t, map[int]string{0: "0000000074af495a", 8: "00000008"})
}

func TestREJ(t *testing.T) {
	gidARI := gid("::ffff:10.77.0.11").As16()
	every := data(t, map[int]string{0: "0102030405060708", 8: "8020001c", 12: "00000000000000000000ffff0a4d000b"})
	copy(every[84:], pattern(REJPrivateLen, 2))
	full := data(t, map[int]string{8: "40900028"})
	copy(full[12:], pattern(REJARILen, 100))
	runMessageCases(t, AttrREJ, []messageCase{
		{name: "no listener", data: rejSampleData(t),
			msg: &REJ{RemoteCommID: 0x74af495a, MessageRejected: REJMsgREQ, Reason: REJInvalidServiceID, PrivateData: make([]byte, REJPrivateLen)}},
		{name: "GID ARI", data: every,
			msg: &REJ{LocalCommID: 0x01020304, RemoteCommID: 0x05060708, MessageRejected: REJMsgOther, Reason: REJConsumerDefined,
				ARI: gidARI[:], PrivateData: pattern(REJPrivateLen, 2)}},
		{name: "full ARI", data: full,
			msg:  &REJ{MessageRejected: REJMsgREP, Reason: 40, ARI: pattern(REJARILen, 100)},
			want: &REJ{MessageRejected: REJMsgREP, Reason: 40, ARI: pattern(REJARILen, 100), PrivateData: make([]byte, REJPrivateLen)}},
	})
}

func TestREJBadARILength(t *testing.T) {
	d := rejSampleData(t)
	d[9] = 73 << 1
	_, err := ParseREJ(d)
	require.ErrorIs(t, err, ErrBadField)
	d[9] = 72<<1 | 1 // the reserved bit is ignored
	m, err := ParseREJ(d)
	require.NoError(t, err)
	require.Len(t, m.ARI, 72)
}

// TestREJARIArea: the whole ARI area whatever the ARI length says, where
// cm.c's cm_acquire_rejected_id reads a timeout REJ's CA GUID (CM
// follow-up, item 2: a timeout REJ with ARI length 0).
func TestREJARIArea(t *testing.T) {
	d := data(t, map[int]string{8: "00000004", 12: "0200aabbccddeeff"}) // timeout, ARI length 0
	m, err := ParseREJ(d)
	require.NoError(t, err)
	require.Nil(t, m.ARI, "ParseREJ honours the length")
	area := REJARIArea(d)
	require.Len(t, area, REJARILen)
	require.Equal(t, d[12:20], area[:8])
	require.Nil(t, REJARIArea(d[:12+REJARILen-1]))
}

func TestREJTruncated(t *testing.T) { checkTruncation(t, AttrREJ, rejSampleData(t)) }

func TestREJBadFields(t *testing.T) {
	checkBadField(t, &REJ{MessageRejected: 4})
	checkBadField(t, &REJ{ARI: make([]byte, REJARILen+1)})
	checkBadField(t, &REJ{PrivateData: make([]byte, REJPrivateLen+1)})
}

func TestREJReasonString(t *testing.T) {
	for r, want := range map[REJReason]string{
		REJNoQP: "no QP", REJTimeout: "timeout", REJInvalidServiceID: "invalid service ID",
		REJStaleConn: "stale connection", REJInvalidGID: "invalid GID", REJConsumerDefined: "consumer defined",
		REJInvalidMTU: "invalid MTU", REJInvalidAltFlowLabel: "invalid alt flow label",
		REJVendorOptionNotSupported: "vendor option is not supported",
		0:                           "REJReason(0)", 34: "REJReason(34)", 36: "REJReason(36)", 0xFFFF: "REJReason(65535)",
	} {
		require.Equal(t, want, r.String())
	}
	for r := REJNoQP; r <= REJInvalidAltFlowLabel; r++ {
		require.NotContains(t, r.String(), "REJReason(", "reason %d has a name", r)
	}
}

func FuzzREJ(f *testing.F) {
	fuzzSeeds(f, rejSampleData(f), data(f, map[int]string{8: "8010000c", 12: "ff"}))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrREJ, d) })
}
