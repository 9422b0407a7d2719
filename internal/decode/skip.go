package decode

import (
	"errors"
	"fmt"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
)

// skipReason describes a frame that is not RoCEv2, the way tshark would
// name it (protocol and endpoints), using gopacket's dissectors.
func skipReason(fr wirepcap.Frame, err error) string {
	if errors.Is(err, wirepcap.ErrLinkType) {
		return fmt.Sprintf("unsupported link type %s", fr.LinkType)
	}
	pkt := gopacket.NewPacket(fr.Data, fr.LinkType, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	proto := "unknown"
	if l := pkt.TransportLayer(); l != nil {
		proto = l.LayerType().String()
	} else if l := pkt.NetworkLayer(); l != nil {
		proto = l.LayerType().String()
	} else if l := pkt.LinkLayer(); l != nil {
		proto = l.LayerType().String()
		if e, ok := l.(*layers.Ethernet); ok {
			proto = e.EthernetType.String()
		}
	}
	where := ""
	if n := pkt.NetworkLayer(); n != nil {
		src, dst := n.NetworkFlow().Endpoints()
		if t := pkt.TransportLayer(); t != nil {
			sp, dp := t.TransportFlow().Endpoints()
			where = fmt.Sprintf(" %s:%s -> %s:%s", src, sp, dst, dp)
		} else {
			where = fmt.Sprintf(" %s -> %s", src, dst)
		}
	}
	switch {
	case errors.Is(err, wirepcap.ErrTruncatedFrame):
		return "truncated before the UDP payload: " + proto + where
	default:
		return "not RoCEv2: " + proto + where
	}
}
