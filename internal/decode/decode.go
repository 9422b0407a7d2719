// Package decode implements `rxed decode`: it prints the RoCEv2 packets of
// a pcap or pcapng capture one line per packet (like tshark's summary),
// with every field (-v), or as one JSON object per packet (-json), and
// checks each packet's ICRC against the captured IP header.
package decode

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rxed/rxed/pkg/wire/wirepcap"
)

// Options select the output format and which frames are RoCEv2.
type Options struct {
	Verbose bool // every field of every header
	JSON    bool // one JSON object per packet
	// Ports are UDP destination ports besides 4791 whose frames are
	// decoded as RoCEv2 whatever they hold (rxed engines run with --port).
	// Other ports are learned from the frames: see roceports.
	Ports []uint16
}

// Stats counts what a decode run saw.
type Stats struct {
	Frames  int // frames in the file
	RoCE    int // RoCEv2 frames (UDP port 4791, Options.Ports or a learned port)
	Skipped int // other frames
	Errors  int // RoCEv2 frames with a defect (including a bad ICRC)
}

const usageText = `usage: rxed decode [-v] [-json] [--port N]... FILE|-

Print the RoCEv2 packets of a pcap or pcapng capture (Ethernet, 802.1Q,
raw IP or Linux cooked link types), one line per packet, checking each
ICRC against the captured IP header. Frames that are not RoCEv2 are
reported as skipped.

RoCEv2 is UDP to port 4791. Frames to another UDP port are RoCEv2 when
the port is given with --port, or once a frame to that port parses and
its ICRC verifies (so captures of rxed engines started with --port, and
rxed's own --pcap files, decode without the flag); a frame to such a
port before the first verified one is skipped.
`

// Run is the `rxed decode` command: args are the arguments after the
// command name. It returns the exit status: 0 when the file was read to
// its end (whatever the packets held), 1 when the file is missing, not a
// capture or corrupt, 2 for usage errors.
func Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	var opt Options
	fs.BoolVar(&opt.Verbose, "v", false, "print every field of every header")
	fs.BoolVar(&opt.JSON, "json", false, "print one JSON object per packet")
	fs.Var((*portList)(&opt.Ports), "port", "also decode UDP frames to port `N` as RoCEv2 (repeatable)")
	// Accept flags before and after the file name.
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		files = append(files, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(files) != 1 {
		// The line that says what is wrong comes first, as flag's own
		// errors do; the usage alone left a user to guess.
		fmt.Fprintf(stderr, "rxed decode: %s\n", fileCountProblem(files))
		fs.Usage()
		return 2
	}
	if _, err := DecodeFile(files[0], opt, stdout); err != nil {
		fmt.Fprintf(stderr, "rxed decode: %v\n", err)
		return 1
	}
	return 0
}

// fileCountProblem says what is wrong with the file arguments when there
// is not exactly one.
func fileCountProblem(files []string) string {
	if len(files) == 0 {
		return "no capture file given (a pcap/pcapng FILE, or - for standard input)"
	}
	return fmt.Sprintf("want one capture file, got %d: %s", len(files), strings.Join(files, " "))
}

// stdin is where "-" reads from (a variable for tests).
var stdin io.Reader = os.Stdin

// DecodeFile decodes the capture at path ("-" for standard input, e.g.
// `tcpdump -w - udp port 4791 | rxed decode -`) into w.
func DecodeFile(path string, opt Options, w io.Writer) (Stats, error) {
	var in io.Reader
	if path == "-" {
		in = stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return Stats{}, err
		}
		defer f.Close()
		in = f
	}
	r, err := wirepcap.NewReader(in)
	if err != nil {
		return Stats{}, fmt.Errorf("%s: %w", path, err)
	}
	st, err := Decode(r, opt, w)
	if err != nil {
		return st, fmt.Errorf("%s: %w (after %d frames)", path, err, st.Frames)
	}
	return st, nil
}

// Decode prints every frame of r to w.
func Decode(r *wirepcap.Reader, opt Options, w io.Writer) (Stats, error) {
	var (
		st    Stats
		rf    wirepcap.RoCEFrame
		first time.Time
		sb    strings.Builder
		ports = newRoCEPorts(opt.Ports)
	)
	for {
		fr, err := r.Next()
		if err == io.EOF {
			return st, nil
		}
		if err != nil {
			return st, err
		}
		if st.Frames == 0 {
			first = fr.Time
		}
		st.Frames++
		derr := ports.decode(fr.LinkType, fr.Data, &rf)
		rec := record{frame: &fr, rel: fr.Time.Sub(first), rf: &rf}
		if derr != nil {
			st.Skipped++
			rec.skip = skipReason(fr, derr)
			if errors.Is(derr, wirepcap.ErrNotRoCE) {
				rec.skip += fmt.Sprintf(" (--port %d decodes it as RoCEv2)", rf.Dst.Port())
			}
		} else {
			st.RoCE++
			if rf.ParseErr != nil {
				st.Errors++
			}
		}
		sb.Reset()
		if opt.JSON {
			if err := writeJSON(&sb, &rec, opt); err != nil {
				return st, err
			}
		} else {
			writeText(&sb, &rec, opt)
		}
		if _, err := io.WriteString(w, sb.String()); err != nil {
			return st, err
		}
	}
}

// record is what the formatters get for one frame.
type record struct {
	frame *wirepcap.Frame
	rel   time.Duration
	rf    *wirepcap.RoCEFrame
	skip  string // non-empty: not a RoCEv2 frame, and why
}
