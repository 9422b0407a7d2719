package decode

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
)

// writeText prints the one-line summary of a frame and, with Verbose,
// every field on indented lines below it.
func writeText(sb *strings.Builder, rec *record, opt Options) {
	fmt.Fprintf(sb, "%5d %11.6f ", rec.frame.Number, rec.rel.Seconds())
	if rec.skip != "" {
		fmt.Fprintf(sb, "skipped (%s)\n", rec.skip)
		return
	}
	rf := rec.rf
	p := &rf.Packet
	fmt.Fprintf(sb, "%s -> %s ", rf.Src, rf.Dst)
	if p.BTH == nil {
		fmt.Fprintf(sb, "(%d bytes, no BTH)", len(rf.Payload))
	} else {
		b := p.BTH
		fmt.Fprintf(sb, "%s QP=0x%06x PSN=%d", p.Opcode, b.DestQP(), b.PSN())
		for _, f := range []struct {
			on   bool
			name string
		}{{b.SE(), "SE"}, {b.M(), "M"}, {b.AckReq(), "AckReq"}, {b.FECN(), "FECN"}, {b.BECN(), "BECN"}} {
			if f.on {
				sb.WriteString(" " + f.name)
			}
		}
		if b.PKey() != 0xffff {
			fmt.Fprintf(sb, " PKey=0x%04x", b.PKey())
		}
		if headersParsed(rf.ParseErr) {
			writeKeyFields(sb, p)
			if p.Info.Flags.Has(wire.FlagPayload) {
				fmt.Fprintf(sb, " len=%d", len(p.Payload))
				if p.PadCount != 0 {
					fmt.Fprintf(sb, " pad=%d", p.PadCount)
				}
			}
		}
	}
	fmt.Fprintf(sb, " icrc=%s", rf.ICRC)
	if rf.ParseErr != nil {
		fmt.Fprintf(sb, " error=%s", wirepcap.ErrorCode(rf.ParseErr))
	}
	sb.WriteByte('\n')
	if opt.Verbose {
		writeVerbose(sb, rec)
	}
}

// headersParsed reports whether a packet with defect err (RoCEFrame.ParseErr)
// has its extension headers parsed: it is well formed, at most its ICRC is bad.
func headersParsed(err error) bool { return err == nil || err == wirepcap.ErrBadICRC }

func writeKeyFields(sb *strings.Builder, p *wire.Packet) {
	for _, h := range p.Info.HeaderOrder() {
		switch h {
		case wire.HdrRETH:
			fmt.Fprintf(sb, " RETH(va=0x%x rkey=0x%x dmalen=%d)", p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALen())
		case wire.HdrAETH:
			fmt.Fprintf(sb, " AETH(%s msn=%d)", syndromeText(p.AETH.Syndrome()), p.AETH.MSN())
		case wire.HdrAtomicETH:
			a := p.AtomicETH
			fmt.Fprintf(sb, " AtomicETH(va=0x%x rkey=0x%x swap_add=0x%x compare=0x%x)", a.VA(), a.RKey(), a.SwapAdd(), a.Compare())
		case wire.HdrAtomicAckETH:
			fmt.Fprintf(sb, " AtomicAckETH(orig=0x%x)", p.AtomicAckETH.OrigData())
		case wire.HdrDETH:
			fmt.Fprintf(sb, " DETH(qkey=0x%x srcqp=0x%06x)", p.DETH.QKey(), p.DETH.SrcQP())
		case wire.HdrImmDt:
			fmt.Fprintf(sb, " ImmDt(0x%08x)", p.ImmDt.Imm())
		case wire.HdrIETH:
			fmt.Fprintf(sb, " IETH(rkey=0x%x)", p.IETH.RKey())
		case wire.HdrFETH:
			fmt.Fprintf(sb, " FETH(placement=%d selectivity=%d)", p.FETH.PlacementType(), p.FETH.Selectivity())
		case wire.HdrCNP:
			sb.WriteString(" CNP")
		}
	}
}

func syndromeText(s wire.Syndrome) string {
	switch s.Kind() {
	case wire.SynACK:
		return fmt.Sprintf("ACK credits=%d", s.Credits())
	case wire.SynRNR:
		return fmt.Sprintf("RNR_NAK timer=%d", s.RNRTimer())
	case wire.SynNAK:
		return "NAK " + wire.NAKCodeName(s.NAKCode())
	}
	return fmt.Sprintf("reserved syndrome 0x%02x", uint8(s))
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}

