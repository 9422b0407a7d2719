package wirepcap_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// roceIPv4 builds an IPv4/UDP datagram carrying a sealed RoCE packet with
// the header Flow.Seal assumes.
func roceIPv4(t testing.TB) []byte {
	f := wire.Flow{Src: netip.MustParseAddrPort("10.0.0.1:49152"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")}
	h := wire.Headers{Opcode: wire.RCSendOnly, PKey: 0xffff, DestQP: 0x11, PSN: 1}
	pl := make([]byte, h.Len(8))
	_, err := h.Encode(pl, []byte("12345678"))
	require.NoError(t, err)
	f.Seal(pl)
	ip := make([]byte, 28, 28+len(pl))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(28+len(pl)))
	ip[6] = 0x40
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	binary.BigEndian.PutUint16(ip[20:], 49152)
	binary.BigEndian.PutUint16(ip[22:], 4791)
	binary.BigEndian.PutUint16(ip[24:], uint16(8+len(pl)))
	return append(ip, pl...)
}

func TestDissectUDP(t *testing.T) {
	ipPkt := roceIPv4(t)
	eth := append([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x08, 0x00}, ipPkt...)
	vlan := append([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x81, 0x00, 0x60, 0x64, 0x08, 0x00}, ipPkt...)
	sll := append(make([]byte, 14), 0x08, 0x00)
	sll = append(sll, ipPkt...)
	padded := append(append([]byte(nil), eth...), 0, 0, 0, 0, 0, 0)
	for _, tc := range []struct {
		name string
		lt   layers.LinkType
		data []byte
		l3   int
		vlan []uint16
	}{
		{"ethernet", layers.LinkTypeEthernet, eth, 14, nil},
		{"802.1Q", layers.LinkTypeEthernet, vlan, 18, []uint16{100}},
		{"ethernet padding", layers.LinkTypeEthernet, padded, 14, nil},
		{"raw", layers.LinkTypeRaw, ipPkt, 0, nil},
		{"ipv4 link type", layers.LinkType(228), ipPkt, 0, nil},
		{"linux sll", layers.LinkTypeLinuxSLL, sll, 16, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var uf wirepcap.UDPFrame
			require.NoError(t, wirepcap.DissectUDP(tc.lt, tc.data, &uf))
			require.Equal(t, tc.l3, uf.L3Offset)
			require.Equal(t, ipPkt[28:], uf.Payload)
			require.Equal(t, tc.vlan, append([]uint16(nil), uf.VLAN...))
			require.True(t, uf.IPv4)
			require.True(t, uf.IsRoCE())
			require.False(t, uf.Truncated)
			require.Equal(t, "10.0.0.1:49152", uf.Src.String())
			require.Equal(t, wire.ICRCOK, wire.VerifyICRC(uf.IP, uf.UDP, uf.Payload))
			// Every prefix either dissects (marked truncated once the UDP
			// payload is cut) or fails with a dissection error.
			for cut := 0; cut < len(tc.data); cut++ {
				b := append(make([]byte, 0, cut), tc.data[:cut]...)
				err := wirepcap.DissectUDP(tc.lt, b, &uf)
				if err == nil {
					require.True(t, uf.Truncated || cut >= len(tc.data)-6, "cut %d", cut)
					continue
				}
				require.True(t, errors.Is(err, wirepcap.ErrTruncatedFrame) || errors.Is(err, wirepcap.ErrNotUDP), "cut %d: %v", cut, err)
			}
		})
	}
	var uf wirepcap.UDPFrame
	tcp := append([]byte(nil), eth...)
	tcp[14+9] = 6
	require.ErrorIs(t, wirepcap.DissectUDP(layers.LinkTypeEthernet, tcp, &uf), wirepcap.ErrNotUDP)
	arp := append([]byte(nil), eth...)
	arp[12], arp[13] = 0x08, 0x06
	require.ErrorIs(t, wirepcap.DissectUDP(layers.LinkTypeEthernet, arp, &uf), wirepcap.ErrNotUDP)
	require.ErrorIs(t, wirepcap.DissectUDP(layers.LinkType(147), eth, &uf), wirepcap.ErrLinkType)
	frag := append([]byte(nil), eth...)
	frag[14+6] = 0x20 // MF
	require.ErrorIs(t, wirepcap.DissectUDP(layers.LinkTypeEthernet, frag, &uf), wirepcap.ErrNotUDP)
	var rf wirepcap.RoCEFrame
	other := append([]byte(nil), eth...)
	other[14+22], other[14+23] = 0, 53
	require.ErrorIs(t, wirepcap.DecodeRoCE(layers.LinkTypeEthernet, other, &rf), wirepcap.ErrNotRoCE)
}

