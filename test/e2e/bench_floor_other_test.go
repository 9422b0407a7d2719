//go:build !linux

package e2e

import "testing"

// sysFloorRTT has no portable form (recvmmsg, UDP GSO and GRO): the
// benchmarks leave the floor metrics out.
func sysFloorRTT(testing.TB, int, []int, []int) *rtts { return nil }

func reportVsFloor(*testing.B, *rtts, *rtts) {}
