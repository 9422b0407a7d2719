package decode

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
)

// jsonFrame holds the keys every -json line starts with.
type jsonFrame struct {
	Frame   int     `json:"frame"`
	Time    string  `json:"time"`
	RelTime float64 `json:"rel_time"`
	Len     int     `json:"len"`
}

// jsonSkipped is the -json line of a frame that is not RoCEv2.
type jsonSkipped struct {
	jsonFrame
	Skipped bool   `json:"skipped"`
	Reason  string `json:"reason"`
}

// jsonPacket is the -json line of a RoCEv2 frame. opcode, opcode_name,
// dqpn and psn are null when the packet is shorter than a BTH. Header objects use the key names of
// the conformance corpus (Scapy's field names).
type jsonPacket struct {
	jsonFrame

	Src       string   `json:"src"`
	Dst       string   `json:"dst"`
	SPort     uint16   `json:"sport"`
	DPort     uint16   `json:"dport"`
	IPVersion int      `json:"ip_version"`
	IPID      *uint16  `json:"ip_id,omitempty"`
	VLAN      []uint16 `json:"vlan,omitempty"`

	Opcode     *uint8   `json:"opcode"`
	OpcodeName *string  `json:"opcode_name"`
	Transport  string   `json:"transport,omitempty"`
	DQPN       *uint32  `json:"dqpn"`
	PSN        *uint32  `json:"psn"`
	BTH        *jsonBTH `json:"bth,omitempty"`
	Headers    []string `json:"headers"`

	RETH         *jsonRETH         `json:"reth,omitempty"`
	AETH         *jsonAETH         `json:"aeth,omitempty"`
	AtomicETH    *jsonAtomicETH    `json:"atomiceth,omitempty"`
	AtomicAckETH *jsonAtomicAckETH `json:"atomicacketh,omitempty"`
	DETH         *jsonDETH         `json:"deth,omitempty"`
	ImmDt        *jsonImmDt        `json:"immdt,omitempty"`
	IETH         *jsonIETH         `json:"ieth,omitempty"`
	FETH         *jsonFETH         `json:"feth,omitempty"`
	CNP          *jsonCNP          `json:"cnp,omitempty"`

	PayloadLen *int    `json:"payload_len,omitempty"`
	PayloadHex *string `json:"payload_hex,omitempty"`
	PadCount   *int    `json:"padcount,omitempty"`
	ICRCValue  *uint32 `json:"icrc_le_u32,omitempty"`
	ICRC       string  `json:"icrc"`
	Error      *string `json:"error"`
}

type jsonBTH struct {
	Opcode    uint8  `json:"opcode"`
	Solicited int    `json:"solicited"`
	MigReq    int    `json:"migreq"`
	PadCount  int    `json:"padcount"`
	Version   uint8  `json:"version"`
	PKey      uint16 `json:"pkey"`
	FECN      int    `json:"fecn"`
	BECN      int    `json:"becn"`
	Resv6     uint8  `json:"resv6"`
	DQPN      uint32 `json:"dqpn"`
	AckReq    int    `json:"ackreq"`
	Resv7     uint8  `json:"resv7"`
	PSN       uint32 `json:"psn"`
}

type jsonRETH struct {
	VA     uint64 `json:"va"`
	RKey   uint32 `json:"rkey"`
	DMALen uint32 `json:"dmalen"`
}

type jsonAETH struct {
	Syndrome      uint8  `json:"syndrome"`
	MSN           uint32 `json:"msn"`
	SyndromeKind  string `json:"syndrome_kind"`
	SyndromeValue uint8  `json:"syndrome_value"`
	NAKCode       string `json:"nak_code,omitempty"`
}

type jsonAtomicETH struct {
	VA      uint64 `json:"va"`
	RKey    uint32 `json:"rkey"`
	SwapAdd uint64 `json:"swap_add"`
	Compare uint64 `json:"compare"`
}

type jsonAtomicAckETH struct {
	OrigRemData uint64 `json:"orig_rem_data"`
}

type jsonDETH struct {
	QKey     uint32 `json:"qkey"`
	Reserved uint8  `json:"reserved"`
	SrcQP    uint32 `json:"srcqp"`
}

type jsonImmDt struct {
	Data uint32 `json:"data"`
	Hex  string `json:"hex"`
}

type jsonIETH struct {
	RKey uint32 `json:"rkey"`
}

type jsonFETH struct {
	PlacementType uint8 `json:"placement_type"`
	Selectivity   uint8 `json:"selectivity"`
}

