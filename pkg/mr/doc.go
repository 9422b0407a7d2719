// Package mr implements the memory side of the verbs model: protection
// domains, memory regions (over Go byte slices or mmap'd files and shared
// memory), memory windows (type 1 and 2B), fast registration, local and
// remote invalidation, the lkey/rkey tables the data path resolves keys in,
// and the 64-bit atomics the responder executes.
//
// Keys are made as rdma_rxe makes them: an object index in the upper 24 bits
// and an 8-bit key part in the low byte. Key parts come from an injected
// random source and change on every (re)registration or (re)binding, so a
// stale key of a deregistered, re-registered or invalidated object fails.
//
// The data path resolves keys with [Table.Lookup] (or [Table.LookupQP] when
// type 2 windows must be honoured), which allocates nothing and returns a
// reference-counted [Region]; releasing the region is what allows memory
// that was deregistered while in use to be returned (an mmap'd file is only
// unmapped after every region over it is released).
//
// Failures are sentinel errors (ErrInvalidKey, ErrPDMismatch, ErrAccess,
// ErrRange, ErrAlign, ErrInvalidated and the registration errors) that
// [LocalStatus], [RemoteStatus] and [RemoteNAK] map to libibverbs work
// completion statuses and AETH NAK codes the way rdma_rxe does.
package mr
