package mr

// KeyKind says which key of an object a lookup presents: the lkey from a
// local scatter/gather element or the rkey a peer sent.
type KeyKind uint8

// Key kinds.
const (
	LKey KeyKind = 1 // a local key (SGE lkey); never names a window
	RKey KeyKind = 2 // a remote key (RETH/AtomicETH/IETH rkey); region or window
)

// String returns "lkey" or "rkey".
func (k KeyKind) String() string {
	switch k {
	case LKey:
		return "lkey"
	case RKey:
		return "rkey"
	}
	return "KeyKind(?)"
}

// Object index ranges, as rxe's pools (rxe_param.h: RXE_MIN/MAX_MR_INDEX,
// RXE_MIN/MAX_MW_INDEX). The index range tells a window's rkey from a
// region's key without a second table lookup (rxe's rkey_is_mw).
const (
	MinMRIndex uint32 = 0x00000001
	MaxMRIndex uint32 = 0x00040000
	MinMWIndex uint32 = 0x00040001
	MaxMWIndex uint32 = 0x00060000
)

// NoQP is the QP number given to lookups that are not made on behalf of a
// QP; type 2 windows never match it. Real QPNs are 24-bit.
const NoQP = ^uint32(0)

// Key randomness. An rkey is all a peer needs to read or write a region
// (RoCE authenticates nothing), and rkeys are opaque to peers, so both
// parts of a key are drawn at random: the index among the free slots of
// its range (18 bits for regions, 17 for windows; alloc probes from a
// random position) and the 8-bit key part, which must differ from the
// slot's previous one (rxe_get_next_key) so that a stale key never
// becomes valid again. A guess that knows the layout resolves with
// probability registrations / 2^26 for regions (measured in
// TestGuessedRKeys: 0 of 10^6 guesses against a few registrations;
// sequential indices let 1 in 256 through). The key part stays the low
// byte, the one ibv_inc_rkey changes, and lkey == rkey as in rxe.

// randomPos maps 4 random bytes to a position in [0, n).
func randomPos(b [4]byte, n uint32) uint32 {
	return uint32((uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])) * uint64(n) >> 32)
}

// KeyIndex is the object index part of an lkey/rkey.
func KeyIndex(key uint32) uint32 { return key >> 8 }

// KeyPart is the 8-bit key (variant) part of an lkey/rkey.
func KeyPart(key uint32) uint8 { return uint8(key) }

// MakeKey builds a key from an object index and a key part.
func MakeKey(index uint32, part uint8) uint32 { return index<<8 | uint32(part) }

// IncKey returns key with its key part incremented (libibverbs
// ibv_inc_rkey / kernel ib_inc_rkey): the usual way to pick the new key of
// a fast registration or a window bind.
func IncKey(key uint32) uint32 { return key&^0xff | (key+1)&0xff }

// IsMWKey reports whether key names a memory window (by index range).
func IsMWKey(key uint32) bool { return KeyIndex(key) >= MinMWIndex }
