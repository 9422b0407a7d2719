package mad

import "encoding/binary"

// CommIDWords returns the first two 32-bit words of a CM message's data
// area (ok is false when data is shorter than 8 bytes): the local and the
// remote comm ID of an MRA, REJ, REP, RTU, DREQ or DREP; a REQ's local
// comm ID and its bytes 4-7 (reserved(8) and the vendor ID). cm.c's
// cm_issue_rej reads whatever message it answers through the REJ's layout
// and swaps these two words into its REJ: the REJ refusing a REQ carries
// the REQ's bytes 4-7 as its local comm ID (zero from a sender that leaves
// them zero, as rdma_cm does without ECE).
func CommIDWords(data []byte) (first, second uint32, ok bool) {
	if len(data) < commRemoteID+4 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(data[commLocalID:]), binary.BigEndian.Uint32(data[commRemoteID:]), true
}
