package mad

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// tshark 4.0 does not dissect SIDR ("Dissector Not Implemented"), so these
// are checked against the bytes of rdmacm_udaddy.pcap, read by hand (see
// ../shared/notes/rdma-cm.md) and again from the capture in pcaps_test.go.

// sidrReqSampleData is udaddy's SIDR_REQ (frame 1): request ID 0x4eaf495a,
// P_Key 0xFFFF, service ID RDMA_PS_UDP port 7174, rdma_cm header for
// 10.77.0.12:32919 -> 10.77.0.11.
func sidrReqSampleData(t testing.TB) []byte {
	return data(t, map[int]string{0: "4eaf495a ffff 0000", 8: "0000000001111c06",
		16: "00408097", 20: "000000000000000000000000 0a4d000c", 36: "000000000000000000000000 0a4d000b"})
}

// sidrRepSampleData is udaddy's SIDR_REP (frame 2): success, QPN 0x2c,
// Q_Key 0x01234567 (RDMA_UDP_QKEY).
func sidrRepSampleData(t testing.TB) []byte {
	return data(t, map[int]string{0: "4eaf495a 00 00 0000", 8: "00002c00", 12: "0000000001111c06", 20: "01234567"})
}

func TestSIDRREQ(t *testing.T) {
	pd := CMAHeader{IPVersion: 4, SrcPort: 0x8097,
		Src: netip.MustParseAddr("10.77.0.12"), Dst: netip.MustParseAddr("10.77.0.11")}.Append(nil)
	every := data(t, map[int]string{0: "01020304 8001", 8: "1122334455667788"})
	copy(every[16:], pattern(SIDRREQPrivateLen, 4))
	runMessageCases(t, AttrSIDRREQ, []messageCase{
		{name: "udaddy", data: sidrReqSampleData(t), msg: &SIDRREQ{RequestID: 0x4eaf495a, PKey: 0xffff,
			ServiceID: ServiceID(PortSpaceUDP, 7174), PrivateData: pd},
			want: &SIDRREQ{RequestID: 0x4eaf495a, PKey: 0xffff, ServiceID: 0x0000000001111c06, PrivateData: padded(pd, SIDRREQPrivateLen)}},
		{name: "every field", data: every, msg: &SIDRREQ{RequestID: 0x01020304, PKey: 0x8001, ServiceID: 0x1122334455667788,
			PrivateData: pattern(SIDRREQPrivateLen, 4)}},
	})
	m, err := ParseSIDRREQ(sidrReqSampleData(t))
	require.NoError(t, err)
	h, err := ParseCMAHeader(m.PrivateData)
	require.NoError(t, err)
	require.Equal(t, CMAHeader{IPVersion: 4, SrcPort: 32919, Src: netip.MustParseAddr("10.77.0.12"), Dst: netip.MustParseAddr("10.77.0.11")}, h)
}

func TestSIDRREQReservedIgnored(t *testing.T) {
	d := sidrReqSampleData(t)
	d[6], d[7] = 0xFF, 0xFF
	m, err := ParseSIDRREQ(d)
	require.NoError(t, err)
	require.Equal(t, sidrReqSampleData(t), m.AppendData(nil))
}

func TestSIDRREP(t *testing.T) {
	every := data(t, map[int]string{0: "01020304 04 05 a1b2", 8: "abcdefc3", 12: "1122334455667788", 20: "80010000", 24: "0102030405"})
	copy(every[96:], pattern(SIDRREPPrivateLen, 8))
	runMessageCases(t, AttrSIDRREP, []messageCase{
		{name: "udaddy", data: sidrRepSampleData(t), msg: &SIDRREP{RequestID: 0x4eaf495a, Status: SIDRSuccess, QPN: 0x2c,
			ServiceID: 0x0000000001111c06, QKey: 0x01234567, PrivateData: make([]byte, SIDRREPPrivateLen)}},
		{name: "every field", data: every, msg: &SIDRREP{RequestID: 0x01020304, Status: SIDRRedirect, VendorID: 0xa1b2c3,
			QPN: 0xabcdef, ServiceID: 0x1122334455667788, QKey: 0x80010000, ClassPortInfo: pattern(5, 1),
			PrivateData: pattern(SIDRREPPrivateLen, 8)}},
	})
}

func TestSIDRREPBadInfoLength(t *testing.T) {
	d := sidrRepSampleData(t)
	d[5] = SIDRREPInfoLen + 1
	_, err := ParseSIDRREP(d)
	require.ErrorIs(t, err, ErrBadField)
	d[5] = SIDRREPInfoLen
	m, err := ParseSIDRREP(d)
	require.NoError(t, err)
	require.Len(t, m.ClassPortInfo, SIDRREPInfoLen)
}

func TestSIDRTruncated(t *testing.T) {
	checkTruncation(t, AttrSIDRREQ, sidrReqSampleData(t))
	checkTruncation(t, AttrSIDRREP, sidrRepSampleData(t))
}

func TestSIDRBadFields(t *testing.T) {
	checkBadField(t, &SIDRREQ{PrivateData: make([]byte, SIDRREQPrivateLen+1)})
	checkBadField(t, &SIDRREP{QPN: 1 << 24})
	checkBadField(t, &SIDRREP{VendorID: 1 << 24})
	checkBadField(t, &SIDRREP{ClassPortInfo: make([]byte, SIDRREPInfoLen+1)})
	checkBadField(t, &SIDRREP{PrivateData: make([]byte, SIDRREPPrivateLen+1)})
}

func TestSIDRStatusString(t *testing.T) {
	require.Equal(t, "success", SIDRSuccess.String())
	require.Equal(t, "unsupported service ID", SIDRUnsupported.String())
	require.Equal(t, "unsupported version", SIDRUnsupportedVersion.String())
	require.Equal(t, "SIDRStatus(6)", SIDRStatus(6).String())
}

func FuzzSIDRREQ(f *testing.F) {
	fuzzSeeds(f, sidrReqSampleData(f))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrSIDRREQ, d) })
}

func FuzzSIDRREP(f *testing.F) {
	fuzzSeeds(f, sidrRepSampleData(f), data(f, map[int]string{5: "03", 24: "ffffffff"}))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrSIDRREP, d) })
}
