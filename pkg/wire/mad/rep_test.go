package mad

import "testing"

// repSampleData is rping's REP (rdmacm_rping_v4.pcap frame 2).
func repSampleData(t testing.TB) []byte {
	return data(t, map[int]string{0: "7312326c4caf495a", 12: "00002a00", 20: "be376900", 24: "010178e0", 28: "505400fffe770011"})
}

func repSample() *REP {
	return &REP{LocalCommID: 0x7312326c, RemoteCommID: 0x4caf495a, LocalQPN: 0x2a, StartingPSN: 0xbe3769,
		ResponderResources: 1, InitiatorDepth: 1, TargetACKDelay: 15, RNRRetryCount: 7,
		LocalCAGUID: 0x505400fffe770011, PrivateData: make([]byte, REPPrivateLen)}
}

func TestREP(t *testing.T) {
	every := &REP{LocalCommID: 1, RemoteCommID: 2, LocalQKey: 0x01234567, LocalQPN: 0xFFFFFF, LocalEECN: 0xABCDEF,
		StartingPSN: 0x123456, ResponderResources: 3, InitiatorDepth: 4, TargetACKDelay: 0x1F, FailoverAccepted: 3,
		EndToEndFlowControl: true, RNRRetryCount: 5, SRQ: true, LocalCAGUID: 0x0102030405060708,
		VendorID: 0xA1B2C3, PrivateData: pattern(REPPrivateLen, 9)}
	everyData := data(t, map[int]string{0: "0000000100000002", 8: "01234567", 12: "ffffffa1", 16: "abcdefb2",
		20: "123456c3", 24: "0304ffb0", 28: "0102030405060708"})
	copy(everyData[36:], pattern(REPPrivateLen, 9))
	short := repSample()
	short.PrivateData = []byte{0xAA}
	shortWant := repSample()
	shortWant.PrivateData[0] = 0xAA
	shortData := repSampleData(t)
	shortData[36] = 0xAA
	runMessageCases(t, AttrREP, []messageCase{
		{name: "rping", data: repSampleData(t), msg: repSample()},
		{name: "every field", data: everyData, msg: every},
		{name: "short private data", data: shortData, msg: short, want: shortWant},
	})
}

func TestREPTruncated(t *testing.T) { checkTruncation(t, AttrREP, repSampleData(t)) }

func TestREPBadFields(t *testing.T) {
	for name, mod := range map[string]func(*REP){
		"QPN 25 bits":      func(m *REP) { m.LocalQPN = 1 << 24 },
		"EECN 25 bits":     func(m *REP) { m.LocalEECN = 1 << 24 },
		"PSN 25 bits":      func(m *REP) { m.StartingPSN = 1 << 24 },
		"vendor ID":        func(m *REP) { m.VendorID = 1 << 24 },
		"target ACK delay": func(m *REP) { m.TargetACKDelay = 32 },
		"failover":         func(m *REP) { m.FailoverAccepted = 4 },
		"RNR retry":        func(m *REP) { m.RNRRetryCount = 8 },
		"private data 197": func(m *REP) { m.PrivateData = make([]byte, REPPrivateLen+1) },
	} {
		t.Run(name, func(t *testing.T) {
			m := repSample()
			mod(m)
			checkBadField(t, m)
		})
	}
}

func FuzzREP(f *testing.F) {
	fuzzSeeds(f, repSampleData(f))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrREP, d) })
}
