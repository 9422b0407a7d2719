//go:build !linux

package transport

func probeOffloadsForTest() (gso, gro bool) { return false, false }
