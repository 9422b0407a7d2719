package oob

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The client key of perftest_write_bw_rc_4096.pcap (OOB.md).
const keySample = "0000:0001:00001b:aca162:00000c08:000055ef4ebd2000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:\x00"

// The read test key of perftest_read_bw_rc_4096.pcap.
const keyReadSample = "0000:0080:00001e:f01b23:00000f8d:00005584318b0000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:\x00"

func TestKeyTable(t *testing.T) {
	v4 := [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 77, 15: 12}
	tests := []struct {
		name string
		msg  string
		want Key
	}{
		{"write", keySample, Key{OutReads: 1, QPN: 0x1b, PSN: 0xaca162, RKey: 0xc08, VAddr: 0x55ef4ebd2000, GID: v4}},
		{"read", keyReadSample, Key{OutReads: 0x80, QPN: 0x1e, PSN: 0xf01b23, RKey: 0xf8d, VAddr: 0x5584318b0000, GID: v4}},
		{"max", "ffff:ffff:ffffff:ffffff:ffffffff:ffffffffffffffff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ffffffff:\x00",
			Key{LID: 0xffff, OutReads: 0xffff, QPN: 0xffffff, PSN: 0xffffff, RKey: 0xffffffff, VAddr: math.MaxUint64,
				GID: [16]byte{255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255}, SRQN: 0xffffffff}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Len(t, tc.msg, KeyMsgLen)
			got, err := ParseKey([]byte(tc.msg))
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			enc, err := got.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, tc.msg, string(enc))
			var back Key
			require.NoError(t, back.UnmarshalBinary(enc))
			require.Equal(t, got, back)
		})
	}
}

func TestKeyBadInput(t *testing.T) {
	for _, off := range keyColons {
		b := []byte(keySample)
		b[off] = '0'
		_, err := ParseKey(b)
		require.Error(t, err, "colon at %d", off)
	}
	for i := 0; i < KeyMsgLen-1; i++ {
		if keySample[i] == ':' {
			continue
		}
		b := []byte(keySample)
		b[i] = 'x'
		_, err := ParseKey(b)
		require.Error(t, err, "non-hex at %d", i)
	}
	b := []byte(keySample)
	b[KeyMsgLen-1] = ':'
	_, err := ParseKey(b)
	require.Error(t, err)
	for n := 0; n < KeyMsgLen; n++ {
		_, err := ParseKey([]byte(keySample[:n]))
		require.Error(t, err, "prefix %d", n)
	}
	_, err = ParseKey([]byte(keySample + "\x00"))
	require.Error(t, err)
	_, err = Key{QPN: 1 << 24}.MarshalBinary()
	require.ErrorIs(t, err, errField24)
	_, err = Key{PSN: 1 << 24}.MarshalBinary()
	require.ErrorIs(t, err, errField24)
	require.Error(t, Key{}.Encode(make([]byte, KeyMsgLen-1)))
}

func TestVersionMessages(t *testing.T) {
	var b [VersionMsgLen]byte
	require.NoError(t, EncodeVersion(b[:], "6.06"))
	require.Equal(t, []byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), b[:])
	v, err := ParseVersion(b[:])
	require.NoError(t, err)
	require.Equal(t, "6.06", v)
	require.Error(t, EncodeVersion(b[:], strings.Repeat("9", 16)))
	require.Error(t, EncodeVersion(b[:5], "6.06"))
	_, err = ParseVersion(b[:15])
	require.Error(t, err)
	full := strings.Repeat("7", 16)
	v, err = ParseVersion([]byte(full))
	require.NoError(t, err)
	require.Equal(t, full, v)

	for in, want := range map[string]float64{
		"6.06": 6.06, "5.70": 5.70, "5.60": 5.60, "": 0, "abc": 0, "  5.5x": 5.5, "6": 6, ".5": 0.5,
		"5.33.1": 5.33, "1e1": 10, "1e": 1, "-2": -2, "+3.5": 3.5, ".": 0,
	} {
		require.Equal(t, want, VersionNumber(in), "%q", in)
	}
	require.Equal(t, 8, ReportItersLen(6.06))
	require.Equal(t, 8, ReportItersLen(5.34))
	require.Equal(t, 4, ReportItersLen(5.32))
	// perftest compares in float: "5.33" is below 5.33 there.
	require.Equal(t, 4, ReportItersLen(5.33))
}