func writeVerbose(sb *strings.Builder, rec *record) {
	rf := rec.rf
	fr := rec.frame
	fmt.Fprintf(sb, "      Frame: %d bytes captured, %d on the wire, link %s, time %s", len(fr.Data), fr.Length, fr.LinkType, fr.Time.UTC().Format("2006-01-02T15:04:05.000000000Z"))
	if len(rf.VLAN) > 0 {
		fmt.Fprintf(sb, ", VLAN %v", rf.VLAN)
	}
	sb.WriteByte('\n')
	ip := rf.IP
	if rf.IPv4 {
		fmt.Fprintf(sb, "      IPv4: %s -> %s ihl=%d tos=0x%02x len=%d id=%d flags=0x%x frag=%d ttl=%d proto=%d checksum=0x%04x\n",
			rf.Src.Addr(), rf.Dst.Addr(), ip[0]&15, ip[1], binary.BigEndian.Uint16(ip[2:]), binary.BigEndian.Uint16(ip[4:]),
			ip[6]>>5, binary.BigEndian.Uint16(ip[6:])&0x1fff, ip[8], ip[9], binary.BigEndian.Uint16(ip[10:]))
	} else {
		v := binary.BigEndian.Uint32(ip)
		fmt.Fprintf(sb, "      IPv6: %s -> %s tc=0x%02x flow_label=0x%05x plen=%d next_header=%d hop_limit=%d\n",
			rf.Src.Addr(), rf.Dst.Addr(), v>>20&0xff, v&0xfffff, binary.BigEndian.Uint16(ip[4:]), ip[6], ip[7])
	}
	u := rf.UDP
	fmt.Fprintf(sb, "      UDP: %d -> %d len=%d checksum=0x%04x\n", rf.Src.Port(), rf.Dst.Port(), binary.BigEndian.Uint16(u[4:]), binary.BigEndian.Uint16(u[6:]))
	p := &rf.Packet
	if p.BTH == nil {
		return
	}
	b := p.BTH
	fmt.Fprintf(sb, "      BTH: opcode=0x%02x (%s, %s) se=%d m=%d padcount=%d tver=%d pkey=0x%04x fecn=%d becn=%d resv6=0x%02x dqpn=0x%06x ackreq=%d resv7=0x%02x psn=%d\n",
		uint8(p.Opcode), p.Opcode, p.Info.Transport, b01(b.SE()), b01(b.M()), b.PadCount(), b.TVer(), b.PKey(),
		b01(b.FECN()), b01(b.BECN()), b.Resv6(), b.DestQP(), b01(b.AckReq()), b.Resv7(), b.PSN())
	if !headersParsed(rf.ParseErr) {
		fmt.Fprintf(sb, "      Error: %v\n", rf.ParseErr)
		return
	}
	for _, h := range p.Info.HeaderOrder() {
		switch h {
		case wire.HdrRETH:
			fmt.Fprintf(sb, "      RETH: va=0x%016x rkey=0x%08x dmalen=%d\n", p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALen())
		case wire.HdrAETH:
			s := p.AETH.Syndrome()
			fmt.Fprintf(sb, "      AETH: syndrome=0x%02x (%s) msn=%d\n", uint8(s), syndromeText(s), p.AETH.MSN())
		case wire.HdrAtomicETH:
			a := p.AtomicETH
			fmt.Fprintf(sb, "      AtomicETH: va=0x%016x rkey=0x%08x swap_add=0x%016x compare=0x%016x\n", a.VA(), a.RKey(), a.SwapAdd(), a.Compare())
		case wire.HdrAtomicAckETH:
			fmt.Fprintf(sb, "      AtomicAckETH: orig_rem_data=0x%016x\n", p.AtomicAckETH.OrigData())
		case wire.HdrDETH:
			fmt.Fprintf(sb, "      DETH: qkey=0x%08x reserved=%d srcqp=0x%06x\n", p.DETH.QKey(), p.DETH.Reserved(), p.DETH.SrcQP())
		case wire.HdrImmDt:
			fmt.Fprintf(sb, "      ImmDt: 0x%08x\n", p.ImmDt.Imm())
		case wire.HdrIETH:
			fmt.Fprintf(sb, "      IETH: rkey=0x%08x\n", p.IETH.RKey())
		case wire.HdrFETH:
			fmt.Fprintf(sb, "      FETH: placement_type=%d selectivity=%d\n", p.FETH.PlacementType(), p.FETH.Selectivity())
		case wire.HdrCNP:
			fmt.Fprintf(sb, "      CNP: reserved1=0x%016x reserved2=0x%016x\n", p.CNP.Reserved1(), p.CNP.Reserved2())
		}
	}
	if p.Info.Flags.Has(wire.FlagPayload) {
		fmt.Fprintf(sb, "      Payload: %d bytes", len(p.Payload))
		if n := min(len(p.Payload), 32); n > 0 {
			fmt.Fprintf(sb, " %s", hex.EncodeToString(p.Payload[:n]))
			if n < len(p.Payload) {
				sb.WriteString("...")
			}
		}
		fmt.Fprintf(sb, " pad=%d\n", p.PadCount)
	}
	fmt.Fprintf(sb, "      ICRC: 0x%08x %s\n", p.ICRC, rf.ICRC)
}
