package rdmacm

import (
	"net/netip"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/cm"
)

// A listener's backlog: the requests waiting for Accept, oldest first,
// with how many each source address holds.
//
// rdma_cm's backlog is one count (ucma's listen_ctx->backlog), so REQs
// forged from one address with fresh source ports and comm IDs take all
// of it, and a real client's REQ then finds it full and is dropped until
// the application has accepted (and timed out on) every forged one. The
// rule that keeps one source from holding the whole backlog changes
// nothing an rdma_cm peer sees beyond what a busy kernel listener shows
// it:
//
//   - While the backlog has room, every request is queued, whoever holds
//     the rest: a host that opens many connections at once (perftest -R
//     -q 40, a key-value bench's clients) has them all queued on their
//     first REQ, as a kernel listener would, instead of waiting seconds
//     for its REQ retransmissions (rdma_cm's first comes 6 s later).
//   - A full backlog makes room for a source that holds fewer requests
//     than the heaviest one by at least two: the heaviest source's oldest
//     request is refused as Close refuses a queued request (REJ 28,
//     consumer defined, what the kernel sends when a listener's
//     application rejects or destroys a connect request it has not
//     answered; SIDR_REP REJECT for a SIDR_REQ). So a flood from one
//     address fills the backlog, and each real client's REQ still takes
//     one of the flood's places, which the flood's later REQs cannot
//     take back (they come from the heaviest source).
//
// A cap per source while there is room (ListenOptions.MaxPerSource, set
// by the application) is a hard one: a request from a source that holds
// it already is turned away as a full backlog turns a REQ away
// (silently: its retransmission is a new request, admitted once Accept
// has taken one of that source's; a SIDR_REQ gets SIDR_REP REJECT).
// There is none by default: it refused a lone host's burst with the
// backlog nearly empty, and eviction keeps a flood from one address from
// keeping others out without it.
//
// A request whose active side can no longer be waiting (its REQ's
// retries are over: listen_expiry.go) holds no place: admit and take
// hand it back for the caller to refuse, instead of letting it block a
// real client or cost Accept's caller a REP timeout.
//
// Sources are IP addresses (Request's peer GID, unmapped), which the
// REQ's GRH source and rdma_cm header agree on (fromHeaderSource). A
// forger that spoofs many addresses still fills the backlog, one request
// each; docs/security.md lists it.
type backlog struct {
	mu        sync.Mutex
	reqs      []*Request         // oldest first
	bySrc     map[netip.Addr]int // how many of reqs each source holds
	max       int                // ListenOptions.Backlog
	perSource int                // ListenOptions.MaxPerSource; 0: no cap of its own
	// ready holds a token while reqs may be non-empty: Accept waits on it
	// and takes the request under mu (a token without a request is a
	// spurious wakeup, and Accept waits again).
	ready chan struct{}

	// The expiry timer (listen_expiry.go): armed on clock for the
	// earliest deadline of reqs (timerAt), none while none has one; it
	// hands what expired to onExpire. timerGen numbers the timers armed,
	// so that one replaced can tell. A nil clock arms nothing (the
	// package's unit tests of the rules).
	clock    cm.Clock
	onExpire func([]*Request)
	timer    cm.Timer
	timerAt  time.Time
	timerGen uint64
}

// admission is what admit decides for a request.
type admission int

const (
	admitted     admission = iota // room: queue it
	admitEvicted                  // room made: the victim was taken out
	backlogFull                   // no room, and nobody to make room
	sourceFull                    // its source holds the cap it was set (perSource)
)

// newBacklog makes a backlog of max requests; perSource 0 (or max or
// more, which the backlog's own room caps anyway) sets no cap per source.
func newBacklog(max, perSource int) *backlog {
	if perSource < 0 || perSource >= max {
		perSource = 0
	}
	return &backlog{max: max, perSource: perSource,
		bySrc: make(map[netip.Addr]int), ready: make(chan struct{}, 1)}
}

