package oob

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// PerftestVersion is the protocol version perftest 4.5-0.17 sends ("6.06");
// rxed sends the same so perftest treats it as a peer of its own kind.
const PerftestVersion = "6.06"

// MinPerftestVersion is the oldest version perftest 4.5 accepts from a peer
// (check_version_compatibility): older ones exit with "Current
// implementation is not compatible with versions older than 5.70".
const MinPerftestVersion = 5.70

// Sizes of the perftest messages on the wire.
const (
	VersionMsgLen  = 16  // MAX_VERSION: the version string, NUL padded
	SysDataMsgLen  = 4   // each of cycle_buffer and cache_line_size, u32 BE
	MTUMsgLen      = 2   // sprintf("%d", ibv_mtu) cut to 2 bytes (peers >= 5.31)
	KeyMsgLen      = 108 // KEY_MSG_SIZE_GID
	ReportFieldLen = 8   // each bandwidth report field (iters: 4 below 5.33)
)

// PerftestDoneMsg is what each side writes after the final key exchange.
var PerftestDoneMsg = [5]byte{'d', 'o', 'n', 'e', 0}

// EncodeVersion writes v NUL padded into a 16-byte message. v must leave
// room for the NUL.
func EncodeVersion(b []byte, v string) error {
	if len(b) < VersionMsgLen {
		return fmt.Errorf("oob: version message needs %d bytes, buffer has %d", VersionMsgLen, len(b))
	}
	if len(v) >= VersionMsgLen {
		return fmt.Errorf("oob: version %q longer than %d bytes", v, VersionMsgLen-1)
	}
	b = b[:VersionMsgLen]
	clear(b)
	copy(b, v)
	return nil
}

// ParseVersion returns the C string in a 16-byte version message (up to the
// first NUL).
func ParseVersion(b []byte) (string, error) {
	if len(b) != VersionMsgLen {
		return "", fmt.Errorf("version message is %d bytes, want %d", len(b), VersionMsgLen)
	}
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), nil
		}
	}
	return string(b), nil
}

// VersionNumber evaluates a version string the way perftest does, with C's
// atof: the longest numeric prefix, 0 when there is none.
func VersionNumber(v string) float64 {
	i := 0
	for i < len(v) && (v[i] == ' ' || (v[i] >= '\t' && v[i] <= '\r')) {
		i++
	}
	start := i
	if i < len(v) && (v[i] == '+' || v[i] == '-') {
		i++
	}
	digits := 0
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		i++
		digits++
	}
	if i < len(v) && v[i] == '.' {
		i++
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
			digits++
		}
	}
	if digits == 0 {
		return 0
	}
	end := i
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		j := i + 1
		if j < len(v) && (v[j] == '+' || v[j] == '-') {
			j++
		}
		k := j
		for k < len(v) && v[k] >= '0' && v[k] <= '9' {
			k++
		}
		if k > j {
			end = k
		}
	}
	// Out of range saturates to ±Inf, as strtod does.
	f, _ := strconv.ParseFloat(v[start:end], 64)
	return f
}

// EncodeMTU writes the 2-byte MTU message: the decimal ibv_mtu enum value
// (1 = 256 ... 5 = 4096), cut to two bytes as perftest sends it.
func EncodeMTU(b []byte, mtu int) error {
	if len(b) < MTUMsgLen {
		return fmt.Errorf("oob: MTU message needs %d bytes, buffer has %d", MTUMsgLen, len(b))
	}
	s := strconv.Itoa(mtu) + "\x00"
	b[0], b[1] = s[0], s[1]
	return nil
}

// ParseMTU returns the ibv_mtu enum value of an MTU message: its leading
// decimal digits (perftest sends a plain number; unlike strtol, no spaces
// or sign are skipped); ok is false when it is not a valid enum value
// (1..5), in which case perftest keeps its own MTU.
func ParseMTU(b []byte) (mtu int, ok bool) {
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		if v > 5 {
			continue // out of range already; do not let it wrap into 1..5
		}
		v = v*10 + int(c-'0')
	}
	return v, v >= 1 && v <= 5
}

// MTUBytes converts an ibv_mtu enum value to bytes (MTU_SIZE: 1 << (7+mtu)).
func MTUBytes(mtu int) int {
	if mtu < 1 || mtu > 5 {
		return 0
	}
	return 1 << (7 + mtu)
}