type jsonCNP struct {
	Reserved1 uint64 `json:"reserved1"`
	Reserved2 uint64 `json:"reserved2"`
}

func ptr[T any](v T) *T { return &v }

func writeJSON(sb *strings.Builder, rec *record, opt Options) error {
	fr := rec.frame
	head := jsonFrame{
		Frame:   fr.Number,
		Time:    fr.Time.UTC().Format(time.RFC3339Nano),
		RelTime: rec.rel.Seconds(),
		Len:     fr.Length,
	}
	enc := json.NewEncoder(sb)
	enc.SetEscapeHTML(false)
	if rec.skip != "" {
		return enc.Encode(&jsonSkipped{head, true, rec.skip})
	}
	j := jsonPacket{jsonFrame: head}
	fillRoCE(&j, rec.rf, opt)
	return enc.Encode(&j)
}

func fillRoCE(j *jsonPacket, rf *wirepcap.RoCEFrame, opt Options) {
	j.Src, j.Dst = rf.Src.Addr().String(), rf.Dst.Addr().String()
	j.SPort, j.DPort = rf.Src.Port(), rf.Dst.Port()
	j.IPVersion = 6
	if rf.IPv4 {
		j.IPVersion = 4
		j.IPID = ptr(binary.BigEndian.Uint16(rf.IP[4:]))
	}
	if len(rf.VLAN) > 0 {
		j.VLAN = append([]uint16(nil), rf.VLAN...)
	}
	j.ICRC = rf.ICRC.String()
	j.Error = ptr(wirepcap.ErrorCode(rf.ParseErr))
	j.Headers = []string{}
	p := &rf.Packet
	if p.BTH == nil {
		return
	}
	b := p.BTH
	j.Opcode = ptr(uint8(p.Opcode))
	j.OpcodeName = ptr(p.Opcode.String())
	j.Transport = p.Info.Transport.String()
	j.DQPN, j.PSN = ptr(b.DestQP()), ptr(b.PSN())
	j.BTH = &jsonBTH{
		Opcode: uint8(p.Opcode), Solicited: b01(b.SE()), MigReq: b01(b.M()), PadCount: b.PadCount(),
		Version: b.TVer(), PKey: b.PKey(), FECN: b01(b.FECN()), BECN: b01(b.BECN()), Resv6: b.Resv6(),
		DQPN: b.DestQP(), AckReq: b01(b.AckReq()), Resv7: b.Resv7(), PSN: b.PSN(),
	}
	j.Headers = append(j.Headers, "BTH")
	if !headersParsed(rf.ParseErr) {
		return
	}
	for _, h := range p.Info.HeaderOrder() {
		j.Headers = append(j.Headers, h.Name())
	}
	if p.RETH != nil {
		j.RETH = &jsonRETH{p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALen()}
	}
	if p.AETH != nil {
		s := p.AETH.Syndrome()
		j.AETH = &jsonAETH{Syndrome: uint8(s), MSN: p.AETH.MSN(), SyndromeKind: s.Kind().String(), SyndromeValue: s.Value()}
		if s.Kind() == wire.SynNAK {
			j.AETH.NAKCode = wire.NAKCodeName(s.NAKCode())
		}
	}
	if a := p.AtomicETH; a != nil {
		j.AtomicETH = &jsonAtomicETH{a.VA(), a.RKey(), a.SwapAdd(), a.Compare()}
	}
	if p.AtomicAckETH != nil {
		j.AtomicAckETH = &jsonAtomicAckETH{p.AtomicAckETH.OrigData()}
	}
	if p.DETH != nil {
		j.DETH = &jsonDETH{p.DETH.QKey(), p.DETH.Reserved(), p.DETH.SrcQP()}
	}
	if p.ImmDt != nil {
		j.ImmDt = &jsonImmDt{p.ImmDt.Imm(), hex.EncodeToString(p.ImmDt)}
	}
	if p.IETH != nil {
		j.IETH = &jsonIETH{p.IETH.RKey()}
	}
	if p.FETH != nil {
		j.FETH = &jsonFETH{p.FETH.PlacementType(), p.FETH.Selectivity()}
	}
	if p.CNP != nil {
		j.CNP = &jsonCNP{p.CNP.Reserved1(), p.CNP.Reserved2()}
	}
	j.PayloadLen = ptr(len(p.Payload))
	j.PadCount = ptr(p.PadCount)
	j.ICRCValue = ptr(p.ICRC)
	if opt.Verbose {
		j.PayloadHex = ptr(hex.EncodeToString(p.Payload))
	}
}
