package decode

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// capturePort records, with rxed's own pcap recorder (ib.Config.Pcap),
// an RC SEND between two devices whose engines use UDP port port, and
// returns the capture of the sending side.
func capturePort(t *testing.T, port uint16) []byte {
	t.Helper()
	net := transport.NewMemNetwork()
	var capture bytes.Buffer
	open := func(addr string, pcap *bytes.Buffer) (*ib.Device, *ib.PD, *ib.CQ, *ib.MR, netip.Addr) {
		a := netip.MustParseAddr(addr)
		conn, err := net.Listen(netip.AddrPortFrom(a, port))
		require.NoError(t, err)
		cfg := ib.Config{Conn: conn, Workers: 1}
		if pcap != nil {
			cfg.Pcap = pcap
		}
		dev, err := ib.OpenDevice(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { dev.Close() })
		pd, err := dev.AllocPD()
		require.NoError(t, err)
		cq, err := dev.CreateCQ(8)
		require.NoError(t, err)
		mr, err := pd.RegMR(make([]byte, 4096), ib.AccessLocalWrite)
		require.NoError(t, err)
		return dev, pd, cq, mr, a
	}
	devA, pdA, cqA, _, addrA := open("10.20.0.1", &capture)
	devB, pdB, cqB, mrB, addrB := open("10.20.0.2", nil)
	mk := func(pd *ib.PD, cq *ib.CQ) *ib.QP {
		q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
			Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
		require.NoError(t, err)
		return q
	}
	qa, qb := mk(pdA, cqA), mk(pdB, cqB)
	attr := ib.ConnectAttr{SGIDIndex: -1, PSN: 7, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1}
	require.NoError(t, ib.ConnectQP(qa, ib.RemoteQP{QPN: qb.Num(), PSN: 7, GID: addrB, UDPPort: devB.UDPPort(), MTU: ib.MTU1024}, attr))
	require.NoError(t, ib.ConnectQP(qb, ib.RemoteQP{QPN: qa.Num(), PSN: 7, GID: addrA, UDPPort: devA.UDPPort(), MTU: ib.MTU1024}, attr))
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{{Addr: mrB.IOVA(), Length: 64, LKey: mrB.LKey()}}}))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline, Inline: []byte("hi")}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wc [1]ib.WC
	_, err := cqA.WaitPoll(ctx, wc[:]) // the ACK came back: both packets are in the capture
	require.NoError(t, err)
	require.Equal(t, ib.WCSuccess.String(), wc[0].Status.String())
	require.NoError(t, devA.Close())
	return capture.Bytes()
}

func writeTemp(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.pcap")
	require.NoError(t, os.WriteFile(p, data, 0o600))
	return p
}

// rxed's own capture of engines on port 4792 decodes without a flag:
// the port is learned from the frames, whose ICRCs verify. (issue 15:
// every frame was reported as skipped.)
func TestDecodeOwnCaptureOnOtherPort(t *testing.T) {
	file := writeTemp(t, capturePort(t, 4792))
	code, out, errOut := runDecode(t, file)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "skipped", out)
	require.Contains(t, out, "10.20.0.1:4792 -> 10.20.0.2:4792 RC_SEND_ONLY")
	require.Contains(t, out, "10.20.0.2:4792 -> 10.20.0.1:4792 RC_ACKNOWLEDGE")
	require.NotContains(t, out, "icrc=bad")
}

// --port decodes frames to a port even when no frame proves it (here the
// only frame's ICRC is damaged): without the flag the frame is skipped,
// with a hint naming the flag; with it, it is RoCEv2 with a bad ICRC.
func TestDecodePortFlag(t *testing.T) {
	capture := capturePort(t, 4793)
	r, err := wirepcap.NewReader(bytes.NewReader(capture))
	require.NoError(t, err)
	first, err := r.Next()
	require.NoError(t, err)
	// Keep the first frame (the SEND), with its ICRC's last byte flipped.
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	require.NoError(t, w.WriteFileHeader(65535, layers.LinkTypeEthernet))
	data := append([]byte(nil), first.Data...)
	data[len(data)-1] ^= 0xff
	require.NoError(t, w.WritePacket(gopacket.CaptureInfo{Timestamp: first.Time, CaptureLength: len(data), Length: len(data)}, data))
	file := writeTemp(t, buf.Bytes())

	code, out, _ := runDecode(t, file)
	require.Equal(t, 0, code)
	require.Contains(t, out, "skipped (not RoCEv2: UDP 10.20.0.1:4793 -> 10.20.0.2:4793 (--port 4793 decodes it as RoCEv2))")

	code, out, errOut := runDecode(t, "--port", "4793", "--port", "9999", file)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "RC_SEND_ONLY")
	require.Contains(t, out, "icrc=bad")
	code, out, _ = runDecode(t, "-json", "--port=4793", file)
	require.Equal(t, 0, code)
	m := jsonLines(t, out)
	require.Len(t, m, 1)
	require.NotEqual(t, true, m[0]["skipped"])
	require.Equal(t, "4793", m[0]["dport"].(json.Number).String())
}

// A UDP frame to another port that is not RoCE stays skipped: learning
// needs a BTH that parses and an ICRC that verifies.
func TestDecodeOtherUDPNotLearned(t *testing.T) {
	var p roceports
	p.known = map[uint16]bool{}
	frame := udpFrame(t, 5353, []byte(strings.Repeat("\x00", 40)))
	var rf wirepcap.RoCEFrame
	require.ErrorIs(t, p.decode(layers.LinkTypeEthernet, frame, &rf), wirepcap.ErrNotRoCE)
	require.False(t, p.known[5353])
}

// TestDecodePortFlagBadValues: --port takes 1..65535; anything else is
// a usage error (exit status 2).
func TestDecodePortFlagBadValues(t *testing.T) {
	for _, v := range []string{"0", "65536", "-1", "x", ""} {
		code, _, errOut := runDecode(t, "--port", v, "x.pcap")
		require.Equal(t, 2, code, "--port %q", v)
		require.Contains(t, errOut, "want a UDP port", "--port %q", v)
	}
}

// udpFrame builds an Ethernet/IPv4/UDP frame to dport carrying payload.
func udpFrame(t *testing.T, dport uint16, payload []byte) []byte {
	t.Helper()
	f := make([]byte, 14+20+8+len(payload))
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	ip[8], ip[9] = 64, 17
	copy(ip[12:], []byte{10, 0, 0, 1})
	copy(ip[16:], []byte{10, 0, 0, 2})
	u := ip[20:]
	binary.BigEndian.PutUint16(u[0:], 40000)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	copy(u[8:], payload)
	return f
}
