package kv

import (
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"

	"github.com/rxed/rxed/pkg/mr"
)

// Errors of the store, the same over RDMA and TCP.
var (
	ErrNotFound   = errors.New("kv: key not found")
	ErrFull       = errors.New("kv: no free bucket in the key's probe window")
	ErrKeyLen     = fmt.Errorf("kv: key must be 1..%d bytes", MaxKey)
	ErrValueLen   = errors.New("kv: value longer than the table's extent size")
	ErrContention = errors.New("kv: GET kept reading a bucket being written (retries exhausted)")
)

// TableConfig sizes a table. Zero fields take the defaults.
type TableConfig struct {
	// NBuckets is the number of index buckets (default 4096).
	NBuckets int
	// ExtentSize is the largest value (default 1024); each bucket owns one
	// extent of this size.
	ExtentSize int
	// MaxProbe is how many buckets from the home bucket a key may live in
	// (default 16).
	MaxProbe int
}

func (c TableConfig) withDefaults() TableConfig {
	if c.NBuckets == 0 {
		c.NBuckets = 4096
	}
	if c.ExtentSize == 0 {
		c.ExtentSize = 1024
	}
	if c.MaxProbe == 0 {
		c.MaxProbe = 16
	}
	c.MaxProbe = min(c.MaxProbe, c.NBuckets)
	return c
}

// Table is the store's memory: the index and the extents in one mapping.
//
// mu serialises writers (Put, Delete) against each other and against
// local readers (Get); RDMA readers never take it and rely on the
// version and checksums instead.
type Table struct {
	cfg TableConfig
	mem *mr.Mapping
	b   []byte // mem.Bytes()

	mu sync.RWMutex
	// hdr is write's scratch header, used under mu. A local array escaped
	// to the heap (crc32.Update's Castagnoli path leaks its slice): one
	// allocation per PUT and DELETE (TestTableWriteAllocatesNothing).
	hdr [BucketSize]byte

	// midWrite, if set (tests), runs while a write is half done: the
	// version is odd and half of the value is in place.
	midWrite func()
}

// NewTable maps a zeroed table of the given size.
func NewTable(cfg TableConfig) (*Table, error) {
	cfg = cfg.withDefaults()
	if cfg.NBuckets < 1 || cfg.ExtentSize < InlineMax || cfg.ExtentSize > MaxExtent || cfg.ExtentSize%8 != 0 {
		return nil, fmt.Errorf("kv: bad table config %+v (extent size %d to %d, a multiple of 8)", cfg, InlineMax, MaxExtent)
	}
	m, err := mr.MapAnonymous(cfg.NBuckets * (BucketSize + cfg.ExtentSize))
	if err != nil {
		return nil, err
	}
	return &Table{cfg: cfg, mem: m, b: m.Bytes()}, nil
}

// Config returns the table's sizes.
func (t *Table) Config() TableConfig { return t.cfg }

// Memory is the table's memory, for registering as a region.
func (t *Table) Memory() []byte { return t.b }

// Close unmaps the table. Nothing may use it afterwards.
func (t *Table) Close() error { return t.mem.Close() }

// indexLen is the size of the index; the extents follow it.
func (t *Table) indexLen() int { return t.cfg.NBuckets * BucketSize }

func (t *Table) bucket(i int) bucket { return bucket(t.b[i*BucketSize : (i+1)*BucketSize]) }

func (t *Table) extent(i int) []byte {
	off := t.indexLen() + i*t.cfg.ExtentSize
	return t.b[off : off+t.cfg.ExtentSize]
}

// home is the bucket a key hashes to (FNV-1a, the same on every client).
func home(key []byte, nbuckets int) int {
	h := fnv.New64a()
	h.Write(key)
	return int(h.Sum64() % uint64(nbuckets))
}

func checkKey(key []byte) error {
	if len(key) == 0 || len(key) > MaxKey {
		return ErrKeyLen
	}
	return nil
}

// find returns the bucket holding key (or -1) and the first bucket a new
// key could take (or -1). Called with mu held.
func (t *Table) find(key []byte) (at, free int) {
	at, free = -1, -1
	h := home(key, t.cfg.NBuckets)
	for p := range t.cfg.MaxProbe {
		i := (h + p) % t.cfg.NBuckets
		b := t.bucket(i)
		if b.version() == 0 {
			if free < 0 {
				free = i
			}
			return at, free // a key never lives past a never-used bucket
		}
		if b.flags()&flagTombstone != 0 {
			if free < 0 {
				free = i
			}
			continue
		}
		if string(b.key()) == string(key) {
			return i, free
		}
	}
	return at, free
}

// Put stores val under key, in place if the key exists.
func (t *Table) Put(key, val []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if len(val) > t.cfg.ExtentSize {
		return ErrValueLen
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	at, free := t.find(key)
	if at < 0 {
		at = free
	}
	if at < 0 {
		return ErrFull
	}
	t.write(at, key, val, false)
	return nil
}

// Delete removes key, leaving a tombstone.
func (t *Table) Delete(key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	at, _ := t.find(key)
	if at < 0 {
		return ErrNotFound
	}
	t.write(at, key, nil, true)
	return nil
}

// write updates bucket i with the version protocol: odd version, value,
// header (with the next even version inside its checksum), even version.
// Called with mu held.
func (t *Table) write(i int, key, val []byte, tombstone bool) {
	b := t.bucket(i)
	v := b.version()
	next := (v | 1) + 1
	atomic.StoreUint64(b.atomicVersion(), v|1)

	hdr := &t.hdr
	clear(hdr[:])
	h := bucket(hdr[:])
	h[offFlags] = flagUsed
	if tombstone {
		h[offFlags] |= flagTombstone
	}
	h[offKeyLen] = byte(len(key))
	copy(hdr[offKey:], key)
	putU32(hdr[offValLen:], uint32(len(val)))
	putU32(hdr[offValCRC:], crc32c(val))
	putU64(hdr[offVersion:], next)
	dst := t.extent(i)
	if len(val) <= InlineMax {
		h[offFlags] |= flagInline
		dst = hdr[offInline:]
	}
	half := len(val) / 2
	copy(dst, val[:half])
	if t.midWrite != nil {
		if len(val) <= InlineMax {
			copy(b[offInline:], val[:half]) // make the half-write visible in place
		}
		t.midWrite()
	}
	copy(dst[half:], val[half:])
	putU32(hdr[offHdrCRC:], h.computeHdrCRC())
	copy(b[offFlags:], hdr[offFlags:])
	atomic.StoreUint64(b.atomicVersion(), next)
}

// Get returns a copy of key's value, reading under the table's lock (the
// TCP server's path).
func (t *Table) Get(key []byte) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	at, _ := t.find(key)
	if at < 0 {
		return nil, ErrNotFound
	}
	b := t.bucket(at)
	if b.flags()&flagInline != 0 {
		return append([]byte(nil), b.inline()...), nil
	}
	return append([]byte(nil), t.extent(at)[:b.valLen()]...), nil
}

// appendGet appends key's value to dst (no allocation for the TCP
// server's response), reporting whether the key exists.
func (t *Table) appendGet(dst, key []byte) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return dst, err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	at, _ := t.find(key)
	if at < 0 {
		return dst, ErrNotFound
	}
	b := t.bucket(at)
	if b.flags()&flagInline != 0 {
		return append(dst, b.inline()...), nil
	}
	return append(dst, t.extent(at)[:b.valLen()]...), nil
}
