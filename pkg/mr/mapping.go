package mr

import (
	"sync"
	"unsafe"
)

// Mapping is memory mapped from a file or shared memory, for registering
// as a region (with WithMapping) and exporting, e.g. by `rxed serve`.
//
// Locks: mu guards b, pins and closed. A goroutine that needs both takes
// openMappings (the process's list, below) before mu: mappingOf holds the
// list while it looks at each mapping, and Close takes the list first to
// take the mapping out of it. Close once held mu while it took the list,
// which deadlocked with a concurrent RegMR (TestMappingCloseWhileLookingUp).
type Mapping struct {
	mu       sync.Mutex
	b        []byte
	path     string
	writable bool
	file     bool // backed by a named file (msync persists it)
	pins     int
	closed   bool
}

// Bytes returns the mapped memory (nil after Close).
func (m *Mapping) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.b
}

// Len is the mapping's length in bytes.
func (m *Mapping) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.b)
}

// Path is the file the mapping comes from ("" for anonymous memory).
func (m *Mapping) Path() string { return m.path }

// Writable reports whether the mapping may be written.
func (m *Mapping) Writable() bool { return m.writable }

// Sync flushes the whole mapping to its file (msync MS_SYNC); a no-op for
// read-only and anonymous mappings.
func (m *Mapping) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return wrapf(ErrMappingClosed, "%s", m.path)
	}
	if !m.writable || !m.file {
		return nil
	}
	return msync(m.b)
}

// Close unmaps the memory. It fails with ErrMappingBusy while regions are
// registered over it (or Regions of deregistered ones are still held), and
// with ErrMappingClosed the second time.
func (m *Mapping) Close() error {
	// openMappings before m.mu, as mappingOf takes them (see Mapping);
	// the list is let go before munmap, which may take a while.
	openMappings.Lock()
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	switch {
	case m.closed:
		err = wrapf(ErrMappingClosed, "%s", m.path)
	case m.pins > 0:
		err = wrapf(ErrMappingBusy, "%s: %d region versions", m.path, m.pins)
	default:
		delete(openMappings.set, m)
	}
	openMappings.Unlock()
	if err != nil {
		return err
	}
	err = munmap(m.b)
	m.b, m.closed = nil, true
	return err
}

func (m *Mapping) persistable() bool { return m.writable && m.file }

// openMappings lists the live mappings so that RegMR can pin the mapping a buffer
// lies in even without WithMapping: unmapping memory a region still refers
// to would crash the process instead of failing a lookup.
var openMappings struct {
	sync.Mutex
	set map[*Mapping]struct{}
}

// mappingOf returns the open mapping buf lies in, or nil.
func mappingOf(buf []byte) *Mapping {
	openMappings.Lock()
	defer openMappings.Unlock()
	for m := range openMappings.set {
		m.mu.Lock()
		in := !m.closed && within(m.b, buf)
		m.mu.Unlock()
		if in {
			return m
		}
	}
	return nil
}

// pin records a region version over buf, which must lie in the mapping.
func (m *Mapping) pin(buf []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return wrapf(ErrMappingClosed, "%s", m.path)
	}
	if !within(m.b, buf) {
		return wrapf(ErrNotInMapping, "%s", m.path)
	}
	m.pins++
	return nil
}

func (m *Mapping) unpin() {
	m.mu.Lock()
	m.pins--
	m.mu.Unlock()
}

// syncRange msyncs the pages covering b, which lies in the mapping and is
// kept mapped by the caller's pin.
func (m *Mapping) syncRange(b []byte) error {
	if !m.writable || !m.file {
		return nil
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.b)))
	start := uintptr(unsafe.Pointer(&b[0])) - base
	end := start + uintptr(len(b))
	start &^= uintptr(pageSize - 1)
	return msync(m.b[start:end])
}

// within reports whether inner is a sub-slice of outer's memory.
func within(outer, inner []byte) bool {
	if len(inner) == 0 || len(outer) == 0 {
		return false
	}
	o := uintptr(unsafe.Pointer(unsafe.SliceData(outer)))
	i := uintptr(unsafe.Pointer(unsafe.SliceData(inner)))
	return i >= o && i-o < uintptr(len(outer)) && uintptr(len(inner)) <= uintptr(len(outer))-(i-o)
}
