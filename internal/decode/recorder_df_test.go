package decode

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// TestDecodeVerifiesARecordedDFClearPacket: a RoCEv2 packet whose ICRC
// its sender computed with the IPv4 DF flag clear (not Linux, not rxe),
// received through the pcap recorder, decodes from the capture with
// icrc=ok and no defect: the recorder writes the DF flag and ID the ICRC
// verified with (transport's TestPcapRecorderWritesTheDFTheICRCVerifiedWith
// checks the frame itself). tshark 4.0 shows the ICRC but does not check
// it, so it is no oracle here.
//
// Bug (the pcap recorder, lead's task list): the frame had DF set, and
// rxed decode reported the packet's ICRC bad.
func TestDecodeVerifiesARecordedDFClearPacket(t *testing.T) {
	src, dst := netip.MustParseAddrPort("10.77.0.12:52001"), netip.MustParseAddrPort("10.77.0.11:4791")
	mn := transport.NewMemNetwork()
	a, err := mn.Listen(src)
	require.NoError(t, err)
	defer a.Close()
	b, err := mn.Listen(dst)
	require.NoError(t, err)
	var w bytes.Buffer
	rec, err := transport.NewPcapRecorder(b, &w, transport.PcapOptions{})
	require.NoError(t, err)
	defer rec.Close()

	// An RC SEND_ONLY of 100 bytes sealed for ID 0x2f1d, no flags.
	p := make([]byte, wire.BTHLen+100+wire.ICRCLen)
	p[0] = byte(wire.RCSendOnly)
	binary.BigEndian.PutUint16(p[2:], 0xffff)
	binary.BigEndian.PutUint32(p[4:], 0x11)
	binary.BigEndian.PutUint32(p[8:], 0x80000007)
	var hdrs [28]byte
	wire.Flow{Src: src, Dst: dst}.PutHeaders(hdrs[:], len(p))
	binary.BigEndian.PutUint16(hdrs[6:], 0)
	wire.SetIPv4ID(hdrs[:20], 0x2f1d)
	binary.LittleEndian.PutUint32(p[len(p)-4:], wire.ICRC(hdrs[:20], hdrs[20:], p[:len(p)-4]))
	require.NoError(t, a.Send([][]byte{p}, transport.Endpoint{Remote: dst}))
	bufs, sizes, eps := [][]byte{make([]byte, 4096)}, []int{0}, []transport.Endpoint{{}}
	n, err := rec.Receive(bufs, sizes, eps)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	file := filepath.Join(t.TempDir(), "dfclear.pcap")
	require.NoError(t, os.WriteFile(file, w.Bytes(), 0o644))
	code, out, errOut := runDecode(t, file)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, 1, strings.Count(out, "icrc=ok"), out)
	st, err := DecodeFile(file, Options{}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, Stats{Frames: 1, RoCE: 1}, st)
}
