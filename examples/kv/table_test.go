package kv

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTablePutGetDelete(t *testing.T) {
	tab, err := NewTable(TableConfig{NBuckets: 64, ExtentSize: 256, MaxProbe: 4})
	require.NoError(t, err)
	defer tab.Close()

	_, err = tab.Get([]byte("a"))
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, tab.Put([]byte("a"), []byte("inline")))
	big := bytes.Repeat([]byte("x"), 200)
	require.NoError(t, tab.Put([]byte("b"), big))
	v, err := tab.Get([]byte("a"))
	require.NoError(t, err)
	require.Equal(t, "inline", string(v))
	v, err = tab.Get([]byte("b"))
	require.NoError(t, err)
	require.Equal(t, big, v)

	// In place: a's bucket and version move on, nothing else does.
	at, _ := tab.find([]byte("a"))
	v0 := tab.bucket(at).version()
	require.NoError(t, tab.Put([]byte("a"), big))
	at2, _ := tab.find([]byte("a"))
	require.Equal(t, at, at2)
	require.Equal(t, v0+2, tab.bucket(at).version())
	require.Zero(t, tab.bucket(at).version()&1)

	require.NoError(t, tab.Delete([]byte("a")))
	_, err = tab.Get([]byte("a"))
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, tab.Delete([]byte("a")), ErrNotFound)
	require.NotZero(t, tab.bucket(at).flags()&flagTombstone)
}

func TestTableBadInput(t *testing.T) {
	tab, err := NewTable(TableConfig{NBuckets: 8, ExtentSize: 128, MaxProbe: 2})
	require.NoError(t, err)
	defer tab.Close()
	require.ErrorIs(t, tab.Put(nil, []byte("v")), ErrKeyLen)
	require.ErrorIs(t, tab.Put(bytes.Repeat([]byte("k"), MaxKey+1), nil), ErrKeyLen)
	require.ErrorIs(t, tab.Put([]byte("k"), make([]byte, 129)), ErrValueLen)
	_, err = NewTable(TableConfig{NBuckets: 8, ExtentSize: 60})
	require.Error(t, err)

	// Fill every bucket: the next new key finds no room in its window.
	for i := 0; ; i++ {
		err := tab.Put(fmt.Appendf(nil, "key%d", i), []byte("v"))
		if err != nil {
			require.ErrorIs(t, err, ErrFull)
			break
		}
		require.Less(t, i, 8, "more keys than buckets fit")
	}
}

// A reader's copy of a bucket is classified by its version and checksums,
// whatever bytes a racing write left in it.
func TestBucketCheck(t *testing.T) {
	tab, err := NewTable(TableConfig{NBuckets: 8, ExtentSize: 128})
	require.NoError(t, err)
	defer tab.Close()
	require.NoError(t, tab.Put([]byte("key"), []byte("value")))
	at, _ := tab.find([]byte("key"))
	good := append(bucket(nil), tab.bucket(at)...)
	require.Equal(t, verdictOK, good.check(128))
	require.Equal(t, verdictEmpty, bucket(make([]byte, BucketSize)).check(128))

	cases := map[string]struct {
		mutate func(b bucket)
		want   readVerdict
	}{
		"odd version":    {func(b bucket) { b[offVersion] |= 1 }, verdictWriting},
		"torn key":       {func(b bucket) { b[offKey] ^= 0xff }, verdictTorn},
		"torn version":   {func(b bucket) { b[offVersion] += 2 }, verdictTorn},
		"torn value crc": {func(b bucket) { b[offValCRC] ^= 1 }, verdictTorn},
		"torn flags":     {func(b bucket) { b[offFlags] ^= flagTombstone }, verdictTorn},
		"key too long":   {func(b bucket) { b[offKeyLen] = MaxKey + 1 }, verdictBadLength},
		"value too long": {func(b bucket) { putU32(b[offValLen:], 129) }, verdictBadLength},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b := append(bucket(nil), good...)
			c.mutate(b)
			require.Equal(t, c.want, b.check(128))
		})
	}
	// A torn inline value passes the header check but not the value's.
	b := append(bucket(nil), good...)
	b[offInline] ^= 1
	require.Equal(t, verdictOK, b.check(128))
	require.NotEqual(t, b.valCRC(), crc32c(b.inline()))
}

