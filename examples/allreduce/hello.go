package allreduce

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// hello is what neighbours tell each other when they connect: the sender
// (dialing its next rank) in the request, the receiver in the answer,
// with the receive slots it advertises (RDMA).
//
//	magic "RXA2" | rank u16 | ranks u16 | count u64 | slot address u64 | slot rkey u32 | slot size u32 | slots u32
//
// The magic names the ring's protocol: "RXAR", the rings before
// slotsFor, advertised two slots and handed each back by SEND; a rank of
// either kind takes the other for something that is not a ring and
// refuses it, rather than wait for credits that never come.
type hello struct {
	rank, ranks int
	count       int
	slotAddr    uint64
	slotRKey    uint32
	slotSize    uint32
	slots       uint32
}

const (
	helloMagic = "RXA2"
	helloLen   = 36
)

func (h hello) append(b []byte) []byte {
	b = append(b, helloMagic...)
	b = binary.LittleEndian.AppendUint16(b, uint16(h.rank))
	b = binary.LittleEndian.AppendUint16(b, uint16(h.ranks))
	b = binary.LittleEndian.AppendUint64(b, uint64(h.count))
	b = binary.LittleEndian.AppendUint64(b, h.slotAddr)
	b = binary.LittleEndian.AppendUint32(b, h.slotRKey)
	b = binary.LittleEndian.AppendUint32(b, h.slotSize)
	return binary.LittleEndian.AppendUint32(b, h.slots)
}

var errNotRing = errors.New("the peer is not an allreduce rank")

// errMismatch marks a neighbour that disagrees about the ring.
var errMismatch = errors.New("ring mismatch")

type mismatchError struct{ msg string }

func (e *mismatchError) Error() string { return e.msg }
func (e *mismatchError) Unwrap() error { return errMismatch }

func parseHello(b []byte) (hello, error) {
	if len(b) < helloLen || string(b[:4]) != helloMagic {
		return hello{}, errNotRing
	}
	return hello{
		rank:     int(binary.LittleEndian.Uint16(b[4:])),
		ranks:    int(binary.LittleEndian.Uint16(b[6:])),
		count:    int(binary.LittleEndian.Uint64(b[8:])),
		slotAddr: binary.LittleEndian.Uint64(b[16:]),
		slotRKey: binary.LittleEndian.Uint32(b[24:]),
		slotSize: binary.LittleEndian.Uint32(b[28:]),
		slots:    binary.LittleEndian.Uint32(b[32:]),
	}, nil
}

// agree checks a neighbour's hello against our configuration: the same
// ring size and vector length, and the rank we expect there.
func (c Config) agree(h hello, wantRank int) error {
	switch {
	case h.ranks != c.Ranks:
		return mismatchf("rank count mismatch: rank %d runs %d ranks, rank %d runs %d", h.rank, h.ranks, c.Rank, c.Ranks)
	case h.count != c.Count:
		return mismatchf("size mismatch: rank %d has %d floats, rank %d has %d", h.rank, h.count, c.Rank, c.Count)
	case h.rank != wantRank:
		return mismatchf("rank %d expected rank %d as its neighbour, rank %d connected", c.Rank, wantRank, h.rank)
	}
	return nil
}

func mismatchf(format string, args ...any) error {
	return &mismatchError{fmt.Sprintf(format, args...)}
}
