package transport

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/wire"
)

// TestPcapRecorderWritesTheDFTheICRCVerifiedWith: a peer other than Linux
// or rdma_rxe may send with DF clear, and its ICRC covers that flag. The
// recorder writes the flag (and ID) under which the received packet's
// ICRC verified, so the frame verifies from the pcap with its own header
// (wire.VerifyICRC; rxed decode's check of such a capture is
// internal/decode's TestDecodeVerifiesARecordedDFClearPacket). This test
// stays clear of pkg/wire/wirepcap: importing it registers a gopacket
// decoder for port 4791 that other tests of this package do not expect.
//
// Bug (the pcap recorder, lead's task list): the frame kept DF set
// whatever the verifier found, so the ICRC of a DF-clear sender's packet
// failed in the capture.
func TestPcapRecorderWritesTheDFTheICRCVerifiedWith(t *testing.T) {
	src, dst := ap("10.77.0.12:52001"), ap("10.77.0.11:4791")
	mn := NewMemNetwork()
	a, _ := mn.Listen(src)
	b, _ := mn.Listen(dst)
	var w bytes.Buffer
	rb, err := NewPcapRecorder(b, &w, PcapOptions{})
	require.NoError(t, err)

	// Sealed for a header with DF clear: with ID 0x2f1d, and with ID 0.
	dfClear := func(psn uint32, id uint16) []byte {
		p := rocePacket(psn, 100)
		var hdrs [28]byte
		wire.Flow{Src: src, Dst: dst}.PutHeaders(hdrs[:], len(p))
		binary.BigEndian.PutUint16(hdrs[6:], 0) // no flags
		wire.SetIPv4ID(hdrs[:20], id)
		binary.LittleEndian.PutUint32(p[len(p)-4:], wire.ICRC(hdrs[:20], hdrs[20:], p[:len(p)-4]))
		return p
	}
	sealed := rocePacket(3, 100) // and one as Linux sends it: DF, ID 0
	wire.Flow{Src: src, Dst: dst}.Seal(sealed)
	require.NoError(t, a.Send([][]byte{dfClear(1, 0x2f1d), dfClear(2, 0), sealed}, Endpoint{Remote: dst}))
	receiveN(t, rb, 3, 4096)

	frames := readPcap(t, w.Bytes())
	require.Len(t, frames, 3)
	for i, want := range []struct {
		id uint16
		df bool
	}{{0x2f1d, false}, {0, false}, {0, true}} {
		ip := frames[i].ip4
		require.Equal(t, want.id, ip.Id, "frame %d", i)
		require.Equal(t, want.df, ip.Flags&layers.IPv4DontFragment != 0, "frame %d: DF", i)
		require.Zero(t, wire.IPv4Checksum(ip.Contents), "frame %d: header checksum", i)
		require.Equal(t, wire.ICRCOK, icrcOK(frames[i]), "frame %d", i)
	}
}
