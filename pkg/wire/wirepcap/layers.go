package wirepcap

import (
	"errors"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/pkg/wire"
)

// gopacket layer types for the RoCEv2 transport headers. Importing this
// package registers LayerTypeBTH on UDP port 4791, so gopacket.NewPacket on
// any Ethernet, IPv4, IPv6 or UDP data decodes RoCEv2 packets into a BTH
// layer, one layer per extension header in wire order, and a Payload layer
// (pad and ICRC excluded).
var (
	LayerTypeBTH          = register(0, "BTH", decodeBTH)
	LayerTypeRETH         = register(1, "RETH", nil)
	LayerTypeAETH         = register(2, "AETH", nil)
	LayerTypeAtomicETH    = register(3, "AtomicETH", nil)
	LayerTypeAtomicAckETH = register(4, "AtomicAckETH", nil)
	LayerTypeDETH         = register(5, "DETH", nil)
	LayerTypeImmDt        = register(6, "ImmDt", nil)
	LayerTypeIETH         = register(7, "IETH", nil)
	LayerTypeFETH         = register(8, "FETH", nil)
	LayerTypeCNP          = register(9, "CNP", nil)
)

// layerTypeBase keeps the registered numbers out of gopacket's own range.
const layerTypeBase = 4791_000

func register(i int, name string, dec func([]byte, gopacket.PacketBuilder) error) gopacket.LayerType {
	var d gopacket.Decoder
	if dec != nil {
		d = gopacket.DecodeFunc(dec)
	} else {
		d = gopacket.DecodeFunc(func([]byte, gopacket.PacketBuilder) error {
			return errors.New("wirepcap: " + name + " is decoded as part of its BTH layer")
		})
	}
	return gopacket.RegisterLayerType(layerTypeBase+i, gopacket.LayerTypeMetadata{Name: name, Decoder: d})
}

func init() {
	layers.RegisterUDPPortLayerType(layers.UDPPort(wire.UDPPort), LayerTypeBTH)
}

// BTH is the gopacket layer of a RoCEv2 packet's Base Transport Header. It
// also carries the packet-level results of parsing: the ICRC, and the whole
// wire.Packet through the Packet method.
type BTH struct {
	layers.BaseLayer
	Opcode   wire.Opcode
	SE, M    bool
	PadCount int
	TVer     uint8
	PKey     uint16
	FECN     bool
	BECN     bool
	DestQP   uint32
	AckReq   bool
	PSN      uint32
	ICRC     uint32 // as received (wire bytes read little-endian)
	pkt      wire.Packet
}

// Packet returns the full parse behind the layer (every view aliases the
// packet data); after a parse error only Raw and the BTH view are set.
// It is unexported as a field so gopacket's layer dumps stay readable.
func (b *BTH) Packet() *wire.Packet { return &b.pkt }

// LayerType implements gopacket.Layer.
func (b *BTH) LayerType() gopacket.LayerType { return LayerTypeBTH }

// CanDecode implements gopacket.DecodingLayer.
func (b *BTH) CanDecode() gopacket.LayerClass { return LayerTypeBTH }

// NextLayerType implements gopacket.DecodingLayer: in a DecodingLayerParser
// the extension headers are reached through b.Packet, and the next layer
// is the payload.
func (b *BTH) NextLayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

// DecodeFromBytes implements gopacket.DecodingLayer. data is the UDP
// payload. Contents is the BTH; Payload the application payload (the
// extension headers are in Packet()). Decoded by gopacket.NewPacket
// instead, the BTH is followed by one layer per extension header and its
// Payload is, as usual, everything after it.
func (b *BTH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	err := b.pkt.Parse(data)
	if len(data) < wire.BTHLen {
		df.SetTruncated()
		return err
	}
	h := wire.BTH(data)
	*b = BTH{
		BaseLayer: layers.BaseLayer{Contents: data[:wire.BTHLen], Payload: b.pkt.Payload},
		Opcode:    h.Opcode(), SE: h.SE(), M: h.M(), PadCount: h.PadCount(), TVer: h.TVer(),
		PKey: h.PKey(), FECN: h.FECN(), BECN: h.BECN(), DestQP: h.DestQP(), AckReq: h.AckReq(),
		PSN: h.PSN(), ICRC: b.pkt.ICRC, pkt: b.pkt,
	}
	if errors.Is(err, wire.ErrTruncated) {
		df.SetTruncated()
	}
	return err
}

func decodeBTH(data []byte, p gopacket.PacketBuilder) error {
	b := &BTH{}
	err := b.DecodeFromBytes(data, p)
	if len(data) < wire.BTHLen {
		return err
	}
	p.AddLayer(b)
	if err != nil {
		return err
	}
	pk := &b.pkt
	info := pk.Info
	// As in gopacket's own layers, each layer's payload is everything after
	// it: here the following headers and the payload, up to the pad.
	end := info.HdrLen + len(pk.Payload)
	b.Payload = data[wire.BTHLen:end]
	for k, h := range info.HeaderOrder() {
		off := info.Offsets[k]
		base := layers.BaseLayer{Contents: data[off : off+h.Len()], Payload: data[off+h.Len() : end]}
		p.AddLayer(extLayer(h, base, pk))
	}
	if len(pk.Payload) == 0 {
		return nil
	}
	return p.NextDecoder(gopacket.LayerTypePayload)
}

