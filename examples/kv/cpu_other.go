//go:build !linux

package kv

// threadCPU is not measured on this platform.
func threadCPU() uint64 { return 0 }