func TestRequestParseTruncated(t *testing.T) {
	msg := appendRequest(nil, opPut, 7, []byte("key"), []byte("value"))
	r, err := parseRequest(msg)
	require.NoError(t, err)
	require.Equal(t, request{op: opPut, id: 7, key: []byte("key"), val: []byte("value")}, r)
	for n := range len(msg) {
		_, err := parseRequest(msg[:n])
		require.ErrorIs(t, err, errBadRequest, "prefix %d", n)
	}
	_, err = parseRequest(append(msg, 0))
	require.ErrorIs(t, err, errBadRequest)
}

func TestHelloParse(t *testing.T) {
	h := hello{epoch: 9, rkey: 0x1234, nbuckets: 64, indexAddr: 0x7f0000, extentSize: 512, maxProbe: 8, maxMsg: 556}
	b := h.append(nil)
	require.Len(t, b, helloLen)
	got, err := parseHello(b)
	require.NoError(t, err)
	require.Equal(t, h, got)
	for n := range helloLen {
		_, err := parseHello(b[:n])
		require.Error(t, err, "prefix %d", n)
	}
	_, err = parseHello(make([]byte, 196)) // a REP from something else: zeros
	require.ErrorIs(t, err, errNotKV)
	bad := append([]byte(nil), b...)
	bad[4] = 9
	_, err = parseHello(bad)
	require.ErrorContains(t, err, "layout 9")

	// Sizes the client would allocate and register: bounded by what a
	// table can have (fuzz audit, session AG: a bogus server naming a
	// 4 GiB extent and message made the client allocate 8 GiB).
	for _, big := range []hello{
		{nbuckets: 1, extentSize: MaxExtent + 8, maxProbe: 1, maxMsg: reqHdrLen + MaxKey},
		{nbuckets: 1, extentSize: 1<<32 - 8, maxProbe: 1, maxMsg: 1<<32 - 1},
		{nbuckets: 1, extentSize: InlineMax, maxProbe: 1, maxMsg: reqHdrLen + MaxKey + MaxExtent + 1},
	} {
		_, err := parseHello(big.append(nil))
		require.ErrorContains(t, err, "unusable table", "%+v", big)
	}
	ok := hello{nbuckets: 1, extentSize: MaxExtent, maxProbe: 1, maxMsg: reqHdrLen + MaxKey + MaxExtent}
	_, err = parseHello(ok.append(nil))
	require.NoError(t, err, "the largest table a server can have")
	_, err = NewTable(TableConfig{NBuckets: 1, ExtentSize: MaxExtent + 8})
	require.ErrorContains(t, err, "bad table config")
}

func FuzzParseRequest(f *testing.F) {
	f.Add(appendRequest(nil, opPut, 1, []byte("k"), []byte("v")))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRequest(b)
		if err == nil {
			require.Len(t, b, reqHdrLen+len(r.key)+len(r.val))
			// Compared as strings: an empty key and value give a nil
			// slice, the input an empty one (a fuzz finding).
			require.Equal(t, string(b[reqHdrLen:]), string(r.key)+string(r.val))
		}
	})
}

// FuzzParseHello: the table description a client reads from the server's
// REP private data. What parseHello accepts is a usable table (buckets, a
// probe, extents that hold an inline value, messages that hold a header
// and a key) and re-encodes to the input's first helloLen bytes but the
// reserved u16, which it ignores; anything else is refused, never a panic.
func FuzzParseHello(f *testing.F) {
	f.Add(hello{epoch: 9, rkey: 0x1234, nbuckets: 64, indexAddr: 0x7f0000, extentSize: 512, maxProbe: 8, maxMsg: 556}.append(nil))
	f.Add(append(hello{nbuckets: 1, extentSize: InlineMax, maxProbe: 1, maxMsg: reqHdrLen + MaxKey}.append(nil), 0xEE))
	f.Add([]byte("RXKV"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			return
		}
		require.NotZero(t, h.nbuckets)
		require.NotZero(t, h.maxProbe)
		require.GreaterOrEqual(t, h.extentSize, uint32(InlineMax))
		require.GreaterOrEqual(t, h.maxMsg, uint32(reqHdrLen+MaxKey))
		require.LessOrEqual(t, h.extentSize, uint32(MaxExtent))
		require.LessOrEqual(t, h.maxMsg, uint32(reqHdrLen+MaxKey+MaxExtent))
		want := bytes.Clone(b[:helloLen])
		want[6], want[7] = 0, 0
		require.Equal(t, want, h.append(nil))
	})
}
