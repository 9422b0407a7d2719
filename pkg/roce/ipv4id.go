package roce

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Why this file exists. Over IPv4 a UDP socket never sees the sender's
// Identification field, yet the ICRC covers it. wire.Flow.Verify solves
// the 16 ID bits from the ICRC, so the ICRC alone leaves a 16-bit check:
// a corrupted packet passes it with probability about 2^-15 (two DF
// hypotheses). Verify also returns the ID it solved, and that ID is not
// free: a real sender only ever uses a few values.
//
//   - rxed (and any sender on an unconnected IP_PMTUDISC_DO socket) always
//     seals with ID 0: Linux gives DF packets of unconnected sockets ID 0,
//     and rxed uses IPv4 GSO only towards loopback, where the message is
//     never segmented on the wire.
//   - rdma_rxe numbers its packets with the kernel's per-(source,
//     destination, protocol) counter (__ip_select_ident ->
//     ip_idents_reserve): +1 per packet, plus a random jump of less than
//     the jiffies elapsed since the bucket was last used (HZ <= 1000).
//
// A corrupted packet's solved ID is uniformly distributed, so admitting
// only IDs a real sender could have used multiplies the false-accept rate
// by (window / 65536). idWindow is that rule for one (peer, local address)
// pair: a peer whose first ID was 0 must keep sending 0 (2^-31 overall);
// otherwise the ID must lie within idBehind below and idAhead(elapsed)
// above the highest ID accepted. A legitimate jump outside the window
// (a long idle period, another flow sharing the kernel's counter bucket,
// a peer replaced by another implementation) costs one packet: the
// rejected ID becomes a candidate, and the next packet whose ID follows
// the candidate is admitted and re-anchors the window. An admitted packet
// clears the candidate, so a false re-anchoring needs two consecutive
// corrupted packets whose IDs agree by chance. RC retransmits the lost
// packet; the CM retransmits MADs.

// Window sizes. idBehind covers reordering, in the network and between
// the engine's workers (packets of one peer go to several shards, and
// a shard's inbox can hold many); idAheadBase covers packets the peer sent
// that we have not seen (lost, or still queued at another worker), and
// idPerSecond the jiffies-based random jump of ip_idents_reserve.
const (
	idBehind    = 1024
	idAheadBase = 256
	idPerSecond = 1000
	// idAheadMax keeps the window below half the ID space, so "ahead" and
	// "behind" stay well defined in serial-number arithmetic.
	idAheadMax = 1<<15 - 1 - idBehind
)

// idVerdict is what idWindow.admit decided.
type idVerdict uint8

const (
	idFirst  idVerdict = iota // first packet of the pair: admitted, anchors the window
	idOK                      // inside the window
	idResync                  // outside, but follows the previous rejected ID: admitted, re-anchored
	idReject                  // outside the window: the packet is dropped
)

// idWindow is the Identification state of one (peer, local address)
// pair. The zero value is a pair never heard from. It is not safe for
// concurrent use; idGuard serialises it.
type idWindow struct {
	seen bool
	// zero: every ID admitted so far was 0 (an rxed-like peer).
	zero bool
	// zeroSeen: the pair has been in zero mode. Its 0 stays admitted, and
	// puts the window back in zero mode, whatever re-anchored it since:
	// two forged packets with consecutive IDs (the ICRC is no secret)
	// would otherwise make the real peer lose its next packet.
	zeroSeen bool
	max      uint16    // highest ID admitted, in serial arithmetic
	at       time.Time // when an ID was last admitted

	// The last rejected ID, a candidate for re-anchoring.
	cand    uint16
	candAt  time.Time
	candSet bool
}

// idAhead is how far above an anchor an ID may lie after elapsed.
func idAhead(elapsed time.Duration) int {
	if elapsed < 0 {
		elapsed = 0
	}
	// elapsed/ms * per-ms, without overflowing on long idle periods.
	if elapsed >= time.Duration(idAheadMax)*time.Second/idPerSecond {
		return idAheadMax
	}
	n := idAheadBase + int(elapsed*idPerSecond/time.Second)
	return min(n, idAheadMax)
}

// follows reports whether id is within the window anchored at anchor,
// last used at t, as seen at now.
func follows(id, anchor uint16, t, now time.Time) bool {
	d := int(int16(id - anchor))
	return d >= -idBehind && d <= idAhead(now.Sub(t))
}