// admit decides whether a request from src may be queued at now, and
// makes room when the rules above say so: the victim it returns is out of
// the backlog, unanswered, and the caller refuses it; so are the expired
// requests, taken out first as they hold no place. Only the CM's handler
// admits and queues (the device's cm.Manager runs its handlers one at a
// time), so the room admit sees or makes stays until the handler pushes:
// Accept and drain only take requests out.
func (b *backlog) admit(src netip.Addr, now time.Time) (adm admission, victim *Request, expired []*Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.rearmLocked()
	expired = b.expireLocked(now)
	n := b.bySrc[src]
	if b.perSource > 0 && n >= b.perSource {
		return sourceFull, nil, expired
	}
	if len(b.reqs) < b.max {
		return admitted, nil, expired
	}
	// The heaviest source; among equals the one whose oldest request is
	// oldest (the first met walking the queue from its head).
	vi := -1
	for i, r := range b.reqs {
		if vi < 0 || b.bySrc[r.source()] > b.bySrc[b.reqs[vi].source()] {
			vi = i
		}
	}
	victim = b.reqs[vi]
	if b.bySrc[victim.source()] < n+2 {
		return backlogFull, nil, expired // moving one would only swap who is heavier
	}
	b.removeLocked(vi)
	return admitEvicted, victim, expired
}

// push queues r; false when the backlog is full (a handler that did not
// admit, or two handlers at once).
func (b *backlog) push(r *Request) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.reqs) >= b.max {
		return false
	}
	b.reqs = append(b.reqs, r)
	b.bySrc[r.source()]++
	b.signalLocked()
	b.rearmLocked()
	return true
}

// take takes the oldest request whose active side may still be waiting
// at now, nil if there is none; the expired ones are taken out too and
// returned, for the caller to refuse.
func (b *backlog) take(now time.Time) (r *Request, expired []*Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.rearmLocked()
	expired = b.expireLocked(now)
	if len(b.reqs) == 0 {
		return nil, expired
	}
	r = b.reqs[0]
	b.removeLocked(0)
	b.signalLocked() // another Accept may be waiting for the next
	return r, expired
}

// pop takes the oldest request, expired or not, nil if there is none.
func (b *backlog) pop() *Request {
	r, _ := b.take(time.Time{}) // the zero time: nothing has expired
	return r
}

// expireLocked takes the requests expired at now out of the queue,
// wherever they are (their REQs' timeouts differ), oldest first.
func (b *backlog) expireLocked(now time.Time) (expired []*Request) {
	kept := b.reqs[:0]
	for _, r := range b.reqs {
		if !r.expired(now) {
			kept = append(kept, r)
			continue
		}
		expired = append(expired, r)
		src := r.source()
		if b.bySrc[src]--; b.bySrc[src] <= 0 {
			delete(b.bySrc, src)
		}
	}
	clear(b.reqs[len(kept):])
	b.reqs = kept
	return expired
}

// queued is how many requests wait.
func (b *backlog) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.reqs)
}

func (b *backlog) removeLocked(i int) {
	src := b.reqs[i].source()
	if b.bySrc[src]--; b.bySrc[src] <= 0 {
		delete(b.bySrc, src)
	}
	copy(b.reqs[i:], b.reqs[i+1:])
	b.reqs[len(b.reqs)-1] = nil
	b.reqs = b.reqs[:len(b.reqs)-1]
}

// signalLocked leaves a token for a waiting Accept while requests wait.
func (b *backlog) signalLocked() {
	if len(b.reqs) == 0 {
		return
	}
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// source is the address a request counts against in its listener's
// backlog.
func (r *Request) source() netip.Addr { return r.peerGID.Unmap() }

// Counters of the backlog's rules (Counters).
const (
	cntReqEvicted    = "req_evicted"
	cntReqSourceFull = "req_source_full"
)
