package decode

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
)

// FuzzDecode feeds arbitrary bytes as a capture file, and as the one frame
// of a raw-IP and of an Ethernet capture (so that every input reaches the
// dissector and the formatters, not only the file reader). Decoding may
// fail with an error but must never panic, and what it reports agrees
// with the reader: as many frames as the reader yields, an error exactly
// when the reader's end is not a clean io.EOF, every frame counted as
// RoCEv2 or skipped, defects only among RoCEv2 frames; the summary is one
// line per frame and -json one valid JSON object per frame, numbered from 1.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"rc_pingpong_send_64.pcap", "perftest_read_lat_rc_2.pcap"} {
		if b, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "pcaps", name)); err == nil {
			f.Add(b[:min(len(b), 2048)])
		}
	}
	f.Add([]byte{0x0a, 0x0d, 0x0d, 0x0a})
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
		checkDecode(t, oneFrameCapture(t, layers.LinkTypeRaw, data))
		checkDecode(t, oneFrameCapture(t, layers.LinkTypeEthernet, data))
	})
}

// oneFrameCapture is a classic pcap holding data as its one frame.
func oneFrameCapture(t *testing.T, lt layers.LinkType, data []byte) []byte {
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(65535, lt); err != nil {
		t.Fatal(err)
	}
	ci := gopacket.CaptureInfo{Timestamp: time.Unix(1e9, 0), CaptureLength: len(data), Length: len(data)}
	if err := w.WritePacket(ci, data); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func checkDecode(t *testing.T, data []byte) {
	r, err := wirepcap.NewReader(bytes.NewReader(data))
	if err != nil {
		return
	}
	frames := 0
	var end error
	for {
		if _, end = r.Next(); end != nil {
			break
		}
		frames++
	}
	for _, opt := range []Options{{}, {Verbose: true}, {JSON: true, Verbose: true}} {
		r, _ = wirepcap.NewReader(bytes.NewReader(data))
		var out bytes.Buffer
		st, err := Decode(r, opt, &out)
		if st.Frames != frames {
			t.Fatalf("%+v: decoded %d frames, the reader has %d", opt, st.Frames, frames)
		}
		if end == io.EOF && err != nil || end != io.EOF && (err == nil || err.Error() != end.Error()) {
			t.Fatalf("%+v: decode error %v, the reader ends with %v", opt, err, end)
		}
		if st.RoCE+st.Skipped != st.Frames || st.Errors > st.RoCE {
			t.Fatalf("%+v: stats %+v do not add up", opt, st)
		}
		lines := strings.SplitAfter(out.String(), "\n")
		if lines[len(lines)-1] != "" {
			t.Fatalf("%+v: output does not end with a newline: %q", opt, lines[len(lines)-1])
		}
		lines = lines[:len(lines)-1]
		switch {
		case opt.JSON: // -v adds fields, not lines
			if len(lines) != frames {
				t.Fatalf("%+v: %d JSON lines for %d frames", opt, len(lines), frames)
			}
			for i, l := range lines {
				var j struct {
					Frame int `json:"frame"`
				}
				if err := json.Unmarshal([]byte(l), &j); err != nil || j.Frame != i+1 {
					t.Fatalf("%+v: line %d is not frame %d's JSON object (%v): %s", opt, i+1, i+1, err, l)
				}
			}
		case !opt.Verbose:
			if len(lines) != frames {
				t.Fatalf("%+v: %d summary lines for %d frames:\n%s", opt, len(lines), frames, out.String())
			}
		}
	}
}
