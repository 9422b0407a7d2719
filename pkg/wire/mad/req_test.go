package mad

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// reqSample is a REQ as rping sends it (rdmacm_rping_v4.pcap frame 1),
// with a 36-byte rdma_cm header in the private data.
func reqSample() *REQ {
	pd := CMAHeader{IPVersion: 4, SrcPort: 0xe947,
		Src: netip.MustParseAddr("10.77.0.12"), Dst: netip.MustParseAddr("10.77.0.11")}.Append(nil)
	m := &REQ{
		LocalCommID: 0x4caf495a, ServiceID: 0x0000000001061c06, LocalCAGUID: 0x505400fffe770012,
		LocalQPN: 0x2b, ResponderResources: 1, InitiatorDepth: 1, RemoteCMResponseTimeout: 20,
		StartingPSN: 0x4d3d35, LocalCMResponseTimeout: 20, RetryCount: 7, PKey: 0xffff, PathMTU: 3,
		RNRRetryCount: 7, MaxCMRetries: 15,
		Primary: Path{LocalLID: 0xffff, RemoteLID: 0xffff,
			LocalGID: gid("::ffff:10.77.0.12"), RemoteGID: gid("::ffff:10.77.0.11"),
			FlowLabel: 0xc5b9f, HopLimit: 64, LocalACKTimeout: 19},
		PrivateData: padded(pd, REQPrivateLen),
	}
	return m
}

func reqSampleData(t testing.TB) []byte {
	return data(t, map[int]string{
		0: "4caf495a", 8: "0000000001061c06", 16: "505400fffe770012", 32: "00002b01", 36: "00000001",
		40: "000000a0", 44: "4d3d35a7", 48: "ffff37f0", 52: "ffffffff",
		56: "00000000000000000000ffff0a4d000c", 72: "00000000000000000000ffff0a4d000b",
		88: "c5b9f000", 92: "00400098",
		140: "0040e947", 144: "0000000000000000000000000a4d000c", 160: "0000000000000000000000000a4d000b",
	})
}

func TestREQ(t *testing.T) {
	rping := reqSample()
	alt := Path{LocalLID: 0x1234, RemoteLID: 0x5678, LocalGID: gid("fe80::1"), RemoteGID: gid("2001:db8::2"),
		FlowLabel: 0xFFFFF, PacketRate: 0x3F, TrafficClass: 0xAB, HopLimit: 0xCD, SL: 0xF, SubnetLocal: true,
		LocalACKTimeout: 0x1F}
	every := &REQ{
		LocalCommID: 0x01020304, VendorID: 0xABCDEF, ServiceID: 0x1122334455667788, LocalCAGUID: 0x99aabbccddeeff00,
		LocalQKey: 0x80010000, LocalQPN: 0xFFFFFF, ResponderResources: 0x10, LocalEECN: 0x123456,
		InitiatorDepth: 0x20, RemoteEECN: 0x654321, RemoteCMResponseTimeout: 0x1F, TransportType: TransportXRC,
		EndToEndFlowControl: true, StartingPSN: 0xFEDCBA, LocalCMResponseTimeout: 0x11, RetryCount: 5,
		PKey: 0x7FFF, PathMTU: 5, RDCExists: true, RNRRetryCount: 6, MaxCMRetries: 0xE, SRQ: true,
		ExtendedTransport: 7,
		Primary:           Path{LocalLID: 1, RemoteLID: 2, LocalGID: gid("::ffff:192.0.2.1"), RemoteGID: gid("::ffff:192.0.2.2"), FlowLabel: 1, PacketRate: 2, SL: 1, LocalACKTimeout: 1},
		Alternate:         &alt,
		SAPSupported:      true,
		PrivateData:       pattern(REQPrivateLen, 1),
	}
	everyData := data(t, map[int]string{
		0: "01020304", 4: "00abcdef", 8: "1122334455667788", 16: "99aabbccddeeff00", 28: "80010000",
		32: "ffffff10", 36: "12345620", 40: "654321ff", 44: "fedcba8d", 48: "7fff5eef",
		52: "00010002", 56: "00000000000000000000ffffc0000201", 72: "00000000000000000000ffffc0000202",
		88: "00001002", 92: "00001008",
		96: "12345678", 100: "fe800000000000000000000000000001", 116: "20010db8000000000000000000000002",
		132: "fffff03f", 136: "abcdf8fc",
	})
	copy(everyData[140:], pattern(REQPrivateLen, 1))
	// A 4-byte GID is mapped on Append and comes back 16-byte.
	v4 := *rping
	v4.Primary.LocalGID, v4.Primary.RemoteGID = netip.MustParseAddr("10.77.0.12"), netip.MustParseAddr("10.77.0.11")
	short := *rping
	short.PrivateData = rping.PrivateData[:CMAHeaderLen]

	runMessageCases(t, AttrREQ, []messageCase{
		{name: "rping", data: reqSampleData(t), msg: rping},
		{name: "every field", data: everyData, msg: every},
		{name: "IPv4 GIDs", data: reqSampleData(t), msg: &v4, want: rping},
		{name: "short private data", data: reqSampleData(t), msg: &short, want: rping},
	})
}

