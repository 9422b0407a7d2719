package decode

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
)

// roceports decides which UDP ports carry RoCEv2 in one capture.
//
// rdma_rxe sends every packet to port 4791, and wirepcap decodes only
// that port. rxed engines may run on another one (--port), and then both
// ends use it as the destination. Such a port is RoCEv2 when the user
// names it (--port), or when a frame to it proves it: the UDP payload
// parses as BTH and its ICRC verifies against the captured IP and UDP
// headers, a 32-bit CRC that other traffic matches once in 2^32 frames.
// A proven port is remembered, so its later frames decode even when they
// are damaged (reported as bad_icrc, not skipped). rxed's pcap recorder
// writes the exact IP header of every frame, so each of its frames
// verifies and its captures decode without the flag.
type roceports struct {
	known map[uint16]bool // given or learned; 4791 is wirepcap's
}

func newRoCEPorts(given []uint16) *roceports {
	p := &roceports{known: make(map[uint16]bool)}
	for _, port := range given {
		p.known[port] = true
	}
	return p
}

// decode is wirepcap.DecodeRoCE for every RoCEv2 port of the capture. It
// returns wirepcap.ErrNotRoCE for UDP frames to any other port.
func (p *roceports) decode(lt layers.LinkType, data []byte, rf *wirepcap.RoCEFrame) error {
	err := wirepcap.DecodeRoCE(lt, data, rf)
	if !errors.Is(err, wirepcap.ErrNotRoCE) {
		return err
	}
	// rf.UDPFrame is filled in; parse and check as DecodeRoCE does.
	port := rf.Dst.Port()
	perr := rf.Packet.Parse(rf.Payload)
	icrc := wire.ICRCUnverifiable
	if !rf.Truncated {
		icrc = wire.VerifyICRC(rf.IP, rf.UDP, rf.Payload)
	}
	if !p.known[port] {
		if perr != nil || icrc != wire.ICRCOK {
			rf.Packet.Reset()
			return err
		}
		p.known[port] = true
	}
	rf.ParseErr, rf.ICRC = nil, icrc
	switch {
	case rf.Truncated:
		rf.ParseErr, rf.ICRC = wirepcap.ErrTruncatedFrame, wire.ICRCUnverifiable
	case perr != nil:
		rf.ParseErr = perr
	case icrc != wire.ICRCOK:
		rf.ParseErr = wirepcap.ErrBadICRC
	}
	return nil
}

// portList is the repeatable --port flag.
type portList []uint16

func (l *portList) String() string { return fmt.Sprint([]uint16(*l)) }

func (l *portList) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("want a UDP port 1..65535, got %q", s)
	}
	*l = append(*l, uint16(n))
	return nil
}
