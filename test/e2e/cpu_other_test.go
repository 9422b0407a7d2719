//go:build !unix

package e2e

import "time"

// processCPU is unknown here (no getrusage): cpu-ratio reads NaN.
func processCPU() time.Duration { return 0 }

// contextSwitches is unknown here: cs/rtt reads 0.
func contextSwitches() int64 { return 0 }
