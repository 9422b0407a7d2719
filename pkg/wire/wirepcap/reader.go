// Package wirepcap reads RoCEv2 traffic from pcap and pcapng files (pure
// Go, via gopacket's pcapgo), dissects frames down to the RoCE UDP payload,
// and registers gopacket layers for the RoCE headers on UDP port 4791.
package wirepcap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// ErrFormat is returned for input that is neither pcap nor pcapng.
var ErrFormat = errors.New("wirepcap: not a pcap or pcapng file")

// Frame is one captured frame.
type Frame struct {
	Number   int // 1-based, like tshark
	Time     time.Time
	LinkType layers.LinkType
	Data     []byte // valid until the next call to Next
	Length   int    // original length on the wire
}

// Reader reads frames from a pcap or pcapng stream.
type Reader struct {
	pcap *pcapgo.Reader
	ng   *pcapgo.NgReader
	n    int
}

var (
	pcapMagics = [][]byte{
		{0xd4, 0xc3, 0xb2, 0xa1}, {0xa1, 0xb2, 0xc3, 0xd4}, // microseconds
		{0x4d, 0x3c, 0xb2, 0xa1}, {0xa1, 0xb2, 0x3c, 0x4d}, // nanoseconds
	}
	ngMagic = []byte{0x0a, 0x0d, 0x0d, 0x0a}
)

// NewReader detects the format from the first bytes and returns a reader.
func NewReader(r io.Reader) (*Reader, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, err := br.Peek(4)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w (file shorter than a header)", ErrFormat)
		}
		return nil, err
	}
	if bytes.Equal(magic, ngMagic) {
		ng, err := pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return nil, fmt.Errorf("%w: pcapng: %v", ErrFormat, err)
		}
		return &Reader{ng: ng}, nil
	}
	for _, m := range pcapMagics {
		if bytes.Equal(magic, m) {
			p, err := pcapgo.NewReader(br)
			if err != nil {
				return nil, fmt.Errorf("%w: pcap: %v", ErrFormat, err)
			}
			return &Reader{pcap: p}, nil
		}
	}
	return nil, ErrFormat
}

// Next returns the next frame, or io.EOF at the clean end of the file. A
// file cut in the middle of a record yields io.ErrUnexpectedEOF.
func (r *Reader) Next() (Frame, error) {
	var (
		data []byte
		ci   gopacket.CaptureInfo
		err  error
		lt   layers.LinkType
	)
	if r.ng != nil {
		data, ci, err = r.ng.ZeroCopyReadPacketData()
		if err == nil {
			lt = r.ng.LinkType()
			if iface, ierr := r.ng.Interface(ci.InterfaceIndex); ierr == nil {
				lt = iface.LinkType
			}
		}
	} else {
		data, ci, err = r.pcap.ZeroCopyReadPacketData()
		lt = r.pcap.LinkType()
		// pcapgo reads a record's data with io.ReadFull, whose io.EOF (none
		// of it there) reads as a clean end; but the record's header was
		// read, as its timestamp says (a failed header read leaves ci
		// zero, a read one is at or after 1970).
		if err == io.EOF && !ci.Timestamp.IsZero() {
			err = io.ErrUnexpectedEOF
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, io.EOF
		}
		return Frame{}, fmt.Errorf("wirepcap: frame %d: %w", r.n+1, err)
	}
	r.n++
	return Frame{Number: r.n, Time: ci.Timestamp, LinkType: lt, Data: data, Length: ci.Length}, nil
}

// ReadFile reads every frame of a pcap or pcapng file into memory.
func ReadFile(path string) ([]Frame, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Frame
	for {
		fr, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", path, err)
		}
		fr.Data = bytes.Clone(fr.Data)
		out = append(out, fr)
	}
}
