//go:build !unix

package mr

import "errors"

var pageSize = 4096

var errNoMmap = errors.New("mr: memory mapping not supported on this platform")

// MapFile is not supported on this platform.
func MapFile(path string, size int, writable bool) (*Mapping, error) { return nil, errNoMmap }

// CreateMapFile is not supported on this platform.
func CreateMapFile(path string, size int) (*Mapping, error) { return nil, errNoMmap }

// MapAnonymous is not supported on this platform.
func MapAnonymous(size int) (*Mapping, error) { return nil, errNoMmap }

func msync(b []byte) error  { return errNoMmap }
func munmap(b []byte) error { return errNoMmap }
