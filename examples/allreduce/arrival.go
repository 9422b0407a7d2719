package allreduce

import (
	"fmt"
	"net/netip"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// arrival checks a chunk's WRITE with immediate as it completes, and
// counts it. Only the previous rank writes chunks, one WRITE per step in
// step order, and RC completes them here in the order it posted them, so
// the chunk must be of step arrivals. And the ring's order bounds how far
// ahead the previous rank can be (slotsFor): its WRITE of step t waits,
// round the ring, for this rank's send of step t-(ranks-1), so with sent
// steps posted here no chunk past step sent+ranks-2 can have been sent by
// a rank that follows the algorithm (and one more would land in the slot
// of a chunk this rank may not have used yet).
//
// Anything else comes from a buggy or hostile peer, and fails the ring at
// once, naming the rank that sent it. Bug (workload audit): every
// immediate was stored in a set (one entry per immediate, without bound)
// and its range was checked only when recv awaited a step, so a stray
// step was reported late, or never (the wait for the real one timed out
// and blamed the previous rank's silence); a WRITE with immediate from the
// next rank was taken for the previous rank's chunk.
func (l *rdmaLink) arrival(wc ib.WC) error {
	s := wc.Imm
	if l.side(wc.QPNum) != toPrev {
		return fmt.Errorf("rank %d (%v) wrote to this rank with immediate %d: only the previous rank, %d, sends it chunks",
			l.cfg.next(), addrOf(l.cNext), s, l.cfg.prev())
	}
	if s != l.arrivals {
		return fmt.Errorf("rank %d (%v) sent the chunk of step %d while step %d was expected",
			l.cfg.prev(), addrOf(l.cPrev), s, l.arrivals)
	}
	if last := l.sent + uint32(l.cfg.Ranks) - 2; int32(s-last) > 0 {
		return fmt.Errorf("rank %d (%v) sent the chunk of step %d while step %d at most was expected (this rank has sent %d steps, and its previous rank runs at most %d steps ahead of its last)",
			l.cfg.prev(), addrOf(l.cPrev), s, last, l.sent, l.cfg.Ranks-1)
	}
	l.arrivals++
	return nil
}

// addrOf is a connection's remote rdma_cm address, for errors. A chunk's
// completion on the previous rank's QP implies its Conn: acceptPrev sets
// cPrev before it posts that QP's receives (dialNext's drain may handle
// such a completion while acceptPrev runs; the QP's and CQ's locks order
// the two).
func addrOf(c *rdmacm.Conn) netip.AddrPort {
	if c == nil {
		return netip.AddrPort{}
	}
	return c.RemoteAddr()
}
