package decode

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/rxed/rxed/pkg/wire/wirepcap"
)

// FuzzDecode feeds arbitrary bytes as a capture file: decoding may fail
// with an error but must never panic.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"rc_pingpong_send_64.pcap", "perftest_read_lat_rc_2.pcap"} {
		if b, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "pcaps", name)); err == nil {
			f.Add(b[:min(len(b), 2048)])
		}
	}
	f.Add([]byte{0x0a, 0x0d, 0x0d, 0x0a})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := wirepcap.NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, opt := range []Options{{}, {Verbose: true}, {JSON: true, Verbose: true}} {
			r, _ = wirepcap.NewReader(bytes.NewReader(data))
			_, _ = Decode(r, opt, io.Discard)
		}
	})
}
