package daemon

// perftest's key message in rdma_cm mode (-R): not the 108-byte text of
// its TCP exchange but struct pingpong_dest itself, each integer
// big-endian (rdma_write_keys with HAVE_ENDIAN), sent as one RC SEND on
// the control connection. The layout, read off
// perftest_write_bw_rc_4096_rdmacm.pcap (x86-64, perftest 4.5-0.17):
//
//	 0 lid        u32     20 (padding: stack garbage in perftest's)
//	 4 out_reads  u32     24 vaddr   u64
//	 8 qpn        u32     32 gid     16 bytes
//	12 psn        u32     48 srqn    u32
//	16 rkey       u32     52 gid_index u32 (int)
//
// rdma_read_keys takes lid, out_reads, qpn, psn, rkey, vaddr and gid and
// ignores the rest, so rxed's marker (perfMarker) travels in srqn as in
// the TCP exchange. The two hand shakes around the test connections
// carry an all-zero message (perftest's my_dest before set_up_connection).

import (
	"encoding/binary"
	"fmt"

	"github.com/rxed/rxed/pkg/oob"
)

// CMKeyLen is sizeof(struct pingpong_dest) on a 64-bit host.
const CMKeyLen = 56

// Offsets of the fields in the binary key.
const (
	cmKeyLID      = 0
	cmKeyOutReads = 4
	cmKeyQPN      = 8
	cmKeyPSN      = 12
	cmKeyRKey     = 16
	cmKeyVAddr    = 24
	cmKeyGID      = 32
	cmKeySRQN     = 48
	cmKeyGIDIndex = 52
)

// AppendCMKey appends k as perftest's binary key with gidIndex (perftest's
// -x; 0 in the all-zero hand shakes).
func AppendCMKey(b []byte, k oob.Key, gidIndex int) []byte {
	var m [CMKeyLen]byte
	be := binary.BigEndian
	be.PutUint32(m[cmKeyLID:], uint32(k.LID))
	be.PutUint32(m[cmKeyOutReads:], uint32(k.OutReads))
	be.PutUint32(m[cmKeyQPN:], k.QPN)
	be.PutUint32(m[cmKeyPSN:], k.PSN)
	be.PutUint32(m[cmKeyRKey:], k.RKey)
	be.PutUint64(m[cmKeyVAddr:], k.VAddr)
	copy(m[cmKeyGID:cmKeyGID+16], k.GID[:])
	be.PutUint32(m[cmKeySRQN:], k.SRQN)
	be.PutUint32(m[cmKeyGIDIndex:], uint32(int32(gidIndex)))
	return append(b, m[:]...)
}

// ParseCMKey parses exactly one binary key. It reads what rdma_read_keys
// reads, plus srqn (rxed's marker); QPN and PSN keep perftest's 24 bits.
// The LID and the outstanding reads are ints in perftest: values beyond
// 16 bits are refused rather than cut.
func ParseCMKey(b []byte) (oob.Key, error) {
	if len(b) != CMKeyLen {
		return oob.Key{}, fmt.Errorf("rdma_cm key message of %d bytes, want %d", len(b), CMKeyLen)
	}
	be := binary.BigEndian
	lid, outs := be.Uint32(b[cmKeyLID:]), be.Uint32(b[cmKeyOutReads:])
	if lid > 0xffff || outs > 0xffff {
		return oob.Key{}, fmt.Errorf("rdma_cm key message: LID %#x or outstanding reads %d out of range", lid, outs)
	}
	k := oob.Key{LID: uint16(lid), OutReads: uint16(outs), QPN: be.Uint32(b[cmKeyQPN:]) & 0xffffff,
		PSN: be.Uint32(b[cmKeyPSN:]) & 0xffffff, RKey: be.Uint32(b[cmKeyRKey:]), VAddr: be.Uint64(b[cmKeyVAddr:]),
		SRQN: be.Uint32(b[cmKeySRQN:])}
	copy(k.GID[:], b[cmKeyGID:cmKeyGID+16])
	return k, nil
}
