package wirepcap_test

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// capture is a file the fuzz target builds with pcapgo's writers, and
// where each of its records ends (a cut there is a clean end of file).
type capture struct {
	file   []byte
	header int   // length of the file header (pcapng: section and interface blocks)
	ends   []int // offset just past each record
	frames [][]byte
	times  []time.Time
}

// buildCapture writes frames (each the fuzzer's data, cut to its byte of
// length) as classic pcap (micro- or nanosecond) or pcapng.
func buildCapture(t *testing.T, format byte, in []byte) capture {
	var c capture
	var buf bytes.Buffer
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var write func(ci gopacket.CaptureInfo, d []byte) error
	switch format % 3 {
	case 0, 1:
		var w *pcapgo.Writer
		if format%3 == 1 {
			w = pcapgo.NewWriterNanos(&buf)
		} else {
			w = pcapgo.NewWriter(&buf)
		}
		require.NoError(t, w.WriteFileHeader(65535, layers.LinkTypeRaw))
		write = w.WritePacket
	default:
		w, err := pcapgo.NewNgWriter(&buf, layers.LinkTypeRaw)
		require.NoError(t, err)
		require.NoError(t, w.Flush())
		write = func(ci gopacket.CaptureInfo, d []byte) error {
			if err := w.WritePacket(ci, d); err != nil {
				return err
			}
			return w.Flush()
		}
	}
	c.header = buf.Len()
	for len(in) > 0 && len(c.frames) < 16 {
		n := min(int(in[0]), len(in)-1)
		d := in[1 : 1+n]
		in = in[1+n:]
		// Microsecond steps survive both timestamp resolutions.
		ts = ts.Add(time.Duration(n) * time.Microsecond)
		require.NoError(t, write(gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(d), Length: len(d)}, d))
		c.frames = append(c.frames, d)
		c.times = append(c.times, ts)
		c.ends = append(c.ends, buf.Len())
	}
	c.file = buf.Bytes()
	return c
}

// readAll reads frames until an error; it copies each frame's data.
func readAll(t *testing.T, b []byte) ([]wirepcap.Frame, error) {
	r, err := wirepcap.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	var out []wirepcap.Frame
	for {
		fr, err := r.Next()
		if err != nil {
			return out, err
		}
		require.Equal(t, len(out)+1, fr.Number, "frames are numbered from 1")
		fr.Data = bytes.Clone(fr.Data)
		out = append(out, fr)
		require.LessOrEqual(t, len(out), len(b), "more frames than bytes")
	}
}

// FuzzReader checks the pcap/pcapng reader against pcapgo's writers: a
// file of the fuzzer's frames reads back as exactly those frames, with
// their timestamps, ending in io.EOF; the same file cut anywhere after its
// header reads the frames before the cut and then io.EOF when the cut is
// at a record boundary, io.ErrUnexpectedEOF otherwise (a decode of a cut
// file must not exit 0 with frames silently missing: see
// TestRecordCutAfterItsHeaderIsUnexpectedEOF). The raw input is also read
// as a file: any error, never a panic, never more frames than bytes.
func FuzzReader(f *testing.F) {
	f.Add(byte(0), uint16(0), []byte("\x04abcd\x00\x10RoCE frame 16 by"))
	f.Add(byte(1), uint16(30), []byte("\x02hi\x03abc"))
	f.Add(byte(2), uint16(50), []byte("\x05hello\x00\x01x"))
	// Cut right after the first record's header (pcap: 24-byte file
	// header, 16-byte record header).
	f.Add(byte(0), uint16(16), []byte("\x04abcd\x02xy"))
	f.Add(byte(0), uint16(0), []byte{0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 101, 0, 0, 0})
	f.Add(byte(2), uint16(0), []byte{0x0a, 0x0d, 0x0d, 0x0a, 0x1c, 0, 0, 0, 0x4d, 0x3c, 0x2b, 0x1a})
	f.Fuzz(func(t *testing.T, format byte, cut uint16, in []byte) {
		// Arbitrary bytes as a file.
		_, _ = readAll(t, in)

		c := buildCapture(t, format, in)
		frames, err := readAll(t, c.file)
		require.Equal(t, io.EOF, err, "whole file")
		require.Len(t, frames, len(c.frames))
		for i, fr := range frames {
			require.Equal(t, string(c.frames[i]), string(fr.Data), "frame %d", i+1)
			require.Equal(t, len(c.frames[i]), fr.Length, "frame %d", i+1)
			require.True(t, c.times[i].Equal(fr.Time), "frame %d: time %v, want %v", i+1, fr.Time, c.times[i])
			require.Equal(t, layers.LinkTypeRaw, fr.LinkType)
		}

		n := c.header + int(cut)%(len(c.file)-c.header+1)
		frames, err = readAll(t, c.file[:n])
		complete := 0
		for complete < len(c.ends) && c.ends[complete] <= n {
			complete++
		}
		require.Len(t, frames, complete, "cut at %d of %d", n, len(c.file))
		if n == c.header || complete > 0 && c.ends[complete-1] == n {
			require.Equal(t, io.EOF, err, "cut at record boundary %d of %d", n, len(c.file))
		} else {
			require.Truef(t, errors.Is(err, io.ErrUnexpectedEOF), "cut at %d of %d, after %d frames: %v", n, len(c.file), complete, err)
		}
	})
}
