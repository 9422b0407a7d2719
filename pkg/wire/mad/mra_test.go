package mad

import "testing"

// mraSampleData is what a passive rdma_cm sends on a duplicate REQ before
// the application accepts: MRA of the REQ, service timeout 24.
func mraSampleData(t testing.TB) []byte {
	return data(t, map[int]string{0: "7312326c4caf495a", 8: "00c0"})
}

func TestMRA(t *testing.T) {
	every := data(t, map[int]string{0: "0102030405060708", 8: "80f8"})
	copy(every[10:], pattern(MRAPrivateLen, 11))
	runMessageCases(t, AttrMRA, []messageCase{
		{name: "REQ", data: mraSampleData(t), msg: &MRA{LocalCommID: 0x7312326c, RemoteCommID: 0x4caf495a,
			MessageMRAed: MRAMsgREQ, ServiceTimeout: 24, PrivateData: make([]byte, MRAPrivateLen)}},
		{name: "every field", data: every, msg: &MRA{LocalCommID: 0x01020304, RemoteCommID: 0x05060708,
			MessageMRAed: MRAMsgLAP, ServiceTimeout: 31, PrivateData: pattern(MRAPrivateLen, 11)}},
	})
}

func TestMRATruncated(t *testing.T) { checkTruncation(t, AttrMRA, mraSampleData(t)) }

func TestMRABadFields(t *testing.T) {
	checkBadField(t, &MRA{MessageMRAed: 4})
	checkBadField(t, &MRA{ServiceTimeout: 32})
	checkBadField(t, &MRA{PrivateData: make([]byte, MRAPrivateLen+1)})
}

func FuzzMRA(f *testing.F) {
	fuzzSeeds(f, mraSampleData(f))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrMRA, d) })
}
