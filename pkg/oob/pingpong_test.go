package oob

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The client message of rc_pingpong_send_4096.pcap (OOB.md).
const ppSample = "0000:000014:61ae09:00000000000000000000ffff0a4d000c\x00"

func TestPingpongDestTable(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want PingpongDest
	}{
		{"rc ipv4 gid", ppSample, PingpongDest{QPN: 0x14, PSN: 0x61ae09,
			GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 77, 14: 0, 15: 12}}},
		{"ipv6 gid", "0000:00002c:cb6620:fd770000000000000000000000000012\x00",
			PingpongDest{QPN: 0x2c, PSN: 0xcb6620, GID: [16]byte{0: 0xfd, 1: 0x77, 15: 0x12}}},
		{"all ones", "ffff:ffffff:ffffff:ffffffffffffffffffffffffffffffff\x00",
			PingpongDest{LID: 0xffff, QPN: 0xffffff, PSN: 0xffffff, GID: [16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}},
		{"zero", "0000:000000:000000:00000000000000000000000000000000\x00", PingpongDest{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePingpongDest([]byte(tc.msg))
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			enc, err := got.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, tc.msg, string(enc))
			var back PingpongDest
			require.NoError(t, back.UnmarshalBinary(enc))
			require.Equal(t, got, back)
		})
	}
}

func TestPingpongDestUpperCaseAccepted(t *testing.T) {
	got, err := ParsePingpongDest([]byte(strings.ToUpper(ppSample[:51]) + "\x00"))
	require.NoError(t, err)
	want, _ := ParsePingpongDest([]byte(ppSample))
	require.Equal(t, want, got)
}

func TestPingpongDestBadInput(t *testing.T) {
	mod := func(i int, c byte) string {
		b := []byte(ppSample)
		b[i] = c
		return string(b)
	}
	bad := map[string]string{
		"no NUL":           mod(51, 'x'),
		"colon missing":    mod(4, '-'),
		"second colon":     mod(11, '0'),
		"third colon":      mod(18, 0),
		"LID not hex":      mod(0, 'g'),
		"QPN not hex":      mod(6, ' '),
		"PSN not hex":      mod(13, 'z'),
		"GID not hex":      mod(30, ':'),
		"GID last digit":   mod(50, 0),
		"too long":         ppSample + "x",
		"perftest key":     strings.Repeat("0", 107) + "\x00",
		"empty":            "",
		"printf overflow":  "0000:1000000:61ae09:00000000000000000000ffff0a4d000\x00",
		"garbage":          strings.Repeat("\xff", PingpongMsgLen),
		"sscanf-ok spaces": " 000:000014:61ae09:00000000000000000000ffff0a4d000c\x00",
	}
	for name, msg := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := ParsePingpongDest([]byte(msg))
			require.Error(t, err)
		})
	}
}

func TestPingpongDestTruncated(t *testing.T) {
	for n := 0; n < PingpongMsgLen; n++ {
		_, err := ParsePingpongDest([]byte(ppSample[:n]))
		require.Error(t, err, "prefix %d", n)
	}
}

func TestPingpongDestEncodeRejects(t *testing.T) {
	_, err := PingpongDest{QPN: 1 << 24}.MarshalBinary()
	require.ErrorIs(t, err, errField24)
	_, err = PingpongDest{PSN: 1 << 24}.MarshalBinary()
	require.ErrorIs(t, err, errField24)
	require.Error(t, PingpongDest{}.Encode(make([]byte, PingpongMsgLen-1)))
}

func FuzzParsePingpongDest(f *testing.F) {
	f.Add([]byte(ppSample))
	f.Add([]byte("0000:00002c:cb6620:fd770000000000000000000000000012\x00"))
	f.Add([]byte(strings.ToUpper(ppSample)))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParsePingpongDest(b)
		if err != nil {
			return
		}
		enc, err := d.MarshalBinary()
		if err != nil {
			t.Fatalf("parsed %q but cannot encode: %v", b, err)
		}
		if !bytes.Equal(enc, bytes.ToLower(b)) {
			t.Fatalf("round trip %q -> %q", b, enc)
		}
	})
}

func BenchmarkPingpongDestEncodeParse(b *testing.B) {
	d, _ := ParsePingpongDest([]byte(ppSample))
	var buf [PingpongMsgLen]byte
	b.ReportAllocs()
	b.SetBytes(PingpongMsgLen)
	for b.Loop() {
		_ = d.Encode(buf[:])
		if _, err := ParsePingpongDest(buf[:]); err != nil {
			b.Fatal(err)
		}
	}
}
