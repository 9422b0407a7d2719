package kv

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// Table.write allocates nothing, for an inline value, one in its extent
// and a tombstone, and neither does Put: a PUT on the server (TCP or
// RDMA) costs the table no garbage. Bug (workload review, task BF): write built the bucket's new
// header in a local array, which escaped to the heap because
// crc32.Update's Castagnoli path leaks its slice: one 128-byte
// allocation per PUT and DELETE.
func TestTableWriteAllocatesNothing(t *testing.T) {
	tab, err := NewTable(TableConfig{NBuckets: 64, ExtentSize: 256, MaxProbe: 4})
	require.NoError(t, err)
	defer tab.Close()
	key := []byte("key")
	for name, val := range map[string][]byte{
		"inline": []byte("an inline value"),
		"extent": bytes.Repeat([]byte("x"), 200),
	} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, tab.Put(key, val))
			at, _ := tab.find(key)
			require.GreaterOrEqual(t, at, 0)
			tab.mu.Lock()
			allocs := testing.AllocsPerRun(100, func() { tab.write(at, key, val, false) })
			tombstone := testing.AllocsPerRun(100, func() { tab.write(at, key, nil, true) })
			tab.write(at, key, val, false)
			tab.mu.Unlock()
			require.Zero(t, allocs, "allocations per write")
			require.Zero(t, tombstone, "allocations per tombstone write")
			got, err := tab.Get(key)
			require.NoError(t, err)
			require.Equal(t, val, got)
			require.Equal(t, verdictOK, tab.bucket(at).check(tab.cfg.ExtentSize))
			putAllocs := testing.AllocsPerRun(100, func() {
				if err := tab.Put(key, val); err != nil {
					t.Fatal(err)
				}
			})
			require.Zero(t, putAllocs, "allocations per Put")
		})
	}
}
