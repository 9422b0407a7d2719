package mad

import "testing"

// The three messages that are two comm IDs and private data: RTU, DREP
// (and, with a QPN, DREQ in dreq_test.go).

func TestRTU(t *testing.T) {
	d := data(t, map[int]string{0: "4caf495a7312326c"})
	every := data(t, map[int]string{0: "fffffffe00000001"})
	copy(every[8:], pattern(RTUPrivateLen, 7))
	runMessageCases(t, AttrRTU, []messageCase{
		{name: "rping", data: d, msg: &RTU{LocalCommID: 0x4caf495a, RemoteCommID: 0x7312326c, PrivateData: make([]byte, RTUPrivateLen)}},
		{name: "nil private data", data: d, msg: &RTU{LocalCommID: 0x4caf495a, RemoteCommID: 0x7312326c},
			want: &RTU{LocalCommID: 0x4caf495a, RemoteCommID: 0x7312326c, PrivateData: make([]byte, RTUPrivateLen)}},
		{name: "full private data", data: every, msg: &RTU{LocalCommID: 0xfffffffe, RemoteCommID: 1, PrivateData: pattern(RTUPrivateLen, 7)}},
	})
}

func TestRTUTruncated(t *testing.T) {
	checkTruncation(t, AttrRTU, data(t, map[int]string{0: "4caf495a7312326c"}))
}

func TestRTUBadFields(t *testing.T) {
	checkBadField(t, &RTU{PrivateData: make([]byte, RTUPrivateLen+1)})
}

func FuzzRTU(f *testing.F) {
	fuzzSeeds(f, data(f, map[int]string{0: "4caf495a7312326c", 8: "01"}))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrRTU, d) })
}

func TestDREP(t *testing.T) {
	d := data(t, map[int]string{0: "7312326c4caf495a"})
	every := data(t, map[int]string{0: "0102030405060708"})
	copy(every[8:], pattern(DREPPrivateLen, 3))
	runMessageCases(t, AttrDREP, []messageCase{
		{name: "rping", data: d, msg: &DREP{LocalCommID: 0x7312326c, RemoteCommID: 0x4caf495a, PrivateData: make([]byte, DREPPrivateLen)}},
		{name: "full private data", data: every, msg: &DREP{LocalCommID: 0x01020304, RemoteCommID: 0x05060708, PrivateData: pattern(DREPPrivateLen, 3)}},
	})
}

func TestDREPTruncated(t *testing.T) {
	checkTruncation(t, AttrDREP, data(t, map[int]string{0: "7312326c4caf495a"}))
}

func TestDREPBadFields(t *testing.T) {
	checkBadField(t, &DREP{PrivateData: make([]byte, DREPPrivateLen+1)})
}

func FuzzDREP(f *testing.F) {
	fuzzSeeds(f, data(f, map[int]string{0: "7312326c4caf495a", 231: "01"}))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrDREP, d) })
}
