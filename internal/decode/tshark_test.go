package decode

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkAgainstTshark decodes file with rxed and with tshark and fails on
// every field where they differ. It returns the comparison for logging.
func checkAgainstTshark(t *testing.T, bin, file string) fileResult {
	t.Helper()
	ours := decodeOurs(t, file)
	ts := runTshark(t, bin, file)
	r := compareFile(ours, ts)
	const maxShown = 40
	for i, d := range r.diffs {
		if i == maxShown {
			t.Errorf("... and %d more differences", len(r.diffs)-maxShown)
			break
		}
		t.Errorf("%s: %s", filepath.Base(file), d)
	}
	if r.roce == 0 {
		t.Errorf("%s: no RoCEv2 packet compared", filepath.Base(file))
	}
	t.Logf("%s: %d RoCEv2 packets, %d fields compared, %d other frames skipped by both",
		filepath.Base(file), r.roce, r.fields, r.skipped)
	return r
}

// TestTsharkAgreesOnRealCaptures is the acceptance check "every RoCE
// packet in ../shared/pcaps decodes with ICRC ok and with the fields
// tshark shows for it": for every real rdma_rxe capture, rxed and
// Wireshark agree on which frames are RoCEv2 and, for each, on addresses,
// ports, every BTH field, the header list in wire order, every field of
// RETH/AETH/AtomicETH/AtomicAckETH/DETH/ImmDt/IETH, the ICRC bytes and the
// payload (bytes and length, pad included as tshark shows it); rxed's ICRC
// verdict is ok for all.
func TestTsharkAgreesOnRealCaptures(t *testing.T) {
	shared := sharedDir(t)
	bin := tsharkBinary(t)
	t.Log(tsharkVersion(bin))
	files, err := filepath.Glob(filepath.Join(shared, "pcaps", "*.pcap"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no captures in %s (%v)", filepath.Join(shared, "pcaps"), err)
	}
	var roce, fields atomic.Int64
	// Parallel subtests overlap tshark's start-up with decoding; the group
	// returns when all have finished.
	t.Run("files", func(t *testing.T) {
		for _, file := range files {
			t.Run(strings.TrimSuffix(filepath.Base(file), ".pcap"), func(t *testing.T) {
				t.Parallel()
				r := checkAgainstTshark(t, bin, file)
				roce.Add(int64(r.roce))
				fields.Add(int64(r.fields))
			})
		}
	})
	t.Logf("%d files, %d RoCEv2 packets, %d fields compared", len(files), roce.Load(), fields.Load())
}

// TestTsharkAgreesOnConformanceValid runs the same comparison over the
// conformance corpus' valid frames (IPv4 and IPv6, every opcode, PadCnt
// 0-3, FECN/BECN, AETH syndromes, VLAN, Ethernet padding, CNP). tshark
// has no FECN/BECN fields (they are compared as BTH byte 4) and no CNP
// dissector (the CNP body and ICRC are compared with its vendor bytes).
func TestTsharkAgreesOnConformanceValid(t *testing.T) {
	shared := sharedDir(t)
	bin := tsharkBinary(t)
	r := checkAgainstTshark(t, bin, filepath.Join(shared, "conformance", "valid.pcap"))
	if r.roce != 167 {
		t.Errorf("compared %d frames of valid.pcap, want all 167", r.roce)
	}
}

// TestParseTsharkJSON checks the reader of tshark's JSON on a sample with
// its quirks: repeated keys, header order, per-header subtrees, payload in
// the data layer, the malformed marker; and that bad input is an error.
func TestParseTsharkJSON(t *testing.T) {
	const sample = `[
  {"_index": "x", "_source": {"layers": {
    "frame": {"frame.number": "7", "frame.protocols": "eth:ethertype:ip:udp:infiniband:data"},
    "ip": {"ip.src": "10.0.0.1", "ip.addr": "10.0.0.1", "ip.dst": "10.0.0.2", "ip.addr": "10.0.0.2"},
    "udp": {"udp.srcport": "49152", "udp.dstport": "4791", "udp.port": "49152", "udp.port": "4791"},
    "infiniband": {
      "infiniband.bth": "65:00:ff:ff:40:00:01:02:80:00:00:09",
      "infiniband.bth_tree": {"infiniband.bth.opcode": "101", "infiniband.reserved": "40", "infiniband.bth.destqp": "0x000102"},
      "infiniband.deth": "11:11:11:11:7f:00:00:01",
      "infiniband.deth_tree": {"infiniband.deth.q_key": "0x0000000011111111", "infiniband.reserved": "7f"},
      "infiniband.immdt": "de:ad:be:ef",
      "infiniband.immdt_tree": {"infiniband.immdt": "de:ad:be:ef"},
      "infiniband.invariant.crc": "0x01020304"
    },
    "data": {"data.data": "aa:bb:00", "data.len": "3"},
    "_ws.malformed": {"filtered": "_ws.malformed"}
  }}},
  {"_index": "x", "_source": {"layers": {
    "frame": {"frame.number": "8", "frame.protocols": "eth:ethertype:ipv6:tcp"},
    "ipv6": {"ipv6.src": "fd77::11", "ipv6.dst": "fd77::12"}
  }}}
]`
	pkts, err := parseTshark(strings.NewReader(sample))
	require.NoError(t, err)
	require.Len(t, pkts, 2)
	p := pkts[0]
	require.Equal(t, 7, p.Number)
	require.True(t, p.isRoCE())
	require.Equal(t, []string{"infiniband.bth", "infiniband.deth", "infiniband.immdt"}, p.Headers)
	require.Equal(t, "40", p.Fields["infiniband.bth"]["infiniband.reserved"])
	require.Equal(t, "7f", p.Fields["infiniband.deth"]["infiniband.reserved"])
	require.Equal(t, "0x000102", p.Fields["infiniband.bth"]["infiniband.bth.destqp"])
	require.Equal(t, "deadbeef", p.HdrHex["infiniband.immdt"])
	require.Equal(t, "aabb00", p.Payload)
	require.True(t, p.HasPayload)
	require.Equal(t, "0x01020304", p.ICRC)
	require.Equal(t, []string{"10.0.0.1", "10.0.0.2", "49152", "4791"}, []string{p.Src, p.Dst, p.SPort, p.DPort})
	require.True(t, p.Malformed)
	q := pkts[1]
	require.False(t, q.isRoCE())
	require.False(t, q.Malformed)
	require.Equal(t, "fd77::11", q.Src)

	for _, bad := range []string{
		``,
		`{}`,
		`[{"_source":`,
		`[{"_source": {"layers": {"frame": {}}}}]`,
		`[{"_source": {"layers": {"frame": {"frame.number": "x"}}}}]`,
		`[{"_source": {"layers": {"frame": {"frame.number": "1"}}}}`,
	} {
		_, err := parseTshark(strings.NewReader(bad))
		require.Error(t, err, "%q", bad)
	}
}

// TestCompareFileFrameSets checks that disagreeing on which frames are
// RoCEv2, or on the number of frames, is reported.
func TestCompareFileFrameSets(t *testing.T) {
	roce := tsPacket{Number: 1, Protocols: "eth:ethertype:ip:udp:infiniband"}
	tcp := tsPacket{Number: 1, Protocols: "eth:ethertype:ip:tcp"}
	for name, tc := range map[string]struct {
		ours []ourPacket
		ts   []tsPacket
	}{
		"rxed skips RoCE":       {[]ourPacket{{Frame: 1, Skipped: true}}, []tsPacket{roce}},
		"rxed decodes non-RoCE": {[]ourPacket{{Frame: 1}}, []tsPacket{tcp}},
		"frame count":           {[]ourPacket{{Frame: 1, Skipped: true}}, nil},
		"frame numbers":         {[]ourPacket{{Frame: 2, Skipped: true}}, []tsPacket{tcp}},
		"no rxed keys":          {[]ourPacket{{Frame: 1}}, []tsPacket{roce}},
	} {
		r := compareFile(tc.ours, tc.ts)
		require.NotEmpty(t, r.diffs, name)
	}
	r := compareFile([]ourPacket{{Frame: 1, Skipped: true}}, []tsPacket{tcp})
	require.Empty(t, r.diffs)
	require.Equal(t, 1, r.skipped)
}

// TestTsharkMissingPolicy: without tshark the oracle tests fail under CI
// and skip elsewhere, saying how to install it.
func TestTsharkMissingPolicy(t *testing.T) {
	fatal, msg := tsharkMissing(errors.New("not in $PATH"), true)
	require.True(t, fatal)
	require.Contains(t, msg, "scripts/ci-deps.sh")
	fatal, msg = tsharkMissing(errors.New("not in $PATH"), false)
	require.False(t, fatal)
	require.Contains(t, msg, "skipping")
}

// TestTsharkComparisonCatchesEveryField proves the comparison can fail:
// on valid.pcap (every header type), changing any single field of rxed's
// output makes comparePacket report a difference with tshark, and every
// change applies to at least one packet.
func TestTsharkComparisonCatchesEveryField(t *testing.T) {
	shared := sharedDir(t)
	bin := tsharkBinary(t)
	file := filepath.Join(shared, "conformance", "valid.pcap")
	ours := decodeOurs(t, file)
	ts := runTshark(t, bin, file)
	require.Equal(t, len(ours), len(ts))

	type mutator struct {
		name string
		fn   func(p *ourPacket) bool // false: does not apply to p
	}
	always := func(f func(p *ourPacket)) func(p *ourPacket) bool {
		return func(p *ourPacket) bool { f(p); return true }
	}
	mutators := []mutator{
		{"src", func(p *ourPacket) bool { p.Src, p.Dst = p.Dst, p.Src; return p.Src != p.Dst }},
		{"sport", always(func(p *ourPacket) { p.SPort++ })},
		{"dport", always(func(p *ourPacket) { p.DPort++ })},
		{"verdict icrc", always(func(p *ourPacket) { p.ICRC = "bad" })},
		{"verdict error", always(func(p *ourPacket) { p.Error = ptr("bad_icrc") })},
		{"opcode", always(func(p *ourPacket) { *p.Opcode ^= 1 })},
		{"dqpn", always(func(p *ourPacket) { *p.DQPN ^= 1 })},
		{"psn", always(func(p *ourPacket) { *p.PSN ^= 1 })},
		{"padcount", always(func(p *ourPacket) { *p.PadCount ^= 1 })},
		{"bth.opcode", always(func(p *ourPacket) { p.BTH.Opcode ^= 1 })},
		{"bth.solicited", always(func(p *ourPacket) { p.BTH.Solicited ^= 1 })},
		{"bth.migreq", always(func(p *ourPacket) { p.BTH.MigReq ^= 1 })},
		{"bth.padcount", always(func(p *ourPacket) { p.BTH.PadCount ^= 1 })},
		{"bth.version", always(func(p *ourPacket) { p.BTH.Version ^= 1 })},
		{"bth.pkey", always(func(p *ourPacket) { p.BTH.PKey ^= 1 })},
		{"bth.fecn", always(func(p *ourPacket) { p.BTH.FECN ^= 1 })},
		{"bth.becn", always(func(p *ourPacket) { p.BTH.BECN ^= 1 })},
		{"bth.resv6", always(func(p *ourPacket) { p.BTH.Resv6 ^= 1 })},
		{"bth.dqpn", always(func(p *ourPacket) { p.BTH.DQPN ^= 1 })},
		{"bth.ackreq", always(func(p *ourPacket) { p.BTH.AckReq ^= 1 })},
		{"bth.resv7", always(func(p *ourPacket) { p.BTH.Resv7 ^= 1 })},
		{"bth.psn", always(func(p *ourPacket) { p.BTH.PSN ^= 1 })},
		{"headers", always(func(p *ourPacket) { p.Headers = p.Headers[:len(p.Headers)-1] })},
		{"reth.va", func(p *ourPacket) bool { return p.RETH != nil && flip64(&p.RETH.VA) }},
		{"reth.rkey", func(p *ourPacket) bool { return p.RETH != nil && flip32(&p.RETH.RKey) }},
		{"reth.dmalen", func(p *ourPacket) bool { return p.RETH != nil && flip32(&p.RETH.DMALen) }},
		{"aeth.syndrome", func(p *ourPacket) bool { return p.AETH != nil && flip8(&p.AETH.Syndrome) }},
		{"aeth.msn", func(p *ourPacket) bool { return p.AETH != nil && flip32(&p.AETH.MSN) }},
		{"aeth.syndrome_kind", func(p *ourPacket) bool {
			if p.AETH == nil {
				return false
			}
			p.AETH.SyndromeKind = map[string]string{"ACK": "NAK"}[p.AETH.SyndromeKind]
			return true
		}},
		{"aeth.syndrome_value", func(p *ourPacket) bool { return p.AETH != nil && flip8(&p.AETH.SyndromeValue) }},
		{"atomiceth.va", func(p *ourPacket) bool { return p.AtomicETH != nil && flip64(&p.AtomicETH.VA) }},
		{"atomiceth.rkey", func(p *ourPacket) bool { return p.AtomicETH != nil && flip32(&p.AtomicETH.RKey) }},
		{"atomiceth.swap_add", func(p *ourPacket) bool { return p.AtomicETH != nil && flip64(&p.AtomicETH.SwapAdd) }},
		{"atomiceth.compare", func(p *ourPacket) bool { return p.AtomicETH != nil && flip64(&p.AtomicETH.Compare) }},
		{"atomicacketh", func(p *ourPacket) bool { return p.AtomicAckETH != nil && flip64(&p.AtomicAckETH.OrigRemData) }},
		{"deth.qkey", func(p *ourPacket) bool { return p.DETH != nil && flip32(&p.DETH.QKey) }},
		{"deth.reserved", func(p *ourPacket) bool { return p.DETH != nil && flip8(&p.DETH.Reserved) }},
		{"deth.srcqp", func(p *ourPacket) bool { return p.DETH != nil && flip32(&p.DETH.SrcQP) }},
		{"immdt.data", func(p *ourPacket) bool { return p.ImmDt != nil && flip32(&p.ImmDt.Data) }},
		{"immdt.hex", func(p *ourPacket) bool {
			if p.ImmDt == nil {
				return false
			}
			p.ImmDt.Hex = flipHex(p.ImmDt.Hex)
			return true
		}},
		{"ieth.rkey", func(p *ourPacket) bool { return p.IETH != nil && flip32(&p.IETH.RKey) }},
		{"cnp.reserved1", func(p *ourPacket) bool { return p.CNP != nil && flip64(&p.CNP.Reserved1) }},
		{"cnp.reserved2", func(p *ourPacket) bool { return p.CNP != nil && flip64(&p.CNP.Reserved2) }},
		{"payload_len", always(func(p *ourPacket) { *p.PayloadLen++ })},
		{"payload_hex", func(p *ourPacket) bool {
			if *p.PayloadHex == "" {
				return false
			}
			*p.PayloadHex = flipHex(*p.PayloadHex)
			return true
		}},
		{"icrc_le_u32", always(func(p *ourPacket) { *p.ICRCValue ^= 1 })},
	}
	applied := map[string]int{}
	for i := range ours {
		require.Empty(t, comparePacket(&ours[i], &ts[i]).diffs, "frame %d unmutated", ours[i].Frame)
		for _, m := range mutators {
			p := cloneOurs(t, &ours[i])
			if !m.fn(&p) {
				continue
			}
			applied[m.name]++
			require.NotEmpty(t, comparePacket(&p, &ts[i]).diffs, "frame %d: changing %s went unnoticed", ours[i].Frame, m.name)
		}
	}
	for _, m := range mutators {
		require.NotZero(t, applied[m.name], "mutation %s applied to no packet of valid.pcap", m.name)
	}
}

func flip8(v *uint8) bool   { *v ^= 1; return true }
func flip32(v *uint32) bool { *v ^= 1; return true }
func flip64(v *uint64) bool { *v ^= 1 << 63; return true }

// flipHex changes the first hex digit of s.
func flipHex(s string) string {
	if s[0] == '0' {
		return "1" + s[1:]
	}
	return "0" + s[1:]
}

// cloneOurs deep-copies p through its JSON form.
func cloneOurs(t *testing.T, p *ourPacket) ourPacket {
	b, err := json.Marshal(p)
	require.NoError(t, err)
	var q ourPacket
	require.NoError(t, json.Unmarshal(b, &q))
	return q
}