func TestMTUMessages(t *testing.T) {
	var b [MTUMsgLen]byte
	require.NoError(t, EncodeMTU(b[:], 3))
	require.Equal(t, []byte("3\x00"), b[:])
	m, ok := ParseMTU(b[:])
	require.True(t, ok)
	require.Equal(t, 3, m)
	_, ok = ParseMTU([]byte("9\x00"))
	require.False(t, ok)
	_, ok = ParseMTU([]byte("\x00\x00"))
	require.False(t, ok)
	_, ok = ParseMTU([]byte("x3"))
	require.False(t, ok)
	// 2^64 + 3: the digits wrapped an int into 3 (fuzz audit, session AG).
	_, ok = ParseMTU([]byte("18446744073709551619"))
	require.False(t, ok)
	require.Error(t, EncodeMTU(b[:1], 3))
	for e, n := range map[int]int{1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096} {
		require.Equal(t, n, MTUBytes(e))
		require.Equal(t, e, MTUEnum(n))
	}
	require.Zero(t, MTUBytes(0))
	require.Zero(t, MTUBytes(6))
	require.Zero(t, MTUEnum(1500))
}

func TestBWReportCodec(t *testing.T) {
	r := BWReport{Size: 4096, Iters: 10, BWPeak: 4.7272, BWAvg: 4.7184, MsgRateAvg: 0.0012079,
		BWAvgP1: 1, MsgRateAvgP1: 2, BWAvgP2: 3, MsgRateAvgP2: 4}
	for _, itersLen := range []int{4, 8} {
		for _, perPort := range []bool{false, true} {
			b := AppendBWReport(nil, r, itersLen, perPort)
			require.Len(t, b, BWReportLen(itersLen, perPort))
			got, err := ParseBWReport(b, itersLen, perPort)
			require.NoError(t, err)
			want := r
			if !perPort {
				want.BWAvgP1, want.MsgRateAvgP1, want.BWAvgP2, want.MsgRateAvgP2 = 0, 0, 0, 0
			}
			require.Equal(t, want, got)
			for n := 0; n < len(b); n++ {
				_, err := ParseBWReport(b[:n], itersLen, perPort)
				require.Error(t, err)
			}
		}
	}
	// The exact bytes of the capture (OOB.md).
	b := AppendBWReport(nil, BWReport{Size: 4096, Iters: 10, BWPeak: math.Float64frombits(0x4012e8a756168b7a),
		BWAvg: math.Float64frombits(0x4012dfa70596b991), MsgRateAvg: math.Float64frombits(0x3f53ca5ad2b16991)}, 8, false)
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a,
		0x40, 0x12, 0xe8, 0xa7, 0x56, 0x16, 0x8b, 0x7a, 0x40, 0x12, 0xdf, 0xa7, 0x05, 0x96, 0xb9, 0x91,
		0x3f, 0x53, 0xca, 0x5a, 0xd2, 0xb1, 0x69, 0x91}, b)
	_, err := ParseBWReport(b, 5, false)
	require.Error(t, err)
}

func FuzzParseKey(f *testing.F) {
	f.Add([]byte(keySample))
	f.Add([]byte(keyReadSample))
	f.Add([]byte(strings.ToUpper(keySample)))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseKey(b)
		if err != nil {
			return
		}
		enc, err := k.MarshalBinary()
		if err != nil {
			t.Fatalf("parsed %q but cannot encode: %v", b, err)
		}
		if !bytes.Equal(enc, bytes.ToLower(b)) {
			t.Fatalf("round trip %q -> %q", b, enc)
		}
	})
}

func FuzzParseBWReport(f *testing.F) {
	f.Add(AppendBWReport(nil, BWReport{Size: 1, Iters: 2, BWPeak: 3}, 8, false), false)
	f.Add(AppendBWReport(nil, BWReport{Size: 1, Iters: 2, BWPeak: 3}, 8, true), true)
	f.Fuzz(func(t *testing.T, b []byte, perPort bool) {
		r, err := ParseBWReport(b, 8, perPort)
		if err != nil {
			return
		}
		if enc := AppendBWReport(nil, r, 8, perPort); !bytes.Equal(enc, b) {
			t.Fatalf("round trip %x -> %x", b, enc)
		}
	})
}

func FuzzVersionNumber(f *testing.F) {
	for _, s := range []string{"6.06", "5.60", "", "1e400", "-.5e-3x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_ = VersionNumber(s) // must not panic
		var b [VersionMsgLen]byte
		if len(s) < VersionMsgLen && !strings.ContainsRune(s, 0) {
			if err := EncodeVersion(b[:], s); err != nil {
				t.Fatal(err)
			}
			got, err := ParseVersion(b[:])
			if err != nil || got != s {
				t.Fatalf("version %q -> %q, %v", s, got, err)
			}
		}
	})
}

func BenchmarkKeyEncodeParse(b *testing.B) {
	k, _ := ParseKey([]byte(keySample))
	var buf [KeyMsgLen]byte
	b.ReportAllocs()
	b.SetBytes(KeyMsgLen)
	for b.Loop() {
		_ = k.Encode(buf[:])
		if _, err := ParseKey(buf[:]); err != nil {
			b.Fatal(err)
		}
	}
}
