package qp

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// wqeState is where a send WQE is in its life, as rxe's wqe_state.
type wqeState uint8

const (
	wqePosted  wqeState = iota // queued, requester has not started it (or will restart it)
	wqePending                 // packets sent, waiting for the response
	wqeDone                    // needs no response (UC/UD, local ops): complete in order
	wqeError                   // failed locally: complete with status in order
)

// wqe is a send work request as the requester and completer track it.
// Slots are reused, so SGL and Inline keep their capacity.
type wqe struct {
	wr     SendWR
	sgl    []SGE
	inline []byte

	state  wqeState
	status WCStatus
	length int // message bytes (8 for atomics)

	firstPSN, lastPSN PSN
	sent              int  // requester: bytes already put into packets
	recvd             int  // completer: READ bytes placed so far
	hasRdAtomic       bool // holds one of the max_rd_atomic credits
	kept              bool // a READ whose whole reply came behind a gap (readkeep.go)
}

func (w *wqe) isReadOrAtomic() bool {
	return w.wr.Opcode == WRRDMARead || w.wr.Opcode.IsAtomic() ||
		w.wr.Opcode == WRFlush || w.wr.Opcode == WRAtomicWrite
}

// sendQueue is a bounded ring of WQEs. Producers (PostSend) append under
// mu and publish the slot by storing tail, which the owner goroutine
// loads without the lock; the owner works on [head, tail) and retires
// from head under mu, so a slot is never reused while the owner reads it. mu
// also orders posts against a reset and Close: PostSend checks the QP
// state and appends in one critical section, and the move to RESET
// empties the ring and changes the state in one, so no WR slips into a
// queue that is being (or has been) reset.
type sendQueue struct {
	mu   sync.Mutex
	ring []wqe
	// depth is max_send_wr: how many WQEs may be outstanding. It may be 0
	// (a QP that never sends, whose posts all fail as rxe's do), while
	// ring keeps one slot so that at needs no check.
	depth  uint64
	head   uint64        // oldest WQE not yet completed (owner only writes)
	tail   atomic.Uint64 // next slot to fill (producers store it under mu)
	closed bool          // the QP was destroyed: refuse posts
}

// Per-slot preallocation bounds: enough for the common case (a few SGEs,
// small inline payloads) without letting a large max_inline_data times a
// deep queue reserve megabytes up front. Bigger WRs still work; their slot
// grows once on first use and keeps the capacity.
const (
	preallocSGEs   = 4
	preallocInline = 256
)

// init sizes the ring and carves every slot's SGE list and inline buffer
// out of two shared backing arrays, so the first lap round the ring does
// not allocate in push (steady state never did; warm-up did, once per slot).
func (s *sendQueue) init(n, maxSGE, maxInline int) {
	s.depth = uint64(n)
	n = max(n, 1)
	s.ring = make([]wqe, n)
	nsge := min(max(maxSGE, 1), preallocSGEs)
	ninl := min(max(maxInline, 0), preallocInline)
	sges := make([]SGE, n*nsge)
	var inl []byte
	if ninl > 0 {
		inl = make([]byte, n*ninl)
	}
	for i := range s.ring {
		// Three-index slices: a slot that outgrows its share reallocates
		// instead of overwriting its neighbour.
		s.ring[i].sgl = sges[i*nsge : i*nsge : (i+1)*nsge]
		if ninl > 0 {
			s.ring[i].inline = inl[i*ninl : i*ninl : (i+1)*ninl]
		}
	}
}

func (s *sendQueue) at(i uint64) *wqe { return &s.ring[i%uint64(len(s.ring))] }

// pushLocked appends a copy of wr; s.mu must be held.
func (s *sendQueue) pushLocked(wr *SendWR) error {
	tail := s.tail.Load()
	if tail-s.head == s.depth {
		return ErrSendFull
	}
	w := s.at(tail)
	sgl, inl := w.sgl[:0], w.inline[:0]
	// Copy field by field: storing wr's slice headers in the ring, even
	// briefly, would make every caller's SGE list escape to the heap.
	w.wr = SendWR{ID: wr.ID, Opcode: wr.Opcode, Flags: wr.Flags, Imm: wr.Imm,
		InvalidateRKey: wr.InvalidateRKey, RemoteAddr: wr.RemoteAddr, RKey: wr.RKey,
		CompareAdd: wr.CompareAdd, Swap: wr.Swap, RemoteQPN: wr.RemoteQPN,
		RemoteQKey: wr.RemoteQKey, Bind: wr.Bind, Reg: wr.Reg,
		AV: AddrVector{DGID: cloneAddr(wr.AV.DGID), FlowLabel: wr.AV.FlowLabel, SGIDIndex: wr.AV.SGIDIndex,
			HopLimit: wr.AV.HopLimit, TrafficClass: wr.AV.TrafficClass, SL: wr.AV.SL,
			StaticRate: wr.AV.StaticRate, PortNum: wr.AV.PortNum, SrcPort: wr.AV.SrcPort, DestPort: wr.AV.DestPort}}
	if wr.Flags&Inline != 0 {
		inl = append(inl, wr.Inline...)
		w.wr.SGL = nil
	} else {
		sgl = append(sgl, wr.SGL...)
		w.wr.SGL = sgl
	}
	w.wr.Inline = inl
	w.sgl, w.inline = sgl, inl
	w.state = wqePosted
	w.status = WCSuccess
	w.length = int(wr.Len())
	w.sent, w.recvd = 0, 0
	w.hasRdAtomic, w.kept = false, false
	s.tail.Store(tail + 1) // after the slot is written: publishes it
	return nil
}

// cloneAddr rebuilds a without sharing its internal pointer (the zone
// handle), which would otherwise make escape analysis send every posted
// WR's SGE list to the heap. Zones mean nothing for a GID.
func cloneAddr(a netip.Addr) netip.Addr {
	switch {
	case a.Is4():
		return netip.AddrFrom4(a.As4())
	case a.Is6():
		return netip.AddrFrom16(a.As16())
	}
	return netip.Addr{}
}

// published returns the producer index; WQEs before it are visible.
func (s *sendQueue) published() uint64 { return s.tail.Load() }

// retire advances head past one WQE.
func (s *sendQueue) retire() {
	s.mu.Lock()
	s.head++
	s.mu.Unlock()
}

// clearLocked discards every WQE (the move to RESET); s.mu must be held.
func (s *sendQueue) clearLocked() { s.head = s.tail.Load() }

// Outstanding returns the number of WQEs posted and not yet completed.
func (s *sendQueue) Outstanding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.tail.Load() - s.head)
}
