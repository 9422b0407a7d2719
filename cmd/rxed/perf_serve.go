package main

import (
	"context"
	"fmt"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
)

// A perf client against rxed serve (the peer speaks the rxed extension:
// only serve does as a server) knows more than against perftest: the
// export's length, from the address proof's grant, and that --validate
// can check its writes by reading the export back. The export holds the
// daemon's data, not perf's pattern, so reads and atomics are checked for
// consistency only, as against perftest.

// perfReadBackWRID is the work request ID of --validate's read-back.
const perfReadBackWRID = 1 << 62

// checkExportFits refuses a run whose messages do not fit the export the
// grant describes (Len 0: the server did not say).
func (r *perfRun) checkExportFits(g oob.Grant) error {
	need := uint64(r.o.maxSize())
	if g.Len == 0 || need <= g.Len {
		return nil
	}
	return fmt.Errorf("-s %d: the server's export is %d bytes, smaller than one message (use -s %d or less, or a larger --export)", need, g.Len, g.Len)
}

// readBackExport is --validate's check of a WRITE run against rxed serve:
// before the final exchange (serve destroys the session's QPs after it),
// it RDMA-READs the export's first bytes, which every QP wrote with the
// pattern, and compares.
func (r *perfRun) readBackExport(ctx context.Context) error {
	q := r.qps[0]
	size := r.o.maxSize()
	dst := r.buf[q.target : q.target+size]
	clear(dst)
	wr := ib.SendWR{ID: perfReadBackWRID, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
		SGL:        []ib.SGE{{Addr: r.mr.IOVA() + uint64(q.target), Length: uint32(size), LKey: r.mr.LKey()}},
		RemoteAddr: q.remote.VAddr, RKey: q.remote.RKey}
	if err := q.qp.PostSend(wr); err != nil {
		return fmt.Errorf("--validate: reading the export back: %v", err)
	}
	var wcs [1]ib.WC
	for {
		n, err := r.waitWC(ctx, wcs[:], func() string { return "reading the export back (--validate)" })
		if err != nil {
			return fmt.Errorf("--validate: %v", err)
		}
		if n == 1 && wcs[0].ID == perfReadBackWRID {
			break
		}
	}
	if j := checkPattern(dst); j >= 0 {
		return fmt.Errorf("validation: the export's byte %d is %#02x after the run, want %#02x (read back over RDMA READ)", j, dst[j], patternByte(j))
	}
	return nil
}

// serveValidation reports what --validate can check against rxed serve:
// readBack when the run's writes are read back, and otherwise the note
// for stderr.
func (r *perfRun) serveValidation() (readBack bool, note string) {
	switch {
	case r.o.test.Verb == oob.VerbWrite && r.o.conn == ib.RC:
		return true, ""
	case r.o.test.Verb == oob.VerbWrite:
		return false, "the peer is rxed serve; UC has no READ to read its export back, so only sizes and counts were checked"
	}
	return false, "the peer is rxed serve, whose export holds its own data: results were checked for consistency, not exact bytes"
}

// validateNote is the stderr line of a --validate run that could not
// check exact bytes ("" when it did).
func (r *perfRun) validateNote() string {
	if r.serveExport {
		_, note := r.serveValidation()
		return note
	}
	// Over -R rxed serve speaks no extension either, so "the peer is not
	// rxed" told a user of rxed serve --rdma-cm-port the opposite of
	// what they ran.
	return "the peer is not rxed perf (perftest, or rxed serve over -R), so only sizes, counts and consistency were checked"
}
