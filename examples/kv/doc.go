// Package kv is a Pilaf-style key-value store on rxed: GETs are served by
// one-sided RDMA READs that never run server code, PUTs and DELETEs are
// SENDs the server applies in place, and the same table is served over TCP
// (request/response on a net.Conn) so the two designs can be measured side
// by side in one run.
//
// # The table
//
// The server's table is one memory region (mmap'd, outside the Go heap, so
// the engine reads it the way a NIC DMAs host memory): a fixed-size hash
// index of 128-byte buckets followed by one value extent per bucket.
//
//	index   [NBuckets]bucket   (bucket.go: version, flags, lengths, CRCs, key, inline value)
//	extents [NBuckets][ExtentSize]byte
//
// A key hashes to a home bucket and lives in the first of MaxProbe buckets
// from there (linear probing; DELETE leaves a tombstone, so probes pass it).
// Values of at most InlineMax bytes live in the bucket (a GET is one READ),
// larger ones in the bucket's extent (two READs: bucket and value). A
// client whose last value was out of line posts both READs at once, one
// round trip (readahead.go); otherwise it reads the value after its bucket.
//
// # Why a reader can trust what it read
//
// The server writes a bucket the seqlock way: version odd while writing,
// the next even number when done. A one-sided reader cannot take a lock nor
// re-read the version atomically with the data, so each bucket carries two
// CRC32C checksums (Pilaf's self-verifying entries): one over the header and
// key (including the version and the value's checksum), one over the value.
// A READ that raced the writer sees an odd version, a header whose checksum
// does not match (torn), or a value whose checksum is not the one its bucket
// names (the extent changed after the bucket was read: stale). Each is
// retried; the client counts which. The chance that a torn read passes both
// checks is about 2^-32 per torn read.
//
// # Goroutines
//
// Table writes are serialised by the table's mutex (the server's handler is
// the only writer); RDMA readers take no lock. A Client is used by one
// goroutine at a time; open one per goroutine, each gets its own RC QP.
//
// # Waiting
//
// A client waits for its READ the hybrid way (ib.HybridWaiter): it spins
// on its CQ for a bounded budget, its polls receiving the reply, and
// sleeps only when none came (RDMAClientConfig.Spin). The server's
// engine answers a READ with no application turn at all, so nothing
// polls the server's device between GETs: rxed kv serve opens it with
// ib.Config.BusyPoll, which keeps the engine polling its socket while
// GETs come in, as a NIC never sleeps (a program of its own serving with
// ServeRDMA should do the same). With both, one client's GET through two
// processes takes 12 us at the median against TCP's 51-63 us on the
// 2-core VM; with both ends sleeping, each GET paid two thread wake-ups
// and took 78-118 us (docs/performance.md, session X). Many clients on
// one device (rxed kv bench's 16 connections) post and spin together:
// with ib.Config.DoorbellBatch their READ requests leave in one send, and
// the server's answers then leave together too.
package kv
