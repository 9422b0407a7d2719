package oob

import (
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// cHexAlt formats v like C's printf("%#0*x", width, v): "0x" counts towards
// the width, and zero gets neither prefix nor "0x" (glibc prints "0000" for
// "%#04x" of 0, which is what perftest shows as "LID 0000").
func cHexAlt(v uint64, width int) string {
	digits := strconv.FormatUint(v, 16)
	if v == 0 {
		if len(digits) < width {
			return strings.Repeat("0", width-len(digits)) + digits
		}
		return digits
	}
	if pad := width - 2 - len(digits); pad > 0 {
		digits = strings.Repeat("0", pad) + digits
	}
	return "0x" + digits
}

// cFloat formats like C's "%-W.Pf" (left) or "%W.Pf": identical to Go's
// fmt for finite values (both round the exact binary value correctly), but
// infinities and NaN are spelled as glibc spells them.
func cFloat(v float64, width, prec int, left bool) string {
	var s string
	switch {
	case math.IsInf(v, 1):
		s = "inf"
	case math.IsInf(v, -1):
		s = "-inf"
	case math.IsNaN(v):
		s = "nan"
		if math.Signbit(v) {
			s = "-nan"
		}
	default:
		s = strconv.FormatFloat(v, 'f', prec, 64)
	}
	return pad(s, width, left)
}

func pad(s string, width int, left bool) string {
	if len(s) >= width {
		return s
	}
	if left {
		return s + strings.Repeat(" ", width-len(s))
	}
	return strings.Repeat(" ", width-len(s)) + s
}

// FormatGID returns the GID as glibc's inet_ntop(AF_INET6) writes it, which
// is what ibv_*_pingpong print. It differs from netip.Addr.String only for
// IPv4-compatible addresses (::a.b.c.d), which glibc prints in dotted form.
func FormatGID(gid [16]byte) string {
	var words [8]uint16
	for i := range words {
		words[i] = uint16(gid[2*i])<<8 | uint16(gid[2*i+1])
	}
	// Longest run of zero words (first one on ties), if at least 2 long.
	bestBase, bestLen := -1, 0
	for i := 0; i < 8; {
		if words[i] != 0 {
			i++
			continue
		}
		j := i
		for j < 8 && words[j] == 0 {
			j++
		}
		if j-i > bestLen {
			bestBase, bestLen = i, j-i
		}
		i = j
	}
	if bestLen < 2 {
		bestBase = -1
	}
	var b strings.Builder
	for i := 0; i < 8; i++ {
		if bestBase >= 0 && i >= bestBase && i < bestBase+bestLen {
			if i == bestBase {
				b.WriteByte(':')
			}
			continue
		}
		if i != 0 {
			b.WriteByte(':')
		}
		// Embedded IPv4: ::a.b.c.d or ::ffff:a.b.c.d.
		if i == 6 && bestBase == 0 && (bestLen == 6 || (bestLen == 5 && words[5] == 0xffff)) {
			b.WriteString(netip.AddrFrom4([4]byte(gid[12:16])).String())
			break
		}
		b.WriteString(strconv.FormatUint(uint64(words[i]), 16))
	}
	if bestBase >= 0 && bestBase+bestLen == 8 {
		b.WriteByte(':')
	}
	return b.String()
}

// hexVal decodes one ASCII hex digit (either case, as strtol accepts).
func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// parseHexField decodes a fixed-width hex field; ok is false on any
// non-hex character.
func parseHexField(b []byte) (uint64, bool) {
	var v uint64
	for _, c := range b {
		d, ok := hexVal(c)
		if !ok {
			return 0, false
		}
		v = v<<4 | uint64(d)
	}
	return v, true
}

const hexDigits = "0123456789abcdef"

// putHex writes v as exactly len(b) lower-case hex digits (zero padded).
// The caller has checked that v fits.
func putHex(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = hexDigits[v&0xf]
		v >>= 4
	}
}

// quoteMsg renders a received message for an error line: printable ASCII as
// is, everything else escaped, long messages cut.
func quoteMsg(b []byte) string {
	const maxShown = 120
	cut := len(b) > maxShown
	if cut {
		b = b[:maxShown]
	}
	s := strconv.QuoteToASCII(string(b))
	if cut {
		s += "..."
	}
	return s
}
