package kv

import (
	"encoding/binary"
	"hash/crc32"
	"unsafe"
)

// Bucket layout, 128 bytes (BucketSize). Multi-byte fields are little
// endian; the version is also written with atomic 64-bit stores by the
// server (the table's memory is 8-byte aligned), so the server's own
// readers see it change in one step.
const (
	offVersion = 0  // uint64: 0 never used; odd while being written
	offFlags   = 8  // uint8: flagUsed, flagTombstone, flagInline
	offKeyLen  = 9  // uint8
	offValLen  = 12 // uint32
	offValCRC  = 16 // uint32: CRC32C of the value
	offHdrCRC  = 20 // uint32: CRC32C of bytes [0, offHdrCRC) and the key
	offKey     = 32 // [MaxKey]byte
	offInline  = 64 // [InlineMax]byte

	// BucketSize is the size of one index bucket.
	BucketSize = 128
	// MaxKey is the longest key.
	MaxKey = offInline - offKey
	// InlineMax is the longest value kept in its bucket (one READ).
	InlineMax = BucketSize - offInline
	// MaxExtent is the largest extent (ExtentSize): a client sizes its
	// registered buffer from the extent its server announces, so it must
	// not take any size a server (or something posing as one) names.
	MaxExtent = 1 << 20
)

const (
	flagUsed      = 1 << 0
	flagTombstone = 1 << 1
	flagInline    = 1 << 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// bucket is a view of one 128-byte index entry.
type bucket []byte

func (b bucket) version() uint64 { return binary.LittleEndian.Uint64(b[offVersion:]) }
func (b bucket) flags() uint8    { return b[offFlags] }
func (b bucket) keyLen() int     { return int(b[offKeyLen]) }
func (b bucket) valLen() int     { return int(binary.LittleEndian.Uint32(b[offValLen:])) }
func (b bucket) valCRC() uint32  { return binary.LittleEndian.Uint32(b[offValCRC:]) }
func (b bucket) hdrCRC() uint32  { return binary.LittleEndian.Uint32(b[offHdrCRC:]) }

// key returns the stored key; only meaningful once the header verified.
func (b bucket) key() []byte {
	n := min(b.keyLen(), MaxKey)
	return b[offKey : offKey+n]
}

func (b bucket) inline() []byte {
	n := min(b.valLen(), InlineMax)
	return b[offInline : offInline+n]
}

// computeHdrCRC is the header checksum the bucket should carry.
func (b bucket) computeHdrCRC() uint32 {
	c := crc32.Update(0, castagnoli, b[:offHdrCRC])
	return crc32.Update(c, castagnoli, b.key())
}

// atomicVersion is the version word for the server's atomic stores.
func (b bucket) atomicVersion() *uint64 {
	return (*uint64)(unsafe.Pointer(&b[offVersion]))
}

// readVerdict is what a reader concluded from a bucket it copied.
type readVerdict int

const (
	verdictOK        readVerdict = iota // consistent: use it
	verdictEmpty                        // never written: the key is absent
	verdictWriting                      // odd version: a write is in progress
	verdictTorn                         // header checksum mismatch: the copy raced a write
	verdictBadLength                    // lengths out of range (a torn copy that passed no checks yet)
)

// check classifies a bucket a reader copied (by READ or locally) with
// extentSize the table's extent size.
func (b bucket) check(extentSize int) readVerdict {
	v := b.version()
	switch {
	case v == 0:
		return verdictEmpty
	case v&1 == 1:
		return verdictWriting
	}
	if b.keyLen() > MaxKey || b.valLen() > extentSize {
		return verdictBadLength
	}
	if b.computeHdrCRC() != b.hdrCRC() {
		return verdictTorn
	}
	if b.flags()&flagInline != 0 && b.valLen() > InlineMax {
		return verdictBadLength
	}
	return verdictOK
}
