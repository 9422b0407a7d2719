package mad

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Test helpers shared by the per-message tests. The offsets written here
// are spelled out from IBA chapter 12 (and Linux's ibta_vol1_c12.h) rather
// than taken from the implementation's constants, so a wrong constant fails.

// data returns a zeroed DataLen-byte area with the given hex strings
// written at their offsets.
func data(t testing.TB, at map[int]string) []byte {
	t.Helper()
	d := make([]byte, DataLen)
	for off, h := range at {
		b, err := hex.DecodeString(strings.ReplaceAll(h, " ", ""))
		require.NoError(t, err)
		require.LessOrEqual(t, off+len(b), DataLen, "offset %d", off)
		copy(d[off:], b)
	}
	return d
}

// pattern returns n bytes 1, 2, 3, ... (mod 256, never 0 for n < 256).
func pattern(n int, start byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = start + byte(i)
	}
	return b
}

// padded returns p zero-padded to n bytes: what Parse returns for private
// data Append was given.
func padded(p []byte, n int) []byte {
	out := make([]byte, n)
	copy(out, p)
	return out
}

func gid(s string) netip.Addr { return netip.AddrFrom16(netip.MustParseAddr(s).As16()) }

// messageCase is one table test: the data bytes and the message they
// encode. Append of msg must give data exactly; Parse of data must give
// want (msg with private data padded, or msg itself when nil).
type messageCase struct {
	name string
	data []byte
	msg  Message
	want Message
}

// runMessageCases runs the table of one message type through ParseData,
// AppendData, Append/Parse of the whole MAD and Marshal.
func runMessageCases(t *testing.T, attr uint16, cases []messageCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, attr, tc.msg.AttrID())
			require.NoError(t, tc.msg.Validate())
			got := tc.msg.AppendData([]byte{0xEE})
			require.Equal(t, byte(0xEE), got[0], "AppendData must append")
			require.Equal(t, tc.data, got[1:], "AppendData bytes")

			want := tc.want
			if want == nil {
				want = tc.msg
			}
			m, err := ParseData(attr, tc.data)
			require.NoError(t, err)
			require.Equal(t, want, m)

			whole := Append(nil, 0x0102030405060708, tc.msg)
			require.Len(t, whole, MADLen)
			require.Equal(t, tc.data, whole[HeaderLen:])
			h, m, err := Parse(whole)
			require.NoError(t, err)
			require.Equal(t, CMHeader(0x0102030405060708, tc.msg), h)
			require.Equal(t, want, m)

			mb, err := Marshal(0x0102030405060708, tc.msg)
			require.NoError(t, err)
			require.Equal(t, whole, mb)

			// The parsed message owns its bytes.
			saved := bytes.Clone(whole)
			clear(whole)
			_, m2, err := Parse(saved)
			require.NoError(t, err)
			require.Equal(t, m2, m)
		})
	}
}

// checkTruncation: every prefix of a valid data area (and of the whole
// MAD) shorter than the full length is ErrTruncated, never a panic; a
// longer buffer is ErrBadLength.
func checkTruncation(t *testing.T, attr uint16, d []byte) {
	t.Helper()
	require.Len(t, d, DataLen)
	_, err := ParseData(attr, d)
	require.NoError(t, err)
	for n := range DataLen {
		_, err := ParseData(attr, d[:n])
		require.ErrorIs(t, err, ErrTruncated, "data prefix %d", n)
	}
	_, err = ParseData(attr, append(bytes.Clone(d), 0))
	require.ErrorIs(t, err, ErrBadLength)

	whole := append(Header{BaseVersion: 1, MgmtClass: ClassCM, ClassVersion: 2, Method: MethodSend, AttrID: attr}.Append(nil), d...)
	_, _, err = Parse(whole)
	require.NoError(t, err)
	for n := range MADLen {
		_, m, err := Parse(whole[:n])
		require.ErrorIs(t, err, ErrTruncated, "MAD prefix %d", n)
		require.Nil(t, m)
	}
	_, _, err = Parse(append(whole, 0))
	require.ErrorIs(t, err, ErrBadLength)
}

// checkBadField: m is invalid; Validate and Marshal say ErrBadField and
// AppendData/Append panic with it.
func checkBadField(t *testing.T, m Message) {
	t.Helper()
	require.ErrorIs(t, m.Validate(), ErrBadField)
	_, err := Marshal(1, m)
	require.ErrorIs(t, err, ErrBadField)
	require.PanicsWithError(t, m.Validate().Error(), func() { m.AppendData(nil) })
	require.Panics(t, func() { Append(nil, 1, m) })
}

// canonical returns d with every reserved bit, and every byte past a
// length field, cleared: what Append(Parse(d)) must reproduce. The masks
// are IBA's tables, independent of the codec.
func canonical(attr uint16, d []byte) []byte {
	c := bytes.Clone(d)
	zero := func(off int, mask byte) { c[off] &^= mask }
	zeroArea := func(off, n int) { clear(c[off : off+n]) }
	switch attr {
	case AttrREQ:
		zero(4, 0xFF) // reserved byte before the vendor ID
		zeroArea(24, 4)
		for _, p := range []int{52, 96} {
			zero(p+38, 0x0F) // reserved(6) between flow label and packet rate
			zero(p+39, 0xC0)
			zero(p+42, 0x07)
			zero(p+43, 0x07)
		}
		c[139] |= d[139] & 0x04 // SAP supported is not reserved
	case AttrREP:
		zero(27, 0x0F)
	case AttrMRA:
		zero(8, 0x3F)
		zero(9, 0x07)
	case AttrREJ:
		zero(8, 0x3F)
		zero(9, 0x01)
		if n := int(d[9] >> 1); n <= REJARILen {
			zeroArea(12+n, REJARILen-n)
		}
	case AttrDREQ:
		zero(11, 0xFF)
	case AttrSIDRREQ:
		zeroArea(6, 2)
	case AttrSIDRREP:
		if n := int(d[5]); n <= SIDRREPInfoLen {
			zeroArea(24+n, SIDRREPInfoLen-n)
		}
	}
	return c
}

// fuzzData is the body of every per-message fuzz target: ParseData never
// panics; what it accepts is valid, re-encodes to the canonical form of
// the input and parses back to the same message. An input of another
// length is also tried cut or zero-padded to DataLen, so that every input
// reaches the field decoding.
func fuzzData(t *testing.T, attr uint16, d []byte) {
	fuzzDataOnce(t, attr, d)
	if len(d) != DataLen {
		fuzzDataOnce(t, attr, padded(d[:min(len(d), DataLen)], DataLen))
	}
}

func fuzzDataOnce(t *testing.T, attr uint16, d []byte) {
	m, err := ParseData(attr, d)
	if err != nil {
		require.Nil(t, m)
		require.True(t, errors.Is(err, ErrTruncated) || errors.Is(err, ErrBadLength) || errors.Is(err, ErrBadField), "%v", err)
		return
	}
	require.NoError(t, m.Validate())
	b := m.AppendData(nil)
	require.Equal(t, canonical(attr, d), b)
	m2, err := ParseData(attr, b)
	require.NoError(t, err)
	require.Equal(t, m, m2)
}

// fuzzSeeds adds a target's seeds: the valid areas, each also as a
// prefix, and an all-ones area (every reserved bit set).
func fuzzSeeds(f *testing.F, valid ...[]byte) {
	for _, d := range valid {
		f.Add(d)
		f.Add(d[:DataLen/2])
	}
	f.Add(bytes.Repeat([]byte{0xFF}, DataLen))
	f.Add([]byte{})
}
