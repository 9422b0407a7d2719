package kv

import "context"

// Reading ahead: a GET of a value kept out of line needs its bucket (for
// the key, the length and the value's checksum) and then its extent, two
// round trips if the second READ waits for the first. Both addresses are
// known before either READ (the extent is the bucket's own), so a client
// may post both at once, reading a guessed length of the extent: the
// responder answers them in order in one round trip, and the client pays
// one post and one completion (the bucket's READ is unsignaled; an RC
// QP's completions come in order, so the extent's says both are done).
//
// The two READs are not atomic with each other, and need not be: the
// value is accepted only if its CRC32C is the one the verified bucket
// names, the same check that catches a value changed between two
// sequential READs (RetryStale). A value longer than the guess gets a
// second READ for the rest, and the whole is checked as one.
//
// The guess is the length of the last value this client found out of
// line, rounded up to readAheadAlign: values of one store tend to be of
// one size. A client whose last value was inline (or that has found none
// yet) reads the bucket alone, so stores of small values pay nothing.
// RDMAClientConfig.ReadAhead fixes the length instead, or turns reading
// ahead off.
// Pilaf reads the bucket first; FaRM inlines small values in the bucket
// instead, which costs index memory for every key.

// readsInFlight is the client's RDMA READ depth (its initiator depth):
// a bucket and its extent.
const readsInFlight = 2

// readAheadAlign rounds the guessed length up, so values whose lengths
// differ a little share one guess.
const readAheadAlign = 64

// nextReadAhead is the read-ahead after a GET found a value of n bytes,
// inline or not (RDMAClientConfig.ReadAhead).
func (c *RDMAClient) nextReadAhead(inline bool, n int) int {
	switch {
	case c.cfg.ReadAhead < 0:
		return 0
	case c.cfg.ReadAhead > 0:
		return c.cfg.ReadAhead
	}
	return readAheadFor(inline, n)
}

// readAheadFor is the adaptive read-ahead after a GET found a value of n
// bytes, inline or not.
func readAheadFor(inline bool, n int) int {
	if inline {
		return 0
	}
	return (n + readAheadAlign - 1) / readAheadAlign * readAheadAlign
}

// readBucket reads bucket i into the buffer and, when ahead > 0, the first
// ahead bytes of its extent beside it, in one round trip.
func (c *RDMAClient) readBucket(ctx context.Context, i, ahead int) error {
	bucket := span{0, c.h.bucketAddr(i), BucketSize}
	if ahead == 0 {
		return c.read(ctx, bucket)
	}
	return c.read(ctx, bucket, span{c.offValue(), c.h.extentAddr(i), ahead})
}
