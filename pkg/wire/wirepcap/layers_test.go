package wirepcap_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

func allCaptures(t *testing.T) []string {
	shared := sharedDir(t)
	files, err := filepath.Glob(filepath.Join(shared, "pcaps", "*.pcap"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return append(files, filepath.Join(shared, "conformance", "valid.pcap"))
}

// TestGopacketLayers decodes every frame of the real captures and of the
// conformance corpus with gopacket.NewPacket: each RoCEv2 frame yields a
// BTH layer, one layer per extension header in wire order, the payload,
// and an ICRC that verifies; other frames have no BTH layer.
func TestGopacketLayers(t *testing.T) {
	layerOf := map[wire.HeaderSet]gopacket.LayerType{
		wire.HdrRETH: wirepcap.LayerTypeRETH, wire.HdrAETH: wirepcap.LayerTypeAETH,
		wire.HdrAtomicETH: wirepcap.LayerTypeAtomicETH, wire.HdrAtomicAckETH: wirepcap.LayerTypeAtomicAckETH,
		wire.HdrDETH: wirepcap.LayerTypeDETH, wire.HdrImmDt: wirepcap.LayerTypeImmDt,
		wire.HdrIETH: wirepcap.LayerTypeIETH, wire.HdrFETH: wirepcap.LayerTypeFETH, wire.HdrCNP: wirepcap.LayerTypeCNP,
	}
	roce := 0
	for _, path := range allCaptures(t) {
		frames, err := wirepcap.ReadFile(path)
		require.NoError(t, err)
		var rf wirepcap.RoCEFrame
		for _, fr := range frames {
			pkt := gopacket.NewPacket(fr.Data, fr.LinkType, gopacket.Default)
			err := wirepcap.DecodeRoCE(fr.LinkType, fr.Data, &rf)
			bl, _ := pkt.Layer(wirepcap.LayerTypeBTH).(*wirepcap.BTH)
			if err != nil {
				require.Nil(t, bl, "%s frame %d", path, fr.Number)
				continue
			}
			roce++
			require.NotNil(t, bl, "%s frame %d", path, fr.Number)
			require.Nil(t, pkt.ErrorLayer(), "%s frame %d", path, fr.Number)
			p := &rf.Packet
			require.Equal(t, p.Opcode, bl.Opcode)
			require.Equal(t, p.BTH.PSN(), bl.PSN)
			require.Equal(t, p.BTH.DestQP(), bl.DestQP)
			require.Equal(t, p.ICRC, bl.ICRC)
			require.Equal(t, p.Payload, bl.Packet().Payload)
			require.Equal(t, p.Raw, bl.Packet().Raw)
			require.Equal(t, wire.ICRCOK, wirepcap.VerifyPacketICRC(pkt))

			var got []gopacket.LayerType
			after := false
			for _, l := range pkt.Layers() {
				if l.LayerType() == wirepcap.LayerTypeBTH {
					after = true
					continue
				}
				if after {
					got = append(got, l.LayerType())
				}
			}
			var want []gopacket.LayerType
			for _, h := range p.Info.HeaderOrder() {
				want = append(want, layerOf[h])
			}
			if len(p.Payload) > 0 {
				want = append(want, gopacket.LayerTypePayload)
				require.Equal(t, []byte(p.Payload), pkt.ApplicationLayer().Payload())
			}
			require.Equal(t, want, got, "%s frame %d", path, fr.Number)
			if r, ok := pkt.Layer(wirepcap.LayerTypeRETH).(*wirepcap.RETH); ok {
				require.Equal(t, p.RETH.VA(), r.VA)
				require.Equal(t, p.RETH.DMALen(), r.DMALen)
			}
			if a, ok := pkt.Layer(wirepcap.LayerTypeAETH).(*wirepcap.AETH); ok {
				require.Equal(t, p.AETH.Syndrome(), a.Syndrome)
				require.Equal(t, p.AETH.MSN(), a.MSN)
			}
		}
	}
	require.Greater(t, roce, 1000)
}

func TestGopacketLayerErrors(t *testing.T) {
	// A bad opcode still shows the BTH, then a decode failure.
	data := make([]byte, 32)
	data[0] = 0x18
	pkt := gopacket.NewPacket(data, wirepcap.LayerTypeBTH, gopacket.Default)
	require.NotNil(t, pkt.Layer(wirepcap.LayerTypeBTH))
	require.NotNil(t, pkt.ErrorLayer())
	require.True(t, errors.Is(pkt.ErrorLayer().Error(), wire.ErrBadOpcode))
	// Shorter than a BTH: only a failure, marked truncated.
	pkt = gopacket.NewPacket(data[:5], wirepcap.LayerTypeBTH, gopacket.Default)
	require.Nil(t, pkt.Layer(wirepcap.LayerTypeBTH))
	require.NotNil(t, pkt.ErrorLayer())
	require.True(t, pkt.Metadata().Truncated)
	require.Equal(t, wire.ICRCUnverifiable, wirepcap.VerifyPacketICRC(pkt))
	// DecodingLayer use.
	var b wirepcap.BTH
	h := wire.Headers{Opcode: wire.RCSendOnly, PSN: 7}
	buf := make([]byte, h.Len(3))
	_, err := h.Encode(buf, []byte("abc"))
	require.NoError(t, err)
	require.NoError(t, b.DecodeFromBytes(buf, gopacket.NilDecodeFeedback))
	require.Equal(t, uint32(7), b.PSN)
	require.Equal(t, []byte("abc"), b.LayerPayload())
	require.Equal(t, gopacket.LayerTypePayload, b.NextLayerType())
	require.Equal(t, gopacket.LayerClass(wirepcap.LayerTypeBTH), b.CanDecode())
}

// FuzzGopacketLayers: no input makes the layer decoders panic, through
// Ethernet or straight into the BTH decoder, nor the hand dissector; and
// the gopacket layers agree with wire's parser they wrap. Straight into
// the BTH decoder: a BTH layer exactly when there are BTHLen bytes, its
// fields those of the bytes, a decode failure exactly when
// wire.Packet.Parse fails and then with its error; on success one layer
// per extension header in wire order carrying wire's values, then the
// payload. Through Ethernet: when the hand dissector finds a well-formed
// RoCEv2 packet whose ICRC verifies and gopacket decodes the frame to a
// BTH without a failure, both see the same packet and the same ICRC
// verdict.
func FuzzGopacketLayers(f *testing.F) {
	// Seeds from the conformance corpus when it is there; the target
	// itself needs no reference data.
	if frames, err := wirepcap.ReadFile(filepath.Join("..", "..", "..", "..", "shared", "conformance", "valid.pcap")); err == nil {
		var rf wirepcap.RoCEFrame
		for i, fr := range frames {
			if i%8 == 0 {
				f.Add(fr.Data)
				// Its RoCE packet alone, for the BTH decoder.
				if wirepcap.DecodeRoCE(fr.LinkType, fr.Data, &rf) == nil {
					f.Add(bytes.Clone(rf.Payload))
				}
			}
		}
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		pkt := gopacket.NewPacket(data, layers.LinkTypeEthernet, gopacket.Default)
		verdict := wirepcap.VerifyPacketICRC(pkt)
		for _, l := range pkt.Layers() {
			_ = gopacket.LayerString(l)
		}
		var rf wirepcap.RoCEFrame
		if wirepcap.DecodeRoCE(layers.LinkTypeEthernet, data, &rf) == nil && rf.ParseErr == nil {
			if bl, ok := pkt.Layer(wirepcap.LayerTypeBTH).(*wirepcap.BTH); ok && pkt.ErrorLayer() == nil && !pkt.Metadata().Truncated {
				require.Equal(t, rf.Packet.Raw, bl.Packet().Raw, "gopacket and the dissector differ on the RoCE bytes")
				require.Equal(t, rf.ICRC, verdict, "ICRC verdicts differ")
			}
		}
		_ = wirepcap.DecodeRoCE(layers.LinkTypeRaw, data, &rf)

		checkBTHLayers(t, data)
	})
}

// checkBTHLayers decodes data straight into the BTH layer and checks it
// against wire.Packet.Parse of the same bytes.
func checkBTHLayers(t *testing.T, data []byte) {
	pkt := gopacket.NewPacket(data, wirepcap.LayerTypeBTH, gopacket.Default)
	var p wire.Packet
	perr := p.Parse(data)
	bl, _ := pkt.Layer(wirepcap.LayerTypeBTH).(*wirepcap.BTH)
	if len(data) < wire.BTHLen {
		require.Nil(t, bl)
		require.NotNil(t, pkt.ErrorLayer())
		return
	}
	require.NotNil(t, bl)
	h := wire.BTH(data)
	require.Equal(t, h.Opcode(), bl.Opcode)
	require.Equal(t, h.PSN(), bl.PSN)
	require.Equal(t, h.DestQP(), bl.DestQP)
	require.Equal(t, h.PKey(), bl.PKey)
	require.Equal(t, h.PadCount(), bl.PadCount)
	require.Equal(t, h.AckReq(), bl.AckReq)
	if perr != nil {
		require.NotNil(t, pkt.ErrorLayer(), "Parse failed (%v) but the layers did not", perr)
		require.EqualError(t, pkt.ErrorLayer().Error(), perr.Error())
		return
	}
	require.Nil(t, pkt.ErrorLayer(), "Parse accepted what the layers refused")
	require.Equal(t, p.ICRC, bl.ICRC)
	require.Equal(t, p.Payload, bl.Packet().Payload)
	var got, want []gopacket.LayerType
	for _, l := range pkt.Layers()[1:] {
		got = append(got, l.LayerType())
	}
	for _, hs := range p.Info.HeaderOrder() {
		want = append(want, extLayerType[hs])
	}
	if len(p.Payload) > 0 {
		want = append(want, gopacket.LayerTypePayload)
		require.Equal(t, []byte(p.Payload), pkt.ApplicationLayer().Payload())
	}
	require.Equal(t, want, got)
	if r, ok := pkt.Layer(wirepcap.LayerTypeRETH).(*wirepcap.RETH); ok {
		require.Equal(t, p.RETH.VA(), r.VA)
		require.Equal(t, p.RETH.RKey(), r.RKey)
		require.Equal(t, p.RETH.DMALen(), r.DMALen)
	}
	if a, ok := pkt.Layer(wirepcap.LayerTypeAETH).(*wirepcap.AETH); ok {
		require.Equal(t, p.AETH.Syndrome(), a.Syndrome)
		require.Equal(t, p.AETH.MSN(), a.MSN)
	}
	if d, ok := pkt.Layer(wirepcap.LayerTypeDETH).(*wirepcap.DETH); ok {
		require.Equal(t, p.DETH.QKey(), d.QKey)
		require.Equal(t, p.DETH.SrcQP(), d.SrcQP)
	}
	if a, ok := pkt.Layer(wirepcap.LayerTypeAtomicETH).(*wirepcap.AtomicETH); ok {
		require.Equal(t, p.AtomicETH.VA(), a.VA)
		require.Equal(t, p.AtomicETH.SwapAdd(), a.SwapAdd)
		require.Equal(t, p.AtomicETH.Compare(), a.Compare)
	}
}

// extLayerType is the gopacket layer of each extension header.
var extLayerType = map[wire.HeaderSet]gopacket.LayerType{
	wire.HdrRETH: wirepcap.LayerTypeRETH, wire.HdrAETH: wirepcap.LayerTypeAETH,
	wire.HdrAtomicETH: wirepcap.LayerTypeAtomicETH, wire.HdrAtomicAckETH: wirepcap.LayerTypeAtomicAckETH,
	wire.HdrDETH: wirepcap.LayerTypeDETH, wire.HdrImmDt: wirepcap.LayerTypeImmDt,
	wire.HdrIETH: wirepcap.LayerTypeIETH, wire.HdrFETH: wirepcap.LayerTypeFETH, wire.HdrCNP: wirepcap.LayerTypeCNP,
}