// MTUEnum converts a byte count (256, 512, 1024, 2048, 4096) to the ibv_mtu
// enum value; 0 when it is not one of them.
func MTUEnum(bytes int) int {
	for e := 1; e <= 5; e++ {
		if MTUBytes(e) == bytes {
			return e
		}
	}
	return 0
}

// Key is one side's pingpong_dest in perftest's key message (printed with
// KEY_PRINT_FMT_GID): exchanged once per QP to connect, then repeatedly as a
// barrier.
type Key struct {
	LID      uint16 // 0 on RoCE
	OutReads uint16 // max outstanding RDMA reads/atomics: 1 for write/send tests
	QPN      uint32 // 24 bits
	PSN      uint32 // 24 bits, the sender's initial send PSN
	RKey     uint32 // 0 in send tests
	VAddr    uint64 // the remote buffer address for RDMA tests
	GID      [16]byte
	SRQN     uint32 // XRC/DC only
}

// Offsets in the 108-byte key message:
// "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:" + NUL.
const (
	keyLIDOff   = 0
	keyOutOff   = 5
	keyQPNOff   = 10
	keyPSNOff   = 17
	keyRKeyOff  = 24
	keyVAddrOff = 33
	keyGIDOff   = 50
	keySRQNOff  = 98
	keyNULOff   = 107
)

// Encode writes the 108-byte key message into b[:KeyMsgLen].
func (k Key) Encode(b []byte) error {
	if len(b) < KeyMsgLen {
		return fmt.Errorf("oob: key message needs %d bytes, buffer has %d", KeyMsgLen, len(b))
	}
	if k.QPN > 0xffffff {
		return fmt.Errorf("oob: key QPN %#x %w", k.QPN, errField24)
	}
	if k.PSN > 0xffffff {
		return fmt.Errorf("oob: key PSN %#x %w", k.PSN, errField24)
	}
	b = b[:KeyMsgLen]
	putHex(b[keyLIDOff:keyLIDOff+4], uint64(k.LID))
	putHex(b[keyOutOff:keyOutOff+4], uint64(k.OutReads))
	putHex(b[keyQPNOff:keyQPNOff+6], uint64(k.QPN))
	putHex(b[keyPSNOff:keyPSNOff+6], uint64(k.PSN))
	putHex(b[keyRKeyOff:keyRKeyOff+8], uint64(k.RKey))
	putHex(b[keyVAddrOff:keyVAddrOff+16], k.VAddr)
	for i, g := range k.GID {
		o := keyGIDOff + 3*i
		b[o], b[o+1] = hexDigits[g>>4], hexDigits[g&0xf]
	}
	putHex(b[keySRQNOff:keySRQNOff+8], uint64(k.SRQN))
	for _, off := range keyColons {
		b[off] = ':'
	}
	b[keyNULOff] = 0
	return nil
}

// keyColons lists the offsets of every ':' in the key message.
var keyColons = [...]int{
	keyOutOff - 1, keyQPNOff - 1, keyPSNOff - 1, keyRKeyOff - 1, keyVAddrOff - 1, keyGIDOff - 1,
	keyGIDOff + 2, keyGIDOff + 5, keyGIDOff + 8, keyGIDOff + 11, keyGIDOff + 14, keyGIDOff + 17,
	keyGIDOff + 20, keyGIDOff + 23, keyGIDOff + 26, keyGIDOff + 29, keyGIDOff + 32, keyGIDOff + 35,
	keyGIDOff + 38, keyGIDOff + 41, keyGIDOff + 44, keyGIDOff + 47, keyNULOff - 1,
}

// keyFields are the integer fields of the key message, in order.
var keyFields = [...]struct {
	name     string
	off, len int
}{
	{"LID", keyLIDOff, 4}, {"out_reads", keyOutOff, 4}, {"QPN", keyQPNOff, 6}, {"PSN", keyPSNOff, 6},
	{"RKey", keyRKeyOff, 8}, {"VAddr", keyVAddrOff, 16}, {"SRQ number", keySRQNOff, 8},
}

// MarshalBinary returns the 108-byte key message.
func (k Key) MarshalBinary() ([]byte, error) {
	b := make([]byte, KeyMsgLen)
	if err := k.Encode(b); err != nil {
		return nil, err
	}
	return b, nil
}

