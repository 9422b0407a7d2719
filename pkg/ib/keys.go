package ib

import "github.com/rxed/rxed/pkg/mr"

// IncRKey returns key with its low 8 bits (the consumer-owned key part)
// incremented, like ibv_inc_rkey: the usual new key of a memory window
// bind (MWBindInfo.NewRKey) or a fast registration (RegMRInfo.NewKey).
// A window or region keeps its index, so a peer still holding the old
// key is refused.
func IncRKey(key uint32) uint32 { return mr.IncKey(key) }
