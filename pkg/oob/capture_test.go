package oob

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sort"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxed/rxed/internal/testenv"
)

// sharedDir locates ../shared beside the repository root, requiring its
// captures; see testenv.
func sharedDir(t testing.TB) string {
	t.Helper()
	testenv.SharedPath(t, "pcaps")
	return testenv.SharedDir(t)
}

// tcpStreams is the TCP byte stream of one connection, per direction,
// reassembled by sequence number, with the segment boundaries the capture
// shows.
type tcpStreams struct {
	ClientToServer, ServerToClient []byte
	C2SSegments, S2CSegments       []int // payload sizes in stream order
	SawFIN                         bool
	// Events are the payload segments of both directions in capture order
	// (for replaying one side against an implementation of the other).
	Events []tcpEvent
}

// tcpEvent is one segment's payload in capture order.
type tcpEvent struct {
	FromClient bool
	Data       []byte
}

type segment struct {
	seq  uint32
	data []byte
}

// readOOBStreams reassembles the single TCP connection on port 18515 of a
// capture. The client is the side that sent the SYN.
func readOOBStreams(t testing.TB, path string) tcpStreams {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var (
		clientPort     layers.TCPPort
		c2sISN, s2cISN uint32
		haveC, haveS   bool
		c2s, s2c       []segment
		sawFIN         bool
		order          []orderedSeg
	)
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		pkt := gopacket.NewPacket(data, r.LinkType(), gopacket.NoCopy)
		tl, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if !ok || (tl.SrcPort != 18515 && tl.DstPort != 18515) {
			continue
		}
		toServer := tl.DstPort == 18515
		if tl.SYN {
			if toServer {
				clientPort, c2sISN, haveC = tl.SrcPort, tl.Seq+1, true
			} else {
				s2cISN, haveS = tl.Seq+1, true
			}
			continue
		}
		if tl.FIN {
			sawFIN = true
		}
		if len(tl.Payload) == 0 {
			continue
		}
		seg := segment{seq: tl.Seq, data: append([]byte(nil), tl.Payload...)}
		order = append(order, orderedSeg{toServer, seg})
		if toServer {
			if tl.SrcPort != clientPort {
				t.Fatalf("%s: second client port %d", path, tl.SrcPort)
			}
			c2s = append(c2s, seg)
		} else {
			s2c = append(s2c, seg)
		}
	}
	if !haveC || !haveS {
		t.Fatalf("%s: no TCP handshake on port 18515", path)
	}
	var out tcpStreams
	out.ClientToServer, out.C2SSegments = assemble(t, c2s, c2sISN)
	out.ServerToClient, out.S2CSegments = assemble(t, s2c, s2cISN)
	out.SawFIN = sawFIN
	// Events: capture order, retransmissions dropped (the reassembled
	// streams are the reference; each event must continue its stream).
	var off [2]int
	for _, o := range order {
		dir, isn, stream := 1, s2cISN, out.ServerToClient
		if o.toServer {
			dir, isn, stream = 0, c2sISN, out.ClientToServer
		}
		start := int(o.seg.seq - isn)
		end := start + len(o.seg.data)
		if end <= off[dir] {
			continue
		}
		if start > off[dir] {
			t.Fatalf("%s: segment at %d beyond stream offset %d", path, start, off[dir])
		}
		out.Events = append(out.Events, tcpEvent{FromClient: o.toServer, Data: stream[off[dir]:end]})
		off[dir] = end
	}
	return out
}

type orderedSeg struct {
	toServer bool
	seg      segment
}

// assemble orders segments by relative sequence number, drops exact
// retransmissions and fails on gaps.
func assemble(t testing.TB, segs []segment, isn uint32) ([]byte, []int) {
	t.Helper()
	sort.SliceStable(segs, func(i, j int) bool { return segs[i].seq-isn < segs[j].seq-isn })
	var buf bytes.Buffer
	var sizes []int
	for _, s := range segs {
		off := int(s.seq - isn)
		switch {
		case off == buf.Len():
			buf.Write(s.data)
			sizes = append(sizes, len(s.data))
		case off+len(s.data) <= buf.Len():
			// retransmission of bytes we already have
		case off < buf.Len():
			buf.Write(s.data[buf.Len()-off:])
			sizes = append(sizes, off+len(s.data)-buf.Len())
		default:
			t.Fatalf("gap in TCP stream at offset %d (have %d)", off, buf.Len())
		}
	}
	return buf.Bytes(), sizes
}
