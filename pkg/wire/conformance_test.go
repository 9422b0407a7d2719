package wire_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// readJSONL reads one JSON object per line, keeping numbers exact (64-bit
// values exceed float64).
func readJSONL(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		var m map[string]any
		require.NoError(t, dec.Decode(&m))
		out = append(out, m)
	}
	require.NoError(t, sc.Err())
	return out
}

// num reads a JSON number field as uint64.
func num(t *testing.T, m map[string]any, key string) uint64 {
	t.Helper()
	v, ok := m[key]
	require.True(t, ok, "key %q missing", key)
	n, err := strconv.ParseUint(v.(json.Number).String(), 10, 64)
	require.NoError(t, err)
	return n
}

func obj(t *testing.T, m map[string]any, key string) map[string]any {
	t.Helper()
	v, ok := m[key].(map[string]any)
	require.True(t, ok, "object %q missing", key)
	return v
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// TestConformanceValid checks every frame of the Scapy/Wireshark-checked
// corpus field by field, then rebuilds the RoCE payload from the parsed
// fields with Headers.Encode and the ICRC and compares it byte for byte.
func TestConformanceValid(t *testing.T) {
	dir := filepath.Join(sharedDir(t), "conformance")
	want := readJSONL(t, filepath.Join(dir, "valid.jsonl"))
	frames, err := wirepcap.ReadFile(filepath.Join(dir, "valid.pcap"))
	require.NoError(t, err)
	require.Len(t, frames, len(want))
	var rf wirepcap.RoCEFrame
	exact := 0
	for i, fr := range frames {
		w := want[i]
		name := w["name"].(string)
		require.NoError(t, wirepcap.DecodeRoCE(fr.LinkType, fr.Data, &rf), name)
		require.NoError(t, rf.ParseErr, name)
		require.Equal(t, wire.ICRCOK, rf.ICRC, name)
		p := &rf.Packet
		// Knowing only addresses and ports, Flow.Verify must still accept
		// the packet and find the frame's IPv4 ID (whatever its DF bit).
		v, id := wire.Flow{Src: rf.Src, Dst: rf.Dst}.Verify(p.Raw)
		require.Equal(t, wire.ICRCOK, v, name)
		if rf.IPv4 {
			require.Equal(t, binary.BigEndian.Uint16(rf.IP[4:]), id, name)
		}

		off := obj(t, w, "offsets")
		require.Equal(t, num(t, off, "l3"), uint64(rf.L3Offset), name)
		require.Equal(t, num(t, off, "bth"), uint64(rf.PayloadOffset), name)
		require.Equal(t, num(t, off, "payload"), uint64(rf.PayloadOffset+p.Info.HdrLen), name)
		require.Equal(t, num(t, off, "icrc"), uint64(rf.PayloadOffset+len(p.Raw)-wire.ICRCLen), name)
		require.Equal(t, num(t, off, "ip_end"), uint64(rf.PayloadOffset+len(p.Raw)), name)
		udp := obj(t, w, "udp")
		require.Equal(t, num(t, udp, "sport"), uint64(rf.Src.Port()), name)
		require.Equal(t, num(t, udp, "dport"), uint64(rf.Dst.Port()), name)

		require.Equal(t, w["opcode_name"], p.Opcode.String(), name)
		require.Equal(t, w["transport"], p.Info.Transport.String(), name)
		bth := obj(t, w, "bth")
		b := p.BTH
		for k, v := range map[string]uint64{
			"opcode": uint64(b.Opcode()), "solicited": b2u(b.SE()), "migreq": b2u(b.M()),
			"padcount": uint64(b.PadCount()), "version": uint64(b.TVer()), "pkey": uint64(b.PKey()),
			"fecn": b2u(b.FECN()), "becn": b2u(b.BECN()), "resv6": uint64(b.Resv6()),
			"dqpn": uint64(b.DestQP()), "ackreq": b2u(b.AckReq()), "resv7": uint64(b.Resv7()),
			"psn": uint64(b.PSN()),
		} {
			require.Equal(t, num(t, bth, k), v, "%s bth.%s", name, k)
		}
		var hdrs []any
		hdrs = append(hdrs, "BTH")
		for _, h := range p.Info.HeaderOrder() {
			hdrs = append(hdrs, h.Name())
		}
		require.Equal(t, w["headers"], hdrs, name)
		check := func(key string, got map[string]uint64) {
			o := obj(t, w, key)
			for k, v := range got {
				require.Equal(t, num(t, o, k), v, "%s %s.%s", name, key, k)
			}
		}
		present := map[string]bool{}
		if p.RETH != nil {
			present["reth"] = true
			check("reth", map[string]uint64{"va": p.RETH.VA(), "rkey": uint64(p.RETH.RKey()), "dmalen": uint64(p.RETH.DMALen())})
		}
		if p.DETH != nil {
			present["deth"] = true
			check("deth", map[string]uint64{"qkey": uint64(p.DETH.QKey()), "reserved": uint64(p.DETH.Reserved()), "srcqp": uint64(p.DETH.SrcQP())})
		}
		if p.AtomicETH != nil {
			present["atomiceth"] = true
			a := p.AtomicETH
			check("atomiceth", map[string]uint64{"va": a.VA(), "rkey": uint64(a.RKey()), "swap_add": a.SwapAdd(), "compare": a.Compare()})
		}
		if p.AETH != nil {
			present["aeth"] = true
			s := p.AETH.Syndrome()
			check("aeth", map[string]uint64{"syndrome": uint64(s), "msn": uint64(p.AETH.MSN()), "syndrome_value": uint64(s.Value())})
			o := obj(t, w, "aeth")
			require.Equal(t, o["syndrome_kind"], s.Kind().String(), name)
			if s.Kind() == wire.SynNAK {
				require.Equal(t, o["nak_code"], wire.NAKCodeName(s.NAKCode()), name)
			}
		}
		if p.AtomicAckETH != nil {
			present["atomicacketh"] = true
			check("atomicacketh", map[string]uint64{"orig_rem_data": p.AtomicAckETH.OrigData()})
		}
		if p.ImmDt != nil {
			present["immdt"] = true
			check("immdt", map[string]uint64{"data": uint64(p.ImmDt.Imm())})
			require.Equal(t, obj(t, w, "immdt")["hex"], hex.EncodeToString(p.ImmDt), name)
		}
		if p.IETH != nil {
			present["ieth"] = true
			check("ieth", map[string]uint64{"rkey": uint64(p.IETH.RKey())})
		}
		if p.CNP != nil {
			present["cnp"] = true
			check("cnp", map[string]uint64{"reserved1": p.CNP.Reserved1(), "reserved2": p.CNP.Reserved2()})
		}
		for _, k := range []string{"reth", "deth", "atomiceth", "aeth", "atomicacketh", "immdt", "ieth", "cnp"} {
			_, inWant := w[k]
			require.Equal(t, inWant, present[k], "%s: header %s presence", name, k)
		}
		require.Equal(t, num(t, w, "payload_len"), uint64(len(p.Payload)), name)
		require.Equal(t, w["payload_hex"], hex.EncodeToString(p.Payload), name)
		require.Equal(t, w["pad_hex"], hex.EncodeToString(p.Pad), name)
		require.Equal(t, num(t, w, "icrc_le_u32"), uint64(p.ICRC), name)
		require.Equal(t, w["icrc_hex"], hex.EncodeToString(p.Raw[len(p.Raw)-4:]), name)

		// Re-serialise from the parsed fields.
		var h wire.Headers
		h.FromPacket(p)
		require.Equal(t, len(p.Raw), h.Len(len(p.Payload)), name)
		buf := make([]byte, len(p.Raw)+7)
		n, err := h.Encode(buf, p.Payload)
		require.NoError(t, err, name)
		out := buf[:n]
		binary.LittleEndian.PutUint32(out[n-4:], wire.ICRC(rf.IP, rf.UDP, out[:n-4]))
		require.Equal(t, hex.EncodeToString(p.Raw), hex.EncodeToString(out), "%s: re-serialised bytes", name)
		exact++
	}
	t.Logf("valid.pcap: %d/%d frames decode exactly and re-serialise byte for byte", exact, len(want))
}

// TestConformanceInvalid checks the verdict of every defective frame. The
// decoder is strict, so the frames marked "strict" get their verdict too.
func TestConformanceInvalid(t *testing.T) {
	dir := filepath.Join(sharedDir(t), "conformance")
	want := readJSONL(t, filepath.Join(dir, "invalid.jsonl"))
	frames, err := wirepcap.ReadFile(filepath.Join(dir, "invalid.pcap"))
	require.NoError(t, err)
	require.Len(t, frames, len(want))
	var rf wirepcap.RoCEFrame
	ok := 0
	for i, fr := range frames {
		w := want[i]
		require.NoError(t, wirepcap.DecodeRoCE(fr.LinkType, fr.Data, &rf), w["name"])
		require.Equal(t, w["verdict"], wirepcap.ErrorCode(rf.ParseErr), "%v: %v", w["name"], w["reason"])
		ok++
	}
	t.Logf("invalid.pcap: %d/%d verdicts as expected", ok, len(want))
}
