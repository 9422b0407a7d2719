package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// hello is what the server tells each client in the rdma_cm REP's private
// data: where the table is and how it is laid out.
//
//	magic "RXKV" | layout u16 | 0 u16 | epoch u64 | rkey u32 | nbuckets u32 |
//	index address u64 | extent size u32 | max probe u32 | max message u32
type hello struct {
	epoch      uint64 // random per server instance: a reconnecting client sees a restart
	rkey       uint32
	nbuckets   uint32
	indexAddr  uint64 // the extents follow the index
	extentSize uint32
	maxProbe   uint32
	maxMsg     uint32
}

const (
	helloMagic  = "RXKV"
	helloLayout = 1
	helloLen    = 44
)

func (h hello) append(b []byte) []byte {
	b = append(b, helloMagic...)
	b = binary.LittleEndian.AppendUint16(b, helloLayout)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, h.epoch)
	b = binary.LittleEndian.AppendUint32(b, h.rkey)
	b = binary.LittleEndian.AppendUint32(b, h.nbuckets)
	b = binary.LittleEndian.AppendUint64(b, h.indexAddr)
	b = binary.LittleEndian.AppendUint32(b, h.extentSize)
	b = binary.LittleEndian.AppendUint32(b, h.maxProbe)
	return binary.LittleEndian.AppendUint32(b, h.maxMsg)
}

var errNotKV = errors.New("kv: the peer is not an rxed kv server (no table description in its REP)")

func parseHello(b []byte) (hello, error) {
	if len(b) < helloLen || string(b[:4]) != helloMagic {
		return hello{}, errNotKV
	}
	if l := binary.LittleEndian.Uint16(b[4:]); l != helloLayout {
		return hello{}, fmt.Errorf("kv: server table layout %d, this client speaks %d", l, helloLayout)
	}
	h := hello{
		epoch:      binary.LittleEndian.Uint64(b[8:]),
		rkey:       binary.LittleEndian.Uint32(b[16:]),
		nbuckets:   binary.LittleEndian.Uint32(b[20:]),
		indexAddr:  binary.LittleEndian.Uint64(b[24:]),
		extentSize: binary.LittleEndian.Uint32(b[32:]),
		maxProbe:   binary.LittleEndian.Uint32(b[36:]),
		maxMsg:     binary.LittleEndian.Uint32(b[40:]),
	}
	// The client allocates and registers extentSize + maxMsg bytes: a
	// server may not name more than a table can have.
	if h.nbuckets == 0 || h.maxProbe == 0 || h.extentSize < InlineMax || h.extentSize > MaxExtent ||
		h.maxMsg < reqHdrLen+MaxKey || h.maxMsg > reqHdrLen+MaxKey+MaxExtent {
		return hello{}, fmt.Errorf("kv: server announced an unusable table (%d buckets, extent %d, probe %d, message %d)",
			h.nbuckets, h.extentSize, h.maxProbe, h.maxMsg)
	}
	return h, nil
}

func (h hello) bucketAddr(i int) uint64 { return h.indexAddr + uint64(i)*BucketSize }

func (h hello) extentAddr(i int) uint64 {
	return h.indexAddr + uint64(h.nbuckets)*BucketSize + uint64(i)*uint64(h.extentSize)
}
