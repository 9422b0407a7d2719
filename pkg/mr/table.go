package mr

import (
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
)

// Table holds one device's protection domains, regions and windows and
// resolves their keys. It is safe for concurrent use: control operations
// (registration, binding, invalidation) serialise on a mutex, lookups are
// lock-free and allocation-free.
type Table struct {
	mu   sync.Mutex // control path
	rnd  io.Reader
	rbuf [4]byte // guarded by mu
	log  *slog.Logger

	mrs slots[MR]
	mws slots[MW]

	nextPD uint32 // guarded by mu
	numPD  int    // guarded by mu
	maxPD  int
}

// TableOption configures NewTable.
type TableOption func(*Table)

// WithLimits caps the number of live regions, windows and protection
// domains (rxe's pool sizes). Zero leaves a limit at its default.
func WithLimits(maxMR, maxMW, maxPD int) TableOption {
	return func(t *Table) {
		if maxMR > 0 {
			t.mrs.limit = min(maxMR, t.mrs.capacity())
		}
		if maxMW > 0 {
			t.mws.limit = min(maxMW, t.mws.capacity())
		}
		if maxPD > 0 {
			t.maxPD = maxPD
		}
	}
}

// WithLogger logs control-path rejections at debug level (nil = silent).
func WithLogger(l *slog.Logger) TableOption {
	return func(t *Table) { t.log = l }
}

// DefaultMaxPD is rxe's RXE_MAX_PD.
const DefaultMaxPD = 0x7ffc

// NewTable returns an empty table. Key parts are drawn from rnd one byte at
// a time; nil means crypto/rand. Tests inject a seeded source (for example
// math/rand/v2's ChaCha8) to get reproducible keys.
func NewTable(rnd io.Reader, opts ...TableOption) *Table {
	if rnd == nil {
		rnd = rand.Reader
	}
	t := &Table{rnd: rnd, maxPD: DefaultMaxPD}
	t.mrs.init(MinMRIndex, MaxMRIndex)
	t.mws.init(MinMWIndex, MaxMWIndex)
	for _, o := range opts {
		o(t)
	}
	return t
}

// newKeyPart returns a random key part different from last (rxe's
// rxe_get_next_key), so the previous key of a slot never becomes valid
// again. last < 0 means no constraint. Called with t.mu held.
func (t *Table) newKeyPart(last int) (uint8, error) {
	for range 1024 {
		if _, err := io.ReadFull(t.rnd, t.rbuf[:1]); err != nil {
			return 0, fmt.Errorf("mr: reading key randomness: %w", err)
		}
		if int(t.rbuf[0]) != last {
			return t.rbuf[0], nil
		}
	}
	return 0, fmt.Errorf("mr: key randomness source keeps repeating %#x", last)
}

func (t *Table) debug(msg string, args ...any) {
	if t.log != nil {
		t.log.Debug(msg, args...)
	}
}

// Counts reports the number of live protection domains, regions and
// windows.
func (t *Table) Counts() (pds, mrs, mws int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.numPD, t.mrs.count, t.mws.count
}

// slots is a lazily grown two-level index -> object table. Readers load
// without locks; writers hold Table.mu.
type slots[T any] struct {
	min, max uint32
	chunks   []atomic.Pointer[slotChunk[T]]
	count    int
	limit    int
}

const (
	chunkShift = 10
	chunkSize  = 1 << chunkShift
	chunkMask  = chunkSize - 1
)

type slotChunk[T any] [chunkSize]slot[T]

type slot[T any] struct {
	p       atomic.Pointer[T]
	used    bool  // guarded by Table.mu
	lastKey int16 // last key part handed out for this index, -1 none; Table.mu
}

func (s *slots[T]) init(lo, hi uint32) {
	s.min, s.max = lo, hi
	s.chunks = make([]atomic.Pointer[slotChunk[T]], (s.capacity()+chunkMask)/chunkSize)
	s.limit = s.capacity()
}

func (s *slots[T]) capacity() int { return int(s.max - s.min + 1) }

// get returns the object at index idx or nil. Lock-free.
func (s *slots[T]) get(idx uint32) *T {
	if idx < s.min || idx > s.max {
		return nil
	}
	pos := idx - s.min
	c := s.chunks[pos>>chunkShift].Load()
	if c == nil {
		return nil
	}
	return c[pos&chunkMask].p.Load()
}

// alloc reserves the first free index at or after position start
// (wrapping). The index is three quarters of the key (keys.go), so
// allocKey draws start at random: a peer that knows one key learns
// nothing of the next.
func (s *slots[T]) alloc(start uint32) (uint32, *slot[T], error) {
	if s.count >= s.limit {
		return 0, nil, wrapf(ErrNoResources, "%d of %d in use", s.count, s.limit)
	}
	n := uint32(s.capacity())
	for i := range n {
		pos := (start + i) % n
		ci := pos >> chunkShift
		c := s.chunks[ci].Load()
		if c == nil {
			c = new(slotChunk[T])
			for j := range c {
				c[j].lastKey = -1
			}
			s.chunks[ci].Store(c)
		}
		sl := &c[pos&chunkMask]
		if sl.used {
			continue
		}
		sl.used = true
		s.count++
		return s.min + pos, sl, nil
	}
	return 0, nil, wrapf(ErrNoResources, "no free index")
}

// allocKey reserves the next free index and draws its key. t.mu held.
func (s *slots[T]) allocKey(t *Table) (uint32, *slot[T], error) {
	if _, err := io.ReadFull(t.rnd, t.rbuf[:]); err != nil {
		return 0, nil, fmt.Errorf("mr: reading key randomness: %w", err)
	}
	idx, sl, err := s.alloc(randomPos(t.rbuf, uint32(s.capacity())))
	if err != nil {
		return 0, nil, err
	}
	key, err := sl.newKey(t, idx)
	if err != nil {
		s.free(idx)
		return 0, nil, err
	}
	return key, sl, nil
}

// newKey returns a key of index idx, the index of sl, whose key part
// differs from the last one handed out for it, and records that part.
// t.mu held.
func (sl *slot[T]) newKey(t *Table, idx uint32) (uint32, error) {
	part, err := t.newKeyPart(int(sl.lastKey))
	if err != nil {
		return 0, err
	}
	sl.lastKey = int16(part)
	return MakeKey(idx, part), nil
}

// slotOf returns the slot of an allocated index.
func (s *slots[T]) slotOf(idx uint32) *slot[T] {
	pos := idx - s.min
	return &s.chunks[pos>>chunkShift].Load()[pos&chunkMask]
}

// free releases an index; readers stop finding the object at once.
func (s *slots[T]) free(idx uint32) {
	sl := s.slotOf(idx)
	sl.p.Store(nil)
	sl.used = false
	s.count--
}
