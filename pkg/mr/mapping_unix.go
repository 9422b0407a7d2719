//go:build unix

package mr

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

var pageSize = os.Getpagesize()

// MapFile maps size bytes of the file at path, shared, so that writes
// through a region land in the file (after Sync or Region.Persist they are
// durable). size <= 0 maps the whole file. The file must exist and hold at
// least size bytes (ErrFileTooSmall; a missing file gives an error that
// matches os.ErrNotExist).
func MapFile(path string, size int, writable bool) (*Mapping, error) {
	flag := os.O_RDONLY
	prot := unix.PROT_READ
	if writable {
		flag = os.O_RDWR
		prot |= unix.PROT_WRITE
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("mr: map %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("mr: map %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, wrapf(ErrInvalidArgument, "map %s: not a regular file", path)
	}
	if size <= 0 {
		size = int(fi.Size())
	}
	if size == 0 {
		return nil, wrapf(ErrEmptyBuffer, "map %s: empty file", path)
	}
	if fi.Size() < int64(size) {
		return nil, wrapf(ErrFileTooSmall, "map %s: file has %d bytes, %d requested", path, fi.Size(), size)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mr: mmap %s: %w", path, err)
	}
	return track(&Mapping{b: b, path: path, writable: writable, file: true}), nil
}

// CreateMapFile opens or creates the file at path (mode 0600 when created),
// grows it to size bytes if it is shorter (never shrinks it) and maps size
// bytes writable, as MapFile. With a path under /dev/shm this is POSIX
// shared memory.
func CreateMapFile(path string, size int) (*Mapping, error) {
	if size <= 0 {
		return nil, wrapf(ErrEmptyBuffer, "map %s: %d bytes", path, size)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("mr: create %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() < int64(size) {
		err = f.Truncate(int64(size))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("mr: create %s: %w", path, err)
	}
	return MapFile(path, size, true)
}

// MapAnonymous maps size bytes of zeroed anonymous memory shared with
// forked children (MAP_SHARED|MAP_ANONYMOUS), page aligned, outside the Go
// heap.
func MapAnonymous(size int) (*Mapping, error) {
	if size <= 0 {
		return nil, wrapf(ErrEmptyBuffer, "anonymous mapping of %d bytes", size)
	}
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mr: mmap anonymous: %w", err)
	}
	return track(&Mapping{b: b, writable: true}), nil
}

func msync(b []byte) error {
	if err := unix.Msync(b, unix.MS_SYNC); err != nil {
		return fmt.Errorf("mr: msync: %w", err)
	}
	return nil
}

func munmap(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("mr: munmap: %w", err)
	}
	return nil
}

// track adds a new mapping to openMappings. It lives here because only
// this platform's constructors make mappings; elsewhere openMappings stays
// empty.
func track(m *Mapping) *Mapping {
	openMappings.Lock()
	defer openMappings.Unlock()
	if openMappings.set == nil {
		openMappings.set = make(map[*Mapping]struct{})
	}
	openMappings.set[m] = struct{}{}
	return m
}