func TestReaderFormats(t *testing.T) {
	ipPkt := roceIPv4(t)
	ts := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)

	// pcapng with a raw-IP interface.
	var ng bytes.Buffer
	w, err := pcapgo.NewNgWriter(&ng, layers.LinkTypeRaw)
	require.NoError(t, err)
	require.NoError(t, w.WritePacket(gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(ipPkt), Length: len(ipPkt)}, ipPkt))
	require.NoError(t, w.Flush())
	r, err := wirepcap.NewReader(bytes.NewReader(ng.Bytes()))
	require.NoError(t, err)
	fr, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, 1, fr.Number)
	require.Equal(t, layers.LinkTypeRaw, fr.LinkType)
	require.Equal(t, ipPkt, fr.Data)
	require.True(t, ts.Equal(fr.Time))
	_, err = r.Next()
	require.Equal(t, io.EOF, err)

	// Classic pcap, then the same file cut in the middle of the record.
	var pc bytes.Buffer
	pw := pcapgo.NewWriter(&pc)
	require.NoError(t, pw.WriteFileHeader(65535, layers.LinkTypeRaw))
	require.NoError(t, pw.WritePacket(gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(ipPkt), Length: len(ipPkt)}, ipPkt))
	dir := t.TempDir()
	full := filepath.Join(dir, "full.pcap")
	require.NoError(t, os.WriteFile(full, pc.Bytes(), 0o600))
	frames, err := wirepcap.ReadFile(full)
	require.NoError(t, err)
	require.Len(t, frames, 1)
	cut := filepath.Join(dir, "cut.pcap")
	require.NoError(t, os.WriteFile(cut, pc.Bytes()[:pc.Len()-5], 0o600))
	_, err = wirepcap.ReadFile(cut)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)

	junk := filepath.Join(dir, "junk.pcap")
	require.NoError(t, os.WriteFile(junk, []byte("this is not a capture file"), 0o600))
	_, err = wirepcap.ReadFile(junk)
	require.ErrorIs(t, err, wirepcap.ErrFormat)
	empty := filepath.Join(dir, "empty.pcap")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, err = wirepcap.ReadFile(empty)
	require.ErrorIs(t, err, wirepcap.ErrFormat)
	_, err = wirepcap.ReadFile(filepath.Join(dir, "missing.pcap"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestRecordCutAfterItsHeaderIsUnexpectedEOF cuts a two-frame capture at
// every byte after the file header: a cut at a record boundary is a clean
// end after the frames before it, any other cut is io.ErrUnexpectedEOF, in
// pcap and in pcapng.
//
// Bug (found by the tools audit, session AF): a classic pcap cut right
// after a record's 16-byte header read as a clean end of file, so `rxed
// decode` exited 0 and the frame was silently left out; pcapgo's
// io.ReadFull of the record's data returns io.EOF, not
// io.ErrUnexpectedEOF, when none of it is there (pcapng was right).
func TestRecordCutAfterItsHeaderIsUnexpectedEOF(t *testing.T) {
	ipPkt := roceIPv4(t)
	ci := gopacket.CaptureInfo{Timestamp: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), CaptureLength: len(ipPkt), Length: len(ipPkt)}
	var pc bytes.Buffer
	pw := pcapgo.NewWriter(&pc)
	require.NoError(t, pw.WriteFileHeader(65535, layers.LinkTypeRaw))
	pcapHeader := pc.Len()
	require.NoError(t, pw.WritePacket(ci, ipPkt))
	pcapFirst := pc.Len()
	require.NoError(t, pw.WritePacket(ci, ipPkt))

	var ng bytes.Buffer
	nw, err := pcapgo.NewNgWriter(&ng, layers.LinkTypeRaw)
	require.NoError(t, err)
	require.NoError(t, nw.Flush())
	ngHeader := ng.Len()
	require.NoError(t, nw.WritePacket(ci, ipPkt))
	require.NoError(t, nw.Flush())
	ngFirst := ng.Len()
	require.NoError(t, nw.WritePacket(ci, ipPkt))
	require.NoError(t, nw.Flush())

	for _, c := range []struct {
		name                 string
		file                 []byte
		header, first, whole int
	}{
		{"pcap", pc.Bytes(), pcapHeader, pcapFirst, pc.Len()},
		{"pcapng", ng.Bytes(), ngHeader, ngFirst, ng.Len()},
	} {
		for n := c.header; n <= c.whole; n++ {
			r, err := wirepcap.NewReader(bytes.NewReader(c.file[:n]))
			require.NoError(t, err)
			frames := 0
			for {
				_, err = r.Next()
				if err != nil {
					break
				}
				frames++
			}
			switch n {
			case c.header, c.first, c.whole:
				require.Equalf(t, io.EOF, err, "%s cut at %d of %d bytes", c.name, n, c.whole)
			default:
				require.ErrorIsf(t, err, io.ErrUnexpectedEOF, "%s cut at %d of %d bytes (after %d frames)", c.name, n, c.whole, frames)
			}
		}
	}
}
