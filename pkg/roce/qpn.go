package roce

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"sync"

	"github.com/rxed/rxed/pkg/qp"
)

// QP numbers.
//
// rdma_rxe hands out QP numbers from a pool starting at 0x11, so they
// are nearly sequential; a blind attacker (one who cannot see the
// traffic) who knows one QPN of a host can then aim forged packets at
// its neighbours, and a connection manager may see a just-destroyed QPN
// come back at once. The engine instead draws each number at random from
// [FirstQPN, 2^24), skipping numbers in use and the last RecentQPNs
// numbers destroyed. Any QPN is fine for an rxe peer: the number is
// exchanged (out of band or in CM MADs), never assumed.
const (
	// FirstQPN is the lowest number handed out: QP0 (SMI) and QP1 (GSI)
	// are special, and rxe reserves the numbers up to 0x10.
	FirstQPN = 0x11
	// GSIQPN is the General Services QP's number (qp.GSI; one per device).
	GSIQPN = 1
	// RecentQPNs is how many destroyed QP numbers are held back from
	// random allocation, so a connection manager's timewait never sees
	// a QPN reused at once.
	RecentQPNs = 1024
	// maxQPN is the largest 24-bit QP number.
	maxQPN = 1<<24 - 1
)

// ErrQPNInUse is returned by CreateQP for a requested QP number that
// exists (QP1 when the device has its GSI QP).
var ErrQPNInUse = errors.New("roce: QP number in use")

// errNoQPN: every number is in use or held back.
var errNoQPN = errors.New("roce: no free QP number")

// qpnAllocator tracks the QP numbers of one engine.
//
// Every field is guarded by mu; the allocator is used by CreateQP and
// DestroyQP from any goroutine.
type qpnAllocator struct {
	mu sync.Mutex
	// rng draws candidate numbers: ChaCha8 seeded from Config.Rand
	// (crypto/rand by default), so the sequence is unpredictable
	// without the seed and reproducible with it.
	rng *mrand.Rand
	// lo and span are the random pool [lo, lo+span) (FirstQPN and
	// 2^24-FirstQPN; tests shrink it).
	lo, span uint32
	inUse    map[uint32]struct{}
	// recent is a ring of the last len(recent) numbers freed; recentAt
	// maps a held-back number to the free sequence number of its ring
	// slot (a number freed twice within the window keeps its latest
	// slot). freed counts frees.
	recent   []uint32
	recentAt map[uint32]uint64
	freed    uint64
}

// newQPNAllocator seeds an allocator from rnd (nil: crypto/rand).
func newQPNAllocator(rnd io.Reader) (*qpnAllocator, error) {
	if rnd == nil {
		rnd = rand.Reader
	}
	var seed [32]byte
	if _, err := io.ReadFull(rnd, seed[:]); err != nil {
		return nil, fmt.Errorf("roce: reading QPN randomness: %w", err)
	}
	return &qpnAllocator{
		rng:      mrand.New(mrand.NewChaCha8(seed)),
		lo:       FirstQPN,
		span:     maxQPN + 1 - FirstQPN,
		inUse:    make(map[uint32]struct{}),
		recent:   make([]uint32, RecentQPNs),
		recentAt: make(map[uint32]uint64),
	}, nil
}

// available reports whether n may be handed out at random. Under mu.
func (a *qpnAllocator) available(n uint32) bool {
	if _, used := a.inUse[n]; used {
		return false
	}
	_, held := a.recentAt[n]
	return !held
}

// alloc takes a random number that is neither in use nor held back.
func (a *qpnAllocator) alloc() (uint32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// With at most a few thousand QPs out of 16 million numbers a
	// draw almost never collides; the scan is for tiny test pools and
	// a pool that really is (nearly) full.
	for range 64 {
		if n := a.lo + a.rng.Uint32N(a.span); a.available(n) {
			a.inUse[n] = struct{}{}
			return n, nil
		}
	}
	start := a.rng.Uint32N(a.span)
	for k := range a.span {
		if n := a.lo + (start+k)%a.span; a.available(n) {
			a.inUse[n] = struct{}{}
			return n, nil
		}
	}
	return 0, errNoQPN
}

// reserve takes the number n a caller asked for (QP1 for the GSI QP, a
// captured QPN in a replay test). A held-back number may be asked for:
// the caller chose it knowingly.
func (a *qpnAllocator) reserve(n uint32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, used := a.inUse[n]; used {
		return fmt.Errorf("%w: %#x", ErrQPNInUse, n)
	}
	a.inUse[n] = struct{}{}
	return nil
}

// release gives n back. A number that was used by a QP (hold) is held
// back from random allocation for the next len(recent) frees; one whose
// QP never existed (creation failed) is not.
func (a *qpnAllocator) release(n uint32, hold bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.inUse, n)
	if !hold || n < a.lo || len(a.recent) == 0 {
		return
	}
	slot := a.freed % uint64(len(a.recent))
	if a.freed >= uint64(len(a.recent)) {
		old := a.recent[slot]
		if a.recentAt[old] == a.freed-uint64(len(a.recent)) {
			delete(a.recentAt, old)
		}
	}
	a.recent[slot] = n
	a.recentAt[n] = a.freed
	a.freed++
}

// numFor picks the number of a QP being created with c: QP1 for the
// GSI QP, the requested number, or a random one.
func (a *qpnAllocator) numFor(c *qp.Config) (uint32, error) {
	switch {
	case c.Type == qp.GSI:
		if c.Num != 0 && c.Num != GSIQPN {
			return 0, fmt.Errorf("roce: the GSI QP is QP1, not %#x", c.Num)
		}
		if err := a.reserve(GSIQPN); err != nil {
			return 0, fmt.Errorf("roce: the device has its GSI QP: %w", err)
		}
		return GSIQPN, nil
	case c.Num == GSIQPN:
		return 0, fmt.Errorf("roce: QP1 is the GSI QP, not %v", c.Type)
	case c.Num > maxQPN:
		return 0, fmt.Errorf("roce: QP number %#x does not fit 24 bits", c.Num)
	case c.Num != 0:
		return c.Num, a.reserve(c.Num)
	}
	return a.alloc()
}
