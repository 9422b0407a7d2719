package daemon

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// capturedKey is frame 31 of perftest_write_bw_rc_4096_rdmacm.pcap: the
// client's key (QPN 0x29, PSN 0x357925, rkey 0x1a2c, -x 1).
const capturedKey = "00000000 00000001 00000029 00357925 00001a2c 00000000 00005611 8b381000" +
	"00000000 00000000 0000ffff 0a4d000c 00000000 00000001"

func TestCMKeyCaptured(t *testing.T) {
	b, err := hex.DecodeString(strings.ReplaceAll(capturedKey, " ", ""))
	require.NoError(t, err)
	k, err := ParseCMKey(b)
	require.NoError(t, err)
	gid := netip.MustParseAddr("::ffff:10.77.0.12").As16()
	want := oob.Key{OutReads: 1, QPN: 0x29, PSN: 0x357925, RKey: 0x1a2c, VAddr: 0x56118b381000, GID: gid}
	require.Equal(t, want, k)
	require.Equal(t, b, AppendCMKey(nil, k, 1))
	// The hand shakes around the test connections: all zero.
	require.Equal(t, make([]byte, CMKeyLen), AppendCMKey(nil, oob.Key{}, 0))
}

func TestCMKeyBadInput(t *testing.T) {
	good := AppendCMKey(nil, oob.Key{QPN: 1, SRQN: 0x72786564}, 0)
	for n := range len(good) {
		_, err := ParseCMKey(good[:n])
		require.Error(t, err, "prefix of %d bytes", n)
	}
	_, err := ParseCMKey(append(good, 0))
	require.Error(t, err)
	big := append([]byte(nil), good...)
	big[cmKeyOutReads] = 1 // 2^24 outstanding reads
	_, err = ParseCMKey(big)
	require.Error(t, err)
	k, err := ParseCMKey(good)
	require.NoError(t, err)
	require.Equal(t, uint32(0x72786564), k.SRQN)
}

// FuzzParseCMKey: what ParseCMKey accepts re-encodes (with the GID index
// it carried) to the input's canonical form, byte for byte: the padding
// perftest leaves as stack garbage (bytes 20-23) zero and QPN and PSN cut
// to their 24 bits, as rdma_read_keys reads them; nothing else of the
// message may be dropped or changed.
func FuzzParseCMKey(f *testing.F) {
	f.Add(AppendCMKey(nil, oob.Key{QPN: 7, PSN: 9, RKey: 3, VAddr: 1 << 40}, 2))
	f.Add(AppendCMKey(nil, oob.Key{LID: 1, OutReads: 16, QPN: 0xffffff, PSN: 0xabcdef, RKey: 0xfedcba98,
		VAddr: 0x0102030405060708, GID: [16]byte{15: 1}, SRQN: 0x72786564}, -1))
	if b, err := hex.DecodeString(strings.ReplaceAll(capturedKey, " ", "")); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseCMKey(b)
		if err != nil {
			return
		}
		gidIndex := int(int32(binary.BigEndian.Uint32(b[cmKeyGIDIndex:])))
		want := bytes.Clone(b)
		clear(want[20:24])
		want[cmKeyQPN], want[cmKeyPSN] = 0, 0
		require.Equal(t, want, AppendCMKey(nil, k, gidIndex))
		k2, err := ParseCMKey(want)
		require.NoError(t, err)
		require.Equal(t, k, k2)
	})
}
