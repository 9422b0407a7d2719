package oob

import (
	"fmt"
	"io"
	"time"
)

// WritePingpongAddress prints ibv_*_pingpong's address line:
//
//	"  local address:  LID 0x0000, QPN 0x000014, PSN 0x61ae09, GID ::ffff:10.77.0.12"
//	"  remote address: LID 0x0000, QPN 0x000014, PSN 0xe73d2b, GID ::ffff:10.77.0.11"
//
// ud selects ibv_ud_pingpong's local line, which has "PSN 0x...: GID". The
// GID is printed as glibc's inet_ntop does (FormatGID); the tools print
// through a 33-byte buffer and show stale text for GIDs longer than 32
// characters, where this prints the real one.
func WritePingpongAddress(w io.Writer, remote bool, d PingpongDest, ud bool) error {
	side, sep := "  local address:  ", ","
	if remote {
		side = "  remote address: "
	} else if ud {
		sep = ":"
	}
	_, err := fmt.Fprintf(w, "%sLID 0x%04x, QPN 0x%06x, PSN 0x%06x%s GID %s\n", side, d.LID, d.QPN, d.PSN, sep, FormatGID(d.GID))
	return err
}

// WritePingpongSummary prints the two result lines of ibv_*_pingpong for
// iters exchanges of size bytes that took elapsed:
//
//	"81920 bytes in 0.02 seconds = 26.68 Mbit/sec"
//	"10 iters in 0.02 seconds = 2456.00 usec/iter"
//
// with the tools' arithmetic: whole microseconds held in a C float, bytes =
// size * iters * 2 (both directions), usec/iter computed in float.
func WritePingpongSummary(w io.Writer, size, iters uint32, elapsed time.Duration) error {
	usec := float32(elapsed.Microseconds())
	bytes := int64(size) * int64(iters) * 2
	secs := float64(usec) / 1000000.
	_, err := fmt.Fprintf(w, "%d bytes in %s seconds = %s Mbit/sec\n%d iters in %s seconds = %s usec/iter\n",
		bytes, cFloat(secs, 0, 2, false), cFloat(float64(bytes)*8./float64(usec), 0, 2, false),
		iters, cFloat(secs, 0, 2, false), cFloat(float64(usec/float32(iters)), 0, 2, false))
	return err
}