func extLayer(h wire.HeaderSet, base layers.BaseLayer, pk *wire.Packet) gopacket.Layer {
	switch h {
	case wire.HdrRETH:
		return &RETH{BaseLayer: base, VA: pk.RETH.VA(), RKey: pk.RETH.RKey(), DMALen: pk.RETH.DMALen()}
	case wire.HdrAETH:
		return &AETH{BaseLayer: base, Syndrome: pk.AETH.Syndrome(), MSN: pk.AETH.MSN()}
	case wire.HdrAtomicETH:
		a := pk.AtomicETH
		return &AtomicETH{BaseLayer: base, VA: a.VA(), RKey: a.RKey(), SwapAdd: a.SwapAdd(), Compare: a.Compare()}
	case wire.HdrAtomicAckETH:
		return &AtomicAckETH{BaseLayer: base, OrigData: pk.AtomicAckETH.OrigData()}
	case wire.HdrDETH:
		return &DETH{BaseLayer: base, QKey: pk.DETH.QKey(), SrcQP: pk.DETH.SrcQP()}
	case wire.HdrImmDt:
		return &ImmDt{BaseLayer: base, Imm: pk.ImmDt.Imm()}
	case wire.HdrIETH:
		return &IETH{BaseLayer: base, RKey: pk.IETH.RKey()}
	case wire.HdrFETH:
		return &FETH{BaseLayer: base, PlacementType: pk.FETH.PlacementType(), Selectivity: pk.FETH.Selectivity()}
	default: // wire.HdrCNP: the only other header a supported opcode has
		return &CNP{BaseLayer: base}
	}
}

// RETH is the gopacket layer of an RDMA Extended Transport Header.
type RETH struct {
	layers.BaseLayer
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// LayerType implements gopacket.Layer.
func (*RETH) LayerType() gopacket.LayerType { return LayerTypeRETH }

// AETH is the gopacket layer of an ACK Extended Transport Header.
type AETH struct {
	layers.BaseLayer
	Syndrome wire.Syndrome
	MSN      uint32
}

// LayerType implements gopacket.Layer.
func (*AETH) LayerType() gopacket.LayerType { return LayerTypeAETH }

// AtomicETH is the gopacket layer of an Atomic Extended Transport Header.
type AtomicETH struct {
	layers.BaseLayer
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// LayerType implements gopacket.Layer.
func (*AtomicETH) LayerType() gopacket.LayerType { return LayerTypeAtomicETH }

// AtomicAckETH is the gopacket layer of an Atomic Acknowledge ETH.
type AtomicAckETH struct {
	layers.BaseLayer
	OrigData uint64
}

// LayerType implements gopacket.Layer.
func (*AtomicAckETH) LayerType() gopacket.LayerType { return LayerTypeAtomicAckETH }

// DETH is the gopacket layer of a Datagram Extended Transport Header.
type DETH struct {
	layers.BaseLayer
	QKey  uint32
	SrcQP uint32
}

// LayerType implements gopacket.Layer.
func (*DETH) LayerType() gopacket.LayerType { return LayerTypeDETH }

// ImmDt is the gopacket layer of the Immediate Data header.
type ImmDt struct {
	layers.BaseLayer
	Imm uint32
}

// LayerType implements gopacket.Layer.
func (*ImmDt) LayerType() gopacket.LayerType { return LayerTypeImmDt }

// IETH is the gopacket layer of an Invalidate Extended Transport Header.
type IETH struct {
	layers.BaseLayer
	RKey uint32
}

// LayerType implements gopacket.Layer.
func (*IETH) LayerType() gopacket.LayerType { return LayerTypeIETH }

// FETH is the gopacket layer of a Flush Extended Transport Header.
type FETH struct {
	layers.BaseLayer
	PlacementType uint8
	Selectivity   uint8
}

// LayerType implements gopacket.Layer.
func (*FETH) LayerType() gopacket.LayerType { return LayerTypeFETH }

// CNP is the gopacket layer of a CNP's 16 reserved bytes.
type CNP struct {
	layers.BaseLayer
}

// LayerType implements gopacket.Layer.
func (*CNP) LayerType() gopacket.LayerType { return LayerTypeCNP }

// Reserved returns the two reserved 64-bit words.
func (c *CNP) Reserved() (uint64, uint64) {
	b := wire.CNPBody(c.Contents)
	return b.Reserved1(), b.Reserved2()
}

// VerifyPacketICRC checks the ICRC of a decoded gopacket packet against its
// own IP and UDP headers. It returns ICRCUnverifiable when the packet has
// no BTH, IP or UDP layer or was truncated by the capture.
func VerifyPacketICRC(pkt gopacket.Packet) wire.Verdict {
	bl, _ := pkt.Layer(LayerTypeBTH).(*BTH)
	udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if bl == nil || udp == nil || (pkt.Metadata() != nil && pkt.Metadata().Truncated) {
		return wire.ICRCUnverifiable
	}
	var ip []byte
	if v4, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
		ip = v4.Contents
	} else if v6, ok := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
		ip = v6.Contents
	} else {
		return wire.ICRCUnverifiable
	}
	return wire.VerifyICRC(ip, udp.Contents, udp.Payload)
}