// UnmarshalBinary parses a 108-byte key message (see ParseKey).
func (k *Key) UnmarshalBinary(b []byte) error {
	v, err := ParseKey(b)
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// ParseKey parses exactly one 108-byte key message, strictly in the layout
// perftest writes (either case of hex digits accepted).
func ParseKey(b []byte) (Key, error) {
	var k Key
	if len(b) != KeyMsgLen {
		return k, fmt.Errorf("key message is %d bytes, want %d", len(b), KeyMsgLen)
	}
	for _, off := range keyColons {
		if b[off] != ':' {
			return k, fmt.Errorf("key message: byte %d is %q, want ':'", off, b[off])
		}
	}
	if b[keyNULOff] != 0 {
		return k, fmt.Errorf("key message: byte %d is %q, want NUL", keyNULOff, b[keyNULOff])
	}
	var v [len(keyFields)]uint64
	for i, f := range keyFields {
		x, ok := parseHexField(b[f.off : f.off+f.len])
		if !ok {
			return k, fmt.Errorf("key message: %s %q is not hex", f.name, b[f.off:f.off+f.len])
		}
		v[i] = x
	}
	k.LID, k.OutReads, k.QPN, k.PSN = uint16(v[0]), uint16(v[1]), uint32(v[2]), uint32(v[3])
	k.RKey, k.VAddr, k.SRQN = uint32(v[4]), v[5], uint32(v[6])
	for i := range k.GID {
		o := keyGIDOff + 3*i
		v, ok := parseHexField(b[o : o+2])
		if !ok {
			return Key{}, fmt.Errorf("key message: GID byte %d %q is not hex", i, b[o:o+2])
		}
		k.GID[i] = byte(v)
	}
	return k, nil
}

// BWReport is perftest's struct bw_report_data as exchanged after a
// bandwidth test. Only the side that ran the test has real values; a
// half-duplex perftest server sends whatever its stack held.
type BWReport struct {
	Size       uint64  // message size in bytes
	Iters      uint64  // iterations (all QPs)
	BWPeak     float64 // MB/s or Gb/s, as the sender's --report_gbits says
	BWAvg      float64
	MsgRateAvg float64 // Mpps
	// Per-port figures, exchanged only with --report-per-port.
	BWAvgP1, MsgRateAvgP1, BWAvgP2, MsgRateAvgP2 float64
}

// bwReportFields lists the report fields in exchange order: each is a
// separate exchange of its own size.
func (r *BWReport) fields(perPort bool) []*float64 {
	f := []*float64{&r.BWPeak, &r.BWAvg, &r.MsgRateAvg}
	if perPort {
		f = append(f, &r.BWAvgP1, &r.MsgRateAvgP1, &r.BWAvgP2, &r.MsgRateAvgP2)
	}
	return f
}

// ReportItersLen is the size of the iters field perftest sends to a peer of
// the given version (xchg_bw_reports compares a float, hence float32).
func ReportItersLen(remoteVersion float64) int {
	if float64(float32(remoteVersion)) >= 5.33 { // float promoted to double, as in C
		return 8
	}
	return 4
}

// AppendBWReport appends the report in exchange order: size u64 BE, iters
// (u64 BE, or u32 BE when itersLen is 4), then the doubles big-endian.
func AppendBWReport(b []byte, r BWReport, itersLen int, perPort bool) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Size)
	if itersLen == 4 {
		b = binary.BigEndian.AppendUint32(b, uint32(r.Iters))
	} else {
		b = binary.BigEndian.AppendUint64(b, r.Iters)
	}
	for _, f := range r.fields(perPort) {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(*f))
	}
	return b
}

// BWReportLen is the total size of a report exchange in one direction.
func BWReportLen(itersLen int, perPort bool) int {
	n := 8 + itersLen + 3*8
	if perPort {
		n += 4 * 8
	}
	return n
}

// ParseBWReport parses what AppendBWReport writes.
func ParseBWReport(b []byte, itersLen int, perPort bool) (BWReport, error) {
	var r BWReport
	if itersLen != 4 && itersLen != 8 {
		return r, errors.New("oob: iters field is 4 or 8 bytes")
	}
	if want := BWReportLen(itersLen, perPort); len(b) != want {
		return r, fmt.Errorf("bandwidth report is %d bytes, want %d", len(b), want)
	}
	r.Size = binary.BigEndian.Uint64(b)
	b = b[8:]
	if itersLen == 4 {
		r.Iters = uint64(binary.BigEndian.Uint32(b))
	} else {
		r.Iters = binary.BigEndian.Uint64(b)
	}
	b = b[itersLen:]
	for _, f := range r.fields(perPort) {
		*f = math.Float64frombits(binary.BigEndian.Uint64(b))
		b = b[8:]
	}
	return r, nil
}
