package kv

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"

	"github.com/stretchr/testify/require"
)

func TestReadAheadFor(t *testing.T) {
	for _, tc := range []struct {
		inline bool
		n      int
		want   int
	}{
		{true, 40, 0}, // an inline value: read the bucket alone
		{true, 0, 0},
		{false, 1, 64},
		{false, 64, 64},
		{false, 65, 128},
		{false, 256, 256},
		{false, 300, 320},
	} {
		require.Equal(t, tc.want, readAheadFor(tc.inline, tc.n), "inline %v, %d bytes", tc.inline, tc.n)
	}
}

// A client reads a bucket's extent beside the bucket once its last value
// was out of line, and only then; a value longer than the guess gets a
// second READ for the rest.
func TestRDMAGetReadsAheadAfterAnOutOfLineValue(t *testing.T) {
	r := newRig(t)
	c := r.rdmaClient()
	ctx := ctxT(t)
	small, big, bigger := []byte("inline value"), bytes.Repeat([]byte("b"), 300), bytes.Repeat([]byte("B"), 500)
	require.NoError(t, c.Put(ctx, []byte("small"), small))
	require.NoError(t, c.Put(ctx, []byte("big"), big))
	require.NoError(t, c.Put(ctx, []byte("bigger"), bigger))

	for i, step := range []struct {
		key               string
		want              []byte
		reads, readAheads uint64
		bytesRead         uint64
	}{
		{"big", big, 2, 0, BucketSize + 300},             // nothing found yet: bucket, then value
		{"big", big, 2, 1, BucketSize + 320},             // both at once, 300 rounded up
		{"bigger", bigger, 3, 1, BucketSize + 320 + 180}, // the guess, then the rest
		{"big", big, 2, 1, BucketSize + 512},             // the guess is now 512
		{"small", small, 2, 1, BucketSize + 320},         // read ahead for nothing
		{"small", small, 1, 0, BucketSize},               // the last value was inline
		{"big", big, 2, 0, BucketSize + 300},
	} {
		before := c.Stats()
		v, err := c.Get(ctx, []byte(step.key))
		require.NoError(t, err, "step %d", i)
		require.Equal(t, step.want, v, "step %d", i)
		after := c.Stats()
		require.Equal(t, step.reads, after.Reads-before.Reads, "step %d: READs", i)
		require.Equal(t, step.readAheads, after.ReadAheads-before.ReadAheads, "step %d: read-aheads", i)
		require.Equal(t, step.bytesRead, after.BytesRead-before.BytesRead, "step %d: bytes read", i)
	}
	require.Zero(t, c.Stats().Retries())
}

// An extent read beside its bucket that holds a newer value than the
// bucket names (what a READ pair racing a PUT sees: the server writes the
// extent before the bucket's header) fails the bucket's checksum: stale,
// read again.
func TestRDMAReadAheadDetectsStaleValue(t *testing.T) {
	r := newRig(t)
	c := r.rdmaClient()
	ctx := ctxT(t)
	key, val := []byte("stale"), bytes.Repeat([]byte("o"), 300)
	require.NoError(t, c.Put(ctx, key, val))
	_, err := c.Get(ctx, key) // learns to read ahead
	require.NoError(t, err)
	require.Equal(t, 320, c.readAhead)

	at, _ := r.app.table.find(key)
	ext := r.app.table.extent(at)
	ext[100] = 'n'
	restored := 0
	c.afterBucketRead = func() {
		if restored == 0 {
			restored++
			ext[100] = 'o'
		}
	}
	before := c.Stats()
	v, err := c.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, val, v)
	require.Equal(t, 1, restored)
	after := c.Stats()
	require.Equal(t, uint64(1), after.RetryStale-before.RetryStale)
	require.Equal(t, uint64(2), after.ReadAheads-before.ReadAheads, "the retry reads ahead too")
}

// RDMAClientConfig.ReadAhead: negative never reads ahead (two round trips
// for every value out of line), positive always reads that much beside
// the bucket (capped at the extent size), even before the first GET and
// after an inline value.
func TestRDMAClientReadsAheadAsConfigured(t *testing.T) {
	r := newRig(t)
	ctx := ctxT(t)
	small, big := []byte("inline value"), bytes.Repeat([]byte("b"), 300)
	setup := r.rdmaClient()
	require.NoError(t, setup.Put(ctx, []byte("small"), small))
	require.NoError(t, setup.Put(ctx, []byte("big"), big))
	for _, tc := range []struct {
		readAhead int
		// per GET of big, small, big: READs posted and bytes they read
		reads, bytesRead []uint64
	}{
		{-1, []uint64{2, 1, 2}, []uint64{BucketSize + 300, BucketSize, BucketSize + 300}},
		{320, []uint64{2, 2, 2}, []uint64{BucketSize + 320, BucketSize + 320, BucketSize + 320}},
		{100000, []uint64{2, 2, 2}, []uint64{BucketSize + 512, BucketSize + 512, BucketSize + 512}}, // testTable's extent
	} {
		c, err := DialRDMA(ctx, r.cliDev, r.cmAddr, &RDMAClientConfig{ReadAhead: tc.readAhead})
		require.NoError(t, err)
		for i, key := range []string{"big", "small", "big"} {
			before := c.Stats()
			v, err := c.Get(ctx, []byte(key))
			require.NoError(t, err)
			require.Equal(t, map[string][]byte{"big": big, "small": small}[key], v)
			after := c.Stats()
			require.Equal(t, tc.reads[i], after.Reads-before.Reads, "read-ahead %d, GET %d: READs", tc.readAhead, i)
			require.Equal(t, tc.bytesRead[i], after.BytesRead-before.BytesRead, "read-ahead %d, GET %d: bytes", tc.readAhead, i)
		}
		require.NoError(t, c.Close())
	}
}

// Two READs in flight through a lossy, reordering, duplicating link: the
// requester's recovery (a lost bucket response, a lost extent response,
// a duplicate) must leave every GET with the value PUT under its key.
// Seeded, so the same datagrams are lost in every run.
func TestRDMAReadAheadThroughLoss(t *testing.T) {
	r := newRig(t)
	ctx := ctxT(t)
	dev := openDevWith(t, r.net, "10.0.0.3", ib.Config{Fault: &transport.FaultConfig{Loss: 0.05, Reorder: 0.05, Dup: 0.02, Seed: 14}})
	c, err := DialRDMA(ctx, dev, r.cmAddr, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	const keys = 20
	val := func(k int) []byte { return bytes.Repeat([]byte{byte('a' + k)}, 200+k*8) } // out of line, lengths differ
	for k := range keys {
		require.NoError(t, c.Put(ctx, []byte(fmt.Sprint("key", k)), val(k)))
	}
	for i := range 400 {
		k := i * 7 % keys
		v, err := c.Get(ctx, []byte(fmt.Sprint("key", k)))
		require.NoError(t, err, "GET %d", i)
		require.Equal(t, val(k), v, "GET %d of key%d", i, k)
	}
	st := c.Stats()
	require.Greater(t, st.ReadAheads, uint64(300), "most GETs read ahead")
	ctr := dev.Counters()
	t.Logf("read-aheads %d, READs %d; completer_retry_err %d, implied_naks %d, fast_retransmits %d",
		st.ReadAheads, st.Reads, ctr["completer_retry_err"], ctr["implied_naks"], ctr["fast_retransmits"])
	require.Positive(t, ctr["completer_retry_err"], "READs were re-issued after losses")
	require.Positive(t, ctr["implied_naks"], "a response that came while an earlier READ's was lost")
}
