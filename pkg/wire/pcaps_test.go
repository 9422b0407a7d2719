package wire_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// TestRealCaptures checks every RoCEv2 packet of the rdma_rxe captures:
// it parses, its ICRC verifies against the captured IP header, and
// Flow.Verify, which sees only addresses and ports, solves the true IPv4
// Identification.
func TestRealCaptures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(sharedDir(t), "pcaps", "*.pcap"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	total := 0
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			frames, err := wirepcap.ReadFile(path)
			require.NoError(t, err)
			var uf wirepcap.UDPFrame
			var p wire.Packet
			n := 0
			for _, fr := range frames {
				err := wirepcap.DissectUDP(fr.LinkType, fr.Data, &uf)
				if errors.Is(err, wirepcap.ErrNotUDP) {
					continue
				}
				require.NoError(t, err, "frame %d", fr.Number)
				if !uf.IsRoCE() {
					continue
				}
				n++
				require.False(t, uf.Truncated)
				require.NoError(t, p.Parse(uf.Payload), "frame %d", fr.Number)
				require.Equal(t, wire.ICRCOK, wire.VerifyICRC(uf.IP, uf.UDP, uf.Payload), "frame %d", fr.Number)
				v, id := wire.Flow{Src: uf.Src, Dst: uf.Dst}.Verify(uf.Payload)
				require.Equal(t, wire.ICRCOK, v, "frame %d", fr.Number)
				if uf.IPv4 {
					require.Equal(t, uint16(uf.IP[4])<<8|uint16(uf.IP[5]), id, "frame %d: solved IPv4 ID", fr.Number)
					require.NotZero(t, id, "rxe never sends ID 0")
				}
				// A flipped payload bit must fail both checks.
				c := append([]byte(nil), uf.Payload...)
				c[len(c)/2] ^= 0x10
				require.Equal(t, wire.ICRCBad, wire.VerifyICRC(uf.IP, uf.UDP, c))
				v, _ = wire.Flow{Src: uf.Src, Dst: uf.Dst}.Verify(c)
				require.Equal(t, wire.ICRCBad, v, "frame %d corrupted", fr.Number)
			}
			require.NotZero(t, n)
			total += n
		})
	}
	t.Logf("%d RoCEv2 packets verified", total)
}
