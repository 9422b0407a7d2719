package wirepcap_test

import (
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
// Ethernet or straight into the BTH decoder, nor the hand dissector.
func FuzzGopacketLayers(f *testing.F) {
	// Seeds from the conformance corpus when it is there; the target
	// itself needs no reference data.
	if frames, err := wirepcap.ReadFile(filepath.Join("..", "..", "..", "..", "shared", "conformance", "valid.pcap")); err == nil {
		for i, fr := range frames {
			if i%8 == 0 {
				f.Add(fr.Data)
			}
		}
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		pkt := gopacket.NewPacket(data, layers.LinkTypeEthernet, gopacket.Default)
		_ = wirepcap.VerifyPacketICRC(pkt)
		for _, l := range pkt.Layers() {
			_ = gopacket.LayerString(l)
		}
		gopacket.NewPacket(data, wirepcap.LayerTypeBTH, gopacket.Default)
		var rf wirepcap.RoCEFrame
		_ = wirepcap.DecodeRoCE(layers.LinkTypeEthernet, data, &rf)
		_ = wirepcap.DecodeRoCE(layers.LinkTypeRaw, data, &rf)
	})
}
