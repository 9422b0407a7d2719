package roce

import (
	"sync"
	"sync/atomic"
)

// cowList is a copy-on-write list for sets that are read on every packet
// or poll and changed rarely (engines created and closed): readers load
// it without a lock, writers serialise on mu and publish a new slice.
// The zero value is an empty list.
type cowList[T comparable] struct {
	mu sync.Mutex
	p  atomic.Pointer[[]T]
}

// load returns the current elements; the slice must not be modified.
func (l *cowList[T]) load() []T {
	if p := l.p.Load(); p != nil {
		return *p
	}
	return nil
}

// add appends x.
func (l *cowList[T]) add(x T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := l.load()
	next := append(append(make([]T, 0, len(cur)+1), cur...), x)
	l.p.Store(&next)
}

// remove drops every element equal to x.
func (l *cowList[T]) remove(x T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := l.load()
	next := make([]T, 0, len(cur))
	for _, y := range cur {
		if y != x {
			next = append(next, y)
		}
	}
	l.p.Store(&next)
}
