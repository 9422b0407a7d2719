package wirepcap

import (
	"errors"

	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/pkg/wire"
)

// ErrBadICRC is the verdict error of a packet whose ICRC does not match.
var ErrBadICRC = errors.New("wirepcap: bad ICRC")

// RoCEFrame is a captured frame decoded down to its RoCEv2 headers.
type RoCEFrame struct {
	UDPFrame
	Packet wire.Packet
	// ParseErr is the first defect in rxe_rcv order: ErrTruncatedFrame or
	// one of wire's sentinels; ErrBadICRC when the packet is well formed
	// but its ICRC is wrong; nil for a good packet.
	ParseErr error
	ICRC     wire.Verdict
}

// DecodeRoCE dissects a frame and parses its RoCEv2 payload. It returns
// ErrNotUDP, ErrNotRoCE, ErrLinkType or ErrTruncatedFrame (before the UDP
// payload) for frames that are not RoCEv2 packets at all; defects of the
// RoCE packet itself are reported in out.ParseErr with a nil error.
func DecodeRoCE(lt layers.LinkType, data []byte, out *RoCEFrame) error {
	out.ParseErr, out.ICRC = nil, wire.ICRCUnverifiable
	if err := DissectUDP(lt, data, &out.UDPFrame); err != nil {
		out.Packet.Reset()
		return err
	}
	if !out.IsRoCE() {
		out.Packet.Reset()
		return ErrNotRoCE
	}
	err := out.Packet.Parse(out.Payload)
	if out.Truncated {
		out.ParseErr = ErrTruncatedFrame
		return nil
	}
	out.ICRC = wire.VerifyICRC(out.IP, out.UDP, out.Payload)
	switch {
	case err != nil:
		out.ParseErr = err
	case out.ICRC != wire.ICRCOK:
		out.ParseErr = ErrBadICRC
	}
	return nil
}

// ErrorCode maps a RoCEFrame.ParseErr to the short names rxed decode
// prints: "" (none), "truncated", "bad_opcode", "bad_version",
// "bad_padding", "bad_length", "bad_icrc".
func ErrorCode(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, wire.ErrTruncated), errors.Is(err, ErrTruncatedFrame):
		return "truncated"
	case errors.Is(err, wire.ErrBadOpcode):
		return "bad_opcode"
	case errors.Is(err, wire.ErrBadVersion):
		return "bad_version"
	case errors.Is(err, wire.ErrBadPadding):
		return "bad_padding"
	case errors.Is(err, wire.ErrBadLength):
		return "bad_length"
	case errors.Is(err, ErrBadICRC):
		return "bad_icrc"
	}
	return "error"
}
