package mad

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func dreqSampleData(t testing.TB) []byte {
	return data(t, map[int]string{0: "4caf495a7312326c", 8: "00002a00"})
}

func TestDREQ(t *testing.T) {
	every := data(t, map[int]string{0: "0102030405060708", 8: "abcdef00"})
	copy(every[12:], pattern(DREQPrivateLen, 5))
	runMessageCases(t, AttrDREQ, []messageCase{
		{name: "rping", data: dreqSampleData(t), msg: &DREQ{LocalCommID: 0x4caf495a, RemoteCommID: 0x7312326c, RemoteQPN: 0x2a, PrivateData: make([]byte, DREQPrivateLen)}},
		{name: "every field", data: every, msg: &DREQ{LocalCommID: 0x01020304, RemoteCommID: 0x05060708, RemoteQPN: 0xabcdef, PrivateData: pattern(DREQPrivateLen, 5)}},
	})
}

func TestDREQReservedIgnored(t *testing.T) {
	d := dreqSampleData(t)
	d[11] = 0xFF
	m, err := ParseDREQ(d)
	require.NoError(t, err)
	if m.RemoteQPN != 0x2a {
		t.Fatalf("RemoteQPN %#x, want 0x2a", m.RemoteQPN)
	}
}

func TestDREQTruncated(t *testing.T) { checkTruncation(t, AttrDREQ, dreqSampleData(t)) }

func TestDREQBadFields(t *testing.T) {
	checkBadField(t, &DREQ{RemoteQPN: 1 << 24})
	checkBadField(t, &DREQ{PrivateData: make([]byte, DREQPrivateLen+1)})
}

func FuzzDREQ(f *testing.F) {
	fuzzSeeds(f, dreqSampleData(f))
	f.Fuzz(func(t *testing.T, d []byte) { fuzzData(t, AttrDREQ, d) })
}
