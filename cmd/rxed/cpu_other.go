//go:build !unix

package main

import (
	"errors"
	"time"
)

// processCPU is this process's user+system CPU time: not measured here
// (no getrusage); the kv benchmark then reports no CPU per operation.
func processCPU() (time.Duration, error) {
	return 0, errors.New("process CPU time: not available on this platform")
}