// admit decides whether a packet whose ICRC solved to id may be accepted
// at now, and updates the window.
func (w *idWindow) admit(id uint16, now time.Time) idVerdict {
	switch {
	case !w.seen:
		*w = idWindow{seen: true, zero: id == 0, zeroSeen: id == 0, max: id, at: now}
		return idFirst
	case w.zero && id == 0:
		w.at, w.candSet = now, false
		return idOK
	case !w.zero && follows(id, w.max, w.at, now):
		if int16(id-w.max) > 0 {
			w.max = id
		}
		w.at, w.candSet = now, false
		return idOK
	case w.zeroSeen && id == 0:
		// A zero-mode peer whose window something re-anchored: a forger
		// of its address, or a corrupted pair. Its 0 is still its ID.
		*w = idWindow{seen: true, zero: true, zeroSeen: true, at: now}
		return idOK
	case w.candSet && follows(id, w.cand, w.candAt, now):
		// Two packets agree on a new sequence: the sender moved on.
		zero := id == 0 && w.cand == 0
		*w = idWindow{seen: true, zero: zero, zeroSeen: w.zeroSeen || zero, max: id, at: now}
		return idResync
	}
	w.cand, w.candAt, w.candSet = id, now, true
	return idReject
}

// idPair keys an IPv4 (peer, local address) pair.
type idPair struct{ src, dst [4]byte }

// idGuardMaxPairs bounds the table: pairs are created by packets that
// passed the ICRC, which a spoofing sender can compute, so it must not
// grow without bound. When full the pair that appeared first is forgotten
// (its next packet is a first packet again): the order is deterministic,
// unlike a map's, so a test can say which pair goes.
const idGuardMaxPairs = 4096

// idGuard holds the ID windows of every IPv4 pair the engine receives
// from. It is safe for concurrent use by the workers, which call admit
// once per IPv4 packet: mu guards only the map's shape (read-locked on the
// per-packet path, written when a pair first appears), and each pair's
// window has its own lock, so workers receiving from different peers do
// not contend. IPv6 packets never get here.
//
// The common packet takes no lock at all: last remembers the pair of the
// latest packet (found without mu), and a window in the state of an
// rxed-like peer (every ID so far 0, no rejected one pending: zeroOK)
// admits an ID of 0 without its own lock, as admit would: in that state
// it only records the time, which nothing reads until the window leaves
// it. The four locked instructions of the locks were 86% of admit's CPU,
// 1.2% of an 8-byte WRITE round trip (docs/performance.md, session Q).
type idGuard struct {
	mu    sync.RWMutex
	pairs map[idPair]*lockedWindow
	// order holds the keys of pairs in the order they appeared, a ring
	// whose oldest entry is order[oldest] once it is full (guarded by mu).
	order  []idPair
	oldest int
	last   atomic.Pointer[lockedWindow]
}

// lockedWindow is one pair's window and the lock that serialises it.
type lockedWindow struct {
	key idPair
	// zeroOK is w.zero && !w.candSet, stored under mu after each admit;
	// gone is set (under idGuard.mu) when the table forgets the pair, so
	// that a stale last is not used.
	zeroOK, gone atomic.Bool

	mu sync.Mutex
	w  idWindow
}

// admit applies the window of the pair (src, dst) to id. src and dst must
// be IPv4 (or IPv4-mapped) addresses.
func (g *idGuard) admit(src, dst netip.Addr, id uint16, now time.Time) idVerdict {
	k := idPair{src.Unmap().As4(), dst.Unmap().As4()}
	lw := g.last.Load()
	if lw == nil || lw.key != k || lw.gone.Load() {
		g.mu.RLock()
		lw = g.pairs[k]
		g.mu.RUnlock()
		if lw == nil {
			lw = g.add(k)
		}
		g.last.Store(lw)
	}
	if id == 0 && lw.zeroOK.Load() {
		return idOK
	}
	lw.mu.Lock()
	v := lw.w.admit(id, now)
	lw.zeroOK.Store(lw.w.zero && !lw.w.candSet)
	lw.mu.Unlock()
	return v
}

// add returns k's window, creating it (and forgetting the oldest pair
// when the table is full).
func (g *idGuard) add(k idPair) *lockedWindow {
	g.mu.Lock()
	defer g.mu.Unlock()
	if lw := g.pairs[k]; lw != nil {
		return lw // another worker was first
	}
	if g.pairs == nil {
		g.pairs = make(map[idPair]*lockedWindow)
	}
	if len(g.order) < idGuardMaxPairs {
		g.order = append(g.order, k)
	} else {
		old := g.order[g.oldest]
		g.pairs[old].gone.Store(true)
		delete(g.pairs, old)
		g.order[g.oldest] = k
		g.oldest = (g.oldest + 1) % idGuardMaxPairs
	}
	lw := &lockedWindow{key: k}
	g.pairs[k] = lw
	return lw
}
