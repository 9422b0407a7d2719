//go:build !unix

package e2e

import "time"

// processCPU is unknown here (no getrusage): cpu-ratio reads NaN.
func processCPU() time.Duration { return 0 }
