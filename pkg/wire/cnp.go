package wire

import "encoding/binary"

// CNPBody is a view of the 16 reserved bytes that follow a CNP's BTH
// (RoCEv2 Annex A17). Senders zero them; receivers ignore them. It is
// not named CNP because that is the opcode constant.
type CNPBody []byte

// Reserved1 returns the first eight reserved bytes as a big-endian number.
func (h CNPBody) Reserved1() uint64 { return binary.BigEndian.Uint64(h[0:]) }

// Reserved2 returns the last eight reserved bytes as a big-endian number.
func (h CNPBody) Reserved2() uint64 { return binary.BigEndian.Uint64(h[8:]) }
