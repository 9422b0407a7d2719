package mad

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// madHeaderSample is the header of rping's REQ (rdmacm_rping_v4.pcap).
var madHeaderSample = []byte{
	0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x02, 0x5a, 0x49, 0xaf, 0x4c,
	0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
}

func TestHeader(t *testing.T) {
	h, err := ParseHeader(madHeaderSample)
	require.NoError(t, err)
	want := Header{BaseVersion: 1, MgmtClass: ClassCM, ClassVersion: 2, Method: MethodSend, TID: 0x000000025a49af4c, AttrID: AttrREQ}
	require.Equal(t, want, h)
	require.Equal(t, madHeaderSample, h.Append(nil))
	require.Equal(t, want, CMHeader(0x000000025a49af4c, &REQ{}))

	every := Header{BaseVersion: 0x81, MgmtClass: 0x82, ClassVersion: 0x83, Method: 0x84, Status: 0x0506,
		ClassSpecific: 0x0708, TID: 0x090a0b0c0d0e0f10, AttrID: 0x1112, AttrMod: 0x15161718}
	b := every.Append([]byte{0xEE})
	require.Equal(t, []byte{0xEE, 0x81, 0x82, 0x83, 0x84, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
		0x11, 0x12, 0x00, 0x00, 0x15, 0x16, 0x17, 0x18}, b)
	// The reserved bytes are ignored.
	b[1+18], b[1+19] = 0xFF, 0xFF
	got, err := ParseHeader(b[1:])
	require.NoError(t, err)
	require.Equal(t, every, got)

	for n := range HeaderLen {
		_, err := ParseHeader(madHeaderSample[:n])
		require.ErrorIs(t, err, ErrTruncated, "prefix %d", n)
	}
}

// TestParseBadHeader: a MAD that is not a CM SEND of a known attribute is
// refused with the sentinel saying why, and the header is still returned.
func TestParseBadHeader(t *testing.T) {
	good := append(bytes.Clone(madHeaderSample), reqSampleData(t)...)
	_, m, err := Parse(good)
	require.NoError(t, err)
	require.IsType(t, &REQ{}, m)
	for _, tc := range []struct {
		name string
		off  int
		val  byte
		err  error
	}{
		{"base version 2", 0, 2, ErrBadVersion},
		{"base version 0", 0, 0, ErrBadVersion},
		{"SA class", 1, 0x03, ErrBadClass},
		{"class version 1", 2, 1, ErrBadVersion},
		{"class version 3", 2, 3, ErrBadVersion},
		{"method GET", 3, 0x01, ErrBadMethod},
		{"response bit", 3, 0x83, ErrBadMethod},
		{"ClassPortInfo", 17, 0x01, ErrUnknownAttr},
		{"LAP", 17, 0x19, ErrUnknownAttr},
		{"APR", 17, 0x1A, ErrUnknownAttr},
		{"attribute 0x1B", 17, 0x1B, ErrUnknownAttr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bytes.Clone(good)
			b[tc.off] = tc.val
			h, m, err := Parse(b)
			require.ErrorIs(t, err, tc.err)
			require.Nil(t, m)
			require.Equal(t, uint64(0x000000025a49af4c), h.TID)
		})
	}
	// A bad field inside the message is reported as such.
	b := append(CMHeader(1, &REJ{}).Append(nil), rejSampleData(t)...)
	b[HeaderLen+9] = 0xFE
	_, m, err = Parse(b)
	require.ErrorIs(t, err, ErrBadField)
	require.Nil(t, m)
}

func TestAppendAppends(t *testing.T) {
	prefix := []byte{1, 2, 3}
	b := Append(prefix, 7, &RTU{LocalCommID: 9})
	require.Len(t, b, 3+MADLen)
	require.Equal(t, prefix, b[:3])
	_, m, err := Parse(b[3:])
	require.NoError(t, err)
	require.Equal(t, uint32(9), m.(*RTU).LocalCommID)
}

func TestTimeoutDuration(t *testing.T) {
	require.Equal(t, 4096*time.Nanosecond, TimeoutDuration(0))
	require.Equal(t, 8192*time.Nanosecond, TimeoutDuration(1))
	require.Equal(t, 4294967296*time.Nanosecond, TimeoutDuration(20))  // rdma_cm's CM response timeout, ~4.3 s
	require.Equal(t, 68719476736*time.Nanosecond, TimeoutDuration(24)) // rdma_cm's MRA service timeout, ~68.7 s
	require.Equal(t, 4096*time.Nanosecond<<31, TimeoutDuration(31))
	require.Equal(t, TimeoutDuration(31), TimeoutDuration(200), "clamped to the 5-bit maximum")
}

// FuzzParse: Parse never panics on any input; whatever it accepts
// re-encodes to the canonical form of the input.
func FuzzParse(f *testing.F) {
	for _, m := range []Message{reqSample(), repSample(), &RTU{LocalCommID: 1}, &DREQ{RemoteQPN: 2}, &DREP{},
		&REJ{Reason: REJStaleConn}, &MRA{ServiceTimeout: 24}, &SIDRREQ{ServiceID: 1}, &SIDRREP{QPN: 3}} {
		f.Add(Append(nil, 0x1234, m))
	}
	f.Add(madHeaderSample)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, m, err := Parse(b)
		if err != nil {
			require.Nil(t, m)
			return
		}
		require.Equal(t, CMHeader(h.TID, m), Header{BaseVersion: h.BaseVersion, MgmtClass: h.MgmtClass,
			ClassVersion: h.ClassVersion, Method: h.Method, TID: h.TID, AttrID: h.AttrID})
		want := bytes.Clone(b)
		clear(want[18:20])
		copy(want[HeaderLen:], canonical(h.AttrID, b[HeaderLen:]))
		require.Equal(t, want, append(h.Append(nil), m.AppendData(nil)...))
	})
}

// TestCommIDWords: the first two data words, whatever the message; a
// REQ's second is its bytes 4-7 (reserved and the vendor ID), what
// cm_issue_rej echoes as its REJ's local comm ID.
func TestCommIDWords(t *testing.T) {
	b, err := Marshal(1, &REQ{LocalCommID: 0x74AF495A, VendorID: 0xABCDEF, Primary: Path{LocalGID: netip.IPv6Unspecified(), RemoteGID: netip.IPv6Unspecified()}})
	require.NoError(t, err)
	b[HeaderLen+4] = 0x5A // the reserved byte
	first, second, ok := CommIDWords(b[HeaderLen:])
	require.True(t, ok)
	require.Equal(t, uint32(0x74AF495A), first)
	require.Equal(t, uint32(0x5AABCDEF), second)
	b, err = Marshal(1, &REP{LocalCommID: 7, RemoteCommID: 9})
	require.NoError(t, err)
	first, second, ok = CommIDWords(b[HeaderLen:])
	require.Equal(t, []any{uint32(7), uint32(9), true}, []any{first, second, ok})
	_, _, ok = CommIDWords(make([]byte, 7))
	require.False(t, ok)
}