func TestREQReservedIgnored(t *testing.T) {
	d := reqSampleData(t)
	d[4], d[24] = 0xFF, 0xFF // reserved byte, reserved word
	d[90] |= 0x0F            // reserved(6) after the flow label: 4 bits here ...
	d[91] = 0xC5             // ... 2 here, then packet rate 5
	d[94] |= 0x07
	d[139] = 0x03 // alternate's reserved bits only: still no alternate path
	m, err := ParseREQ(d)
	require.NoError(t, err)
	require.Nil(t, m.Alternate)
	require.False(t, m.SAPSupported)
	require.Equal(t, uint32(0xc5b9f), m.Primary.FlowLabel)
	require.Equal(t, uint8(5), m.Primary.PacketRate)
	require.Equal(t, canonical(AttrREQ, d), m.AppendData(nil))
}

func TestREQTruncated(t *testing.T) { checkTruncation(t, AttrREQ, reqSampleData(t)) }

func TestREQBadFields(t *testing.T) {
	for name, mod := range map[string]func(*REQ){
		"QPN 25 bits":          func(m *REQ) { m.LocalQPN = 1 << 24 },
		"PSN 25 bits":          func(m *REQ) { m.StartingPSN = 0x1000000 },
		"local EECN":           func(m *REQ) { m.LocalEECN = 1 << 24 },
		"remote EECN":          func(m *REQ) { m.RemoteEECN = 1 << 24 },
		"vendor ID":            func(m *REQ) { m.VendorID = 1 << 24 },
		"remote timeout":       func(m *REQ) { m.RemoteCMResponseTimeout = 32 },
		"local timeout":        func(m *REQ) { m.LocalCMResponseTimeout = 32 },
		"transport type":       func(m *REQ) { m.TransportType = 4 },
		"retry count":          func(m *REQ) { m.RetryCount = 8 },
		"RNR retry":            func(m *REQ) { m.RNRRetryCount = 8 },
		"path MTU":             func(m *REQ) { m.PathMTU = 16 },
		"max CM retries":       func(m *REQ) { m.MaxCMRetries = 16 },
		"extended transport":   func(m *REQ) { m.ExtendedTransport = 8 },
		"private data 93":      func(m *REQ) { m.PrivateData = make([]byte, REQPrivateLen+1) },
		"flow label":           func(m *REQ) { m.Primary.FlowLabel = 1 << 20 },
		"packet rate":          func(m *REQ) { m.Primary.PacketRate = 64 },
		"SL":                   func(m *REQ) { m.Primary.SL = 16 },
		"ACK timeout":          func(m *REQ) { m.Primary.LocalACKTimeout = 32 },
		"no local GID":         func(m *REQ) { m.Primary.LocalGID = netip.Addr{} },
		"no remote GID":        func(m *REQ) { m.Primary.RemoteGID = netip.Addr{} },
		"alternate flow label": func(m *REQ) { p := m.Primary; p.FlowLabel = 1 << 20; m.Alternate = &p },
	} {
		t.Run(name, func(t *testing.T) {
			m := reqSample()
			mod(m)
			checkBadField(t, m)
		})
	}
}

func FuzzREQ(f *testing.F) {
	fuzzSeeds(f, reqSampleData(f))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrREQ, d) })
}
