package conform

import (
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxed/rxed/pkg/wire"
)

// WritePcap writes a scenario's trace as a raw-IP pcap (readable by rxed
// decode, tshark): each datagram gets the IP and UDP headers Linux puts on
// it, with an incoming IPv4 packet's Identification solved from its ICRC,
// so that every ICRC in the capture verifies as it did on the wire.
func WritePcap(w io.Writer, r Result) error {
	local, err := netip.ParseAddrPort(r.Local)
	if err != nil {
		return fmt.Errorf("conform: pcap: local %q: %v", r.Local, err)
	}
	peer, err := netip.ParseAddrPort(r.Peer)
	if err != nil {
		return fmt.Errorf("conform: pcap: peer %q: %v", r.Peer, err)
	}
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(65536, layers.LinkTypeRaw); err != nil {
		return err
	}
	base := time.Unix(0, 0).Add(time.Duration(time.Now().Unix()) * time.Second)
	for _, e := range r.Trace {
		f := wire.Flow{Src: local, Dst: peer}
		if e.Dir == In {
			f = f.Reverse()
		}
		frame := make([]byte, 48+len(e.Raw))
		n := f.PutHeaders(frame, len(e.Raw))
		if e.Dir == In && e.ipID != 0 && n == 20 {
			wire.SetIPv4ID(frame[:20], e.ipID)
		}
		copy(frame[n+8:], e.Raw)
		frame = frame[:n+8+len(e.Raw)]
		ci := gopacket.CaptureInfo{Timestamp: base.Add(e.At), CaptureLength: len(frame), Length: len(frame)}
		if err := pw.WritePacket(ci, frame); err != nil {
			return err
		}
	}
	return nil
}
