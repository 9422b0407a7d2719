package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpcodeTable checks header lengths and properties against
// rdma_rxe's rxe_opcode.c, and that everything else is rejected.
func TestOpcodeTable(t *testing.T) {
	want := map[Opcode]struct {
		name   string
		hdrLen int
		flags  OpFlags
	}{
		RCSendFirst:          {"RC_SEND_FIRST", 12, FlagPayload | FlagFirst | FlagSend},
		RCSendMiddle:         {"RC_SEND_MIDDLE", 12, FlagPayload | FlagMiddle},
		RCSendLast:           {"RC_SEND_LAST", 12, FlagPayload | FlagLast},
		RCSendLastImm:        {"RC_SEND_LAST_WITH_IMMEDIATE", 16, FlagPayload | FlagLast | FlagImm},
		RCSendOnly:           {"RC_SEND_ONLY", 12, FlagPayload | FlagOnly},
		RCSendOnlyImm:        {"RC_SEND_ONLY_WITH_IMMEDIATE", 16, FlagPayload | FlagOnly | FlagImm},
		RCWriteFirst:         {"RC_RDMA_WRITE_FIRST", 28, FlagPayload | FlagFirst | FlagWrite},
		RCWriteMiddle:        {"RC_RDMA_WRITE_MIDDLE", 12, FlagPayload | FlagMiddle | FlagWrite},
		RCWriteLast:          {"RC_RDMA_WRITE_LAST", 12, FlagPayload | FlagLast | FlagWrite},
		RCWriteLastImm:       {"RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, FlagPayload | FlagLast | FlagImm},
		RCWriteOnly:          {"RC_RDMA_WRITE_ONLY", 28, FlagPayload | FlagOnly | FlagWrite},
		RCWriteOnlyImm:       {"RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, FlagPayload | FlagOnly | FlagImm},
		RCReadRequest:        {"RC_RDMA_READ_REQUEST", 28, FlagRead | FlagRequest},
		RCReadResponseFirst:  {"RC_RDMA_READ_RESPONSE_FIRST", 16, FlagPayload | FlagFirst | FlagResponse},
		RCReadResponseMiddle: {"RC_RDMA_READ_RESPONSE_MIDDLE", 12, FlagPayload | FlagMiddle | FlagResponse},
		RCReadResponseLast:   {"RC_RDMA_READ_RESPONSE_LAST", 16, FlagPayload | FlagLast | FlagResponse},
		RCReadResponseOnly:   {"RC_RDMA_READ_RESPONSE_ONLY", 16, FlagPayload | FlagOnly | FlagResponse},
		RCAck:                {"RC_ACKNOWLEDGE", 16, FlagAck | FlagResponse},
		RCAtomicAck:          {"RC_ATOMIC_ACKNOWLEDGE", 24, FlagAck | FlagAtomic},
		RCCompareSwap:        {"RC_COMPARE_SWAP", 40, FlagAtomic | FlagRequest},
		RCFetchAdd:           {"RC_FETCH_ADD", 40, FlagAtomic | FlagRequest},
		RCSendLastInv:        {"RC_SEND_LAST_WITH_INVALIDATE", 16, FlagPayload | FlagLast | FlagInv},
		RCSendOnlyInv:        {"RC_SEND_ONLY_WITH_INVALIDATE", 16, FlagPayload | FlagOnly | FlagInv},
		RCFlush:              {"RC_FLUSH", 32, FlagFlush | FlagRequest},
		RCAtomicWrite:        {"RC_ATOMIC_WRITE", 28, FlagPayload | FlagAtomicWrite},
		UCSendFirst:          {"UC_SEND_FIRST", 12, FlagPayload | FlagFirst},
		UCSendMiddle:         {"UC_SEND_MIDDLE", 12, FlagPayload | FlagMiddle},
		UCSendLast:           {"UC_SEND_LAST", 12, FlagPayload | FlagLast},
		UCSendLastImm:        {"UC_SEND_LAST_WITH_IMMEDIATE", 16, FlagPayload | FlagImm},
		UCSendOnly:           {"UC_SEND_ONLY", 12, FlagPayload | FlagOnly},
		UCSendOnlyImm:        {"UC_SEND_ONLY_WITH_IMMEDIATE", 16, FlagPayload | FlagImm},
		UCWriteFirst:         {"UC_RDMA_WRITE_FIRST", 28, FlagPayload | FlagFirst},
		UCWriteMiddle:        {"UC_RDMA_WRITE_MIDDLE", 12, FlagPayload | FlagMiddle},
		UCWriteLast:          {"UC_RDMA_WRITE_LAST", 12, FlagPayload | FlagLast},
		UCWriteLastImm:       {"UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, FlagPayload | FlagImm},
		UCWriteOnly:          {"UC_RDMA_WRITE_ONLY", 28, FlagPayload | FlagOnly},
		UCWriteOnlyImm:       {"UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, FlagPayload | FlagImm},
		UDSendOnly:           {"UD_SEND_ONLY", 20, FlagPayload | FlagOnly | FlagSend},
		UDSendOnlyImm:        {"UD_SEND_ONLY_WITH_IMMEDIATE", 24, FlagPayload | FlagOnly | FlagImm},
		CNP:                  {"CNP", 28, 0},
	}
	supported := 0
	for i := 0; i < 256; i++ {
		op := Opcode(i)
		in := op.Info()
		require.NotNil(t, in)
		w, ok := want[op]
		require.Equal(t, ok, in.Supported, "%s supported", op)
		if !ok {
			// Unsupported: Parse says bad opcode, never a zero-length packet.
			var p Packet
			b := make([]byte, 64)
			b[0] = byte(op)
			require.ErrorIs(t, p.Parse(b), ErrBadOpcode, "%s", op)
			if !in.Defined {
				_, err := op.HeaderLen()
				require.ErrorIs(t, err, ErrBadOpcode)
				require.Equal(t, "OPCODE_0x", op.String()[:9])
			}
			var h Headers
			h.Opcode = op
			require.Zero(t, h.Len(0))
			_, err := h.Encode(make([]byte, 128), nil)
			require.ErrorIs(t, err, ErrBadOpcode)
			continue
		}
		supported++
		require.True(t, in.Defined)
		require.Equal(t, w.name, op.String())
		require.Equal(t, w.hdrLen, in.HdrLen, "%s", op)
		n, err := op.HeaderLen()
		require.NoError(t, err)
		require.Equal(t, w.hdrLen, n)
		require.True(t, in.Flags.Has(w.flags), "%s flags %b want %b", op, in.Flags, w.flags)
		// Exactly one of FIRST/MIDDLE/LAST/ONLY for everything but CNP.
		pos := 0
		for _, f := range []OpFlags{FlagFirst, FlagMiddle, FlagLast, FlagOnly} {
			if in.Flags.Has(f) {
				pos++
			}
		}
		if op != CNP {
			require.Equal(t, 1, pos, "%s position flags", op)
		}
		require.Equal(t, in.Headers.Has(HdrImmDt), in.Flags.Has(FlagImm), "%s", op)
		require.Equal(t, in.Headers.Has(HdrIETH), in.Flags.Has(FlagInv), "%s", op)
		// Offsets are consecutive.
		off := BTHLen
		for k, h := range in.HeaderOrder() {
			require.Equal(t, off, in.Offsets[k])
			require.Equal(t, off, in.Offset(h))
			off += h.Len()
		}
		require.Equal(t, in.HdrLen, off)
	}
	require.Equal(t, len(want), supported)

	// Wire order of multi-header opcodes.
	require.Equal(t, []HeaderSet{HdrRETH, HdrImmDt}, RCWriteOnlyImm.Info().HeaderOrder())
	require.Equal(t, []HeaderSet{HdrFETH, HdrRETH}, RCFlush.Info().HeaderOrder())
	require.Equal(t, []HeaderSet{HdrAETH, HdrAtomicAckETH}, RCAtomicAck.Info().HeaderOrder())
	require.Equal(t, []HeaderSet{HdrDETH, HdrImmDt}, UDSendOnlyImm.Info().HeaderOrder())
	require.Equal(t, -1, RCSendOnly.Info().Offset(HdrRETH))

	// Recognised-but-unsupported transports.
	require.Equal(t, TransportRD, Opcode(0x4B).Info().Transport)
	require.True(t, Opcode(0x4B).Info().Defined)
	require.Equal(t, "RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Opcode(0x4B).String())
	require.Equal(t, 12+4+8+16+4, Opcode(0x4B).Info().HdrLen)
	require.Equal(t, "RD_RESYNC", Opcode(0x55).String())
	require.Equal(t, TransportXRC, Opcode(0xA4).Info().Transport)
	require.Equal(t, "XRC_SEND_ONLY", Opcode(0xA4).String())
	require.Equal(t, TransportVendor, Opcode(0xE0).Info().Transport)
	require.False(t, Opcode(0x15).Info().Defined)
	require.False(t, Opcode(0x80).Info().Defined)
	require.Equal(t, "OPCODE_0x18", Opcode(0x18).String())
	require.Equal(t, "RC", TransportRC.String())
	require.Equal(t, "Transport(99)", Transport(99).String())
}
