package conform

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteLadder writes a text ladder of r's trace: time down, the engine on
// the left, the peer on the right, one arrow per packet.
func WriteLadder(w io.Writer, r Result) error {
	const width = 64
	var b strings.Builder
	fmt.Fprintf(&b, "  %-12s %-*s %s\n", "time", width/2, "engine "+r.Local, "peer "+r.Peer)
	for _, e := range r.Trace {
		label := e.Label()
		at := fmt.Sprintf("%10.3fms", float64(e.At)/float64(time.Millisecond))
		if e.Dir == Out {
			fmt.Fprintf(&b, "  %s |-- %s -->|\n", at, label)
		} else {
			fmt.Fprintf(&b, "  %s |<-- %s --|\n", at, label)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
