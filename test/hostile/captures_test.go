package hostile

import (
	"sync"
	"testing"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
)

// capPacket is one RoCEv2 packet of a capture: its UDP payload without the
// ICRC (the harness seals it again for its own addresses).
type capPacket struct {
	file    string
	frame   int
	v6      bool
	payload []byte
}

var (
	capMu    sync.Mutex
	capCache = map[string][]capPacket{}
)

// capturePackets reads the well-formed RoCEv2 packets of a capture in
// ../shared/pcaps (testenv.SharedPath: missing, it skips, or fails under
// CI).
func capturePackets(tb testing.TB, name string) []capPacket {
	tb.Helper()
	path := testenv.SharedPath(tb, "pcaps", name)
	capMu.Lock()
	defer capMu.Unlock()
	if p, ok := capCache[name]; ok {
		return p
	}
	frames, err := wirepcap.ReadFile(path)
	must(tb, err)
	var out []capPacket
	for _, f := range frames {
		var rf wirepcap.RoCEFrame
		if wirepcap.DecodeRoCE(f.LinkType, f.Data, &rf) != nil || rf.ParseErr != nil {
			continue
		}
		pl := rf.Payload[:len(rf.Payload)-wire.ICRCLen]
		out = append(out, capPacket{file: name, frame: f.Number, v6: !rf.IPv4, payload: append([]byte(nil), pl...)})
	}
	capCache[name] = out
	return out
}

// captureREQ is the REQ of rdmacm_ucmatose.pcap frame 1 (rdma_cm's
// ucmatose connecting to port 7471) with an empty ICRC slot.
func captureREQ(tb testing.TB) []byte {
	tb.Helper()
	for _, p := range capturePackets(tb, "rdmacm_ucmatose.pcap") {
		if p.frame == 1 {
			return append(append([]byte(nil), p.payload...), 0, 0, 0, 0)
		}
	}
	tb.Fatal("rdmacm_ucmatose.pcap frame 1 is missing")
	return nil
}
