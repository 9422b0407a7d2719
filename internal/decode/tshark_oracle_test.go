package decode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// This file runs Wireshark's dissector (tshark) as an independent oracle
// and compares its view of every RoCEv2 packet with `rxed decode -json -v`.

// tsharkHeuristics are the payload heuristics that mark short RoCE payloads
// "Malformed" under tshark's defaults (see ../shared/conformance/README.md).
var tsharkHeuristics = []string{
	"drbd_rdma", "fc_infiniband", "mellanox_eoib", "eth_over_ib", "sdp_infiniband",
	"iser_infiniband", "lnet_ib", "nvme_rdma", "rpcrdma_infiniband",
	"smb_direct_infiniband", "smcr_infiniband",
}

// tsharkBinary returns tshark's path. Without tshark the oracle tests
// cannot run: a failure in CI (which installs it with scripts/ci-deps.sh),
// a skip elsewhere.
func tsharkBinary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("tshark")
	if err == nil {
		return path
	}
	fatal, msg := tsharkMissing(err, os.Getenv("CI") == "true")
	if fatal {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// tsharkMissing says what to do when tshark cannot be found: fail under
// CI, skip elsewhere, with a message saying how to install it.
func tsharkMissing(err error, ci bool) (fatal bool, msg string) {
	msg = fmt.Sprintf("tshark not found (%v): the Wireshark cross-check of every captured RoCEv2 packet cannot run; "+
		"install it with scripts/ci-deps.sh (as root) or `apt-get install tshark`", err)
	if ci {
		return true, msg
	}
	return false, msg + " (skipping; CI=true makes this fatal)"
}

// tsharkArgs is the command line dissecting file into the JSON tsPackets
// parses: only the layers compared, with the payload heuristics off so
// payloads stay plain data.
func tsharkArgs(file string) []string {
	args := []string{"-n", "-r", file, "--disable-protocol", "rpcordma"}
	for _, h := range tsharkHeuristics {
		args = append(args, "--disable-heuristic", h)
	}
	return append(args, "-T", "json", "-J", "frame ip ipv6 udp infiniband data _ws")
}

// runTshark dissects file with tshark and returns one tsPacket per frame.
func runTshark(t testing.TB, bin, file string) []tsPacket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, tsharkArgs(file)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tshark %s: %v\n%s", file, err, stderr.String())
	}
	pkts, err := parseTshark(&stdout)
	if err != nil {
		t.Fatalf("tshark %s: unreadable JSON: %v", file, err)
	}
	return pkts
}

// tsPacket is tshark's dissection of one frame.
type tsPacket struct {
	Number    int
	Protocols string // frame.protocols, e.g. "eth:ethertype:ip:udp:infiniband:data"
	Src, Dst  string // ip.src/ip.dst or ipv6.src/ipv6.dst
	SPort     string
	DPort     string
	// Headers are tshark's InfiniBand headers in wire order, by field name
	// ("infiniband.bth", "infiniband.reth", ...).
	Headers []string
	// HdrHex holds each header's bytes (hex, no separators).
	HdrHex map[string]string
	// Fields holds, per header, the first value of every field in its
	// subtree, e.g. Fields["infiniband.bth"]["infiniband.bth.psn"].
	Fields map[string]map[string]string
	// Payload is what tshark shows after the headers (hex): its payload,
	// data or MAD bytes. tshark does not apply PadCnt, so pad bytes are
	// included.
	Payload    string
	HasPayload bool
	ICRC       string // infiniband.invariant.crc, e.g. "0x43c483d1"
	Malformed  bool
}

// isRoCE reports whether tshark dissected the frame as InfiniBand.
func (p *tsPacket) isRoCE() bool {
	for _, proto := range strings.Split(p.Protocols, ":") {
		if proto == "infiniband" {
			return true
		}
	}
	return false
}

// tsHeaderNames maps tshark's header fields to the names rxed decode uses.
var tsHeaderNames = map[string]string{
	"infiniband.bth":          "BTH",
	"infiniband.rdeth":        "RDETH",
	"infiniband.deth":         "DETH",
	"infiniband.reth":         "RETH",
	"infiniband.atomiceth":    "AtomicETH",
	"infiniband.aeth":         "AETH",
	"infiniband.atomicacketh": "AtomicAckETH",
	"infiniband.immdt":        "ImmDt",
	"infiniband.ieth":         "IETH",
	// tshark 4.0 has no CNP: it shows the bytes after the BTH of an
	// unknown opcode as vendor data.
	"infiniband.vendor": "vendor",
}

// parseTshark reads `tshark -T json` output. It walks the token stream
// instead of unmarshalling into maps because tshark's JSON repeats keys
// (ip.addr, infiniband.reserved) and the header order is the key order.
func parseTshark(r io.Reader) ([]tsPacket, error) {
	dec := json.NewDecoder(bufio.NewReader(r))
	dec.UseNumber()
	if err := expectDelim(dec, '['); err != nil {
		return nil, err
	}
	var pkts []tsPacket
	for dec.More() {
		p := tsPacket{HdrHex: map[string]string{}, Fields: map[string]map[string]string{}}
		if err := walkJSON(dec, nil, p.visit); err != nil {
			return nil, fmt.Errorf("packet %d: %w", len(pkts)+1, err)
		}
		if p.Number == 0 {
			return nil, fmt.Errorf("packet %d has no frame.number", len(pkts)+1)
		}
		pkts = append(pkts, p)
	}
	return pkts, expectDelim(dec, ']')
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("want %q, got %v", want, tok)
	}
	return nil
}

// walkJSON reads one value and calls visit(path, value) for every scalar
// in it, in document order; path is the chain of object keys above it.
func walkJSON(dec *json.Decoder, path []string, visit func(path []string, v string) error) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key, ok := k.(string)
				if !ok {
					return fmt.Errorf("object key %v", k)
				}
				if err := walkJSON(dec, append(path[:len(path):len(path)], key), visit); err != nil {
					return err
				}
			}
			return expectDelim(dec, '}')
		case '[':
			for dec.More() {
				if err := walkJSON(dec, path, visit); err != nil {
					return err
				}
			}
			return expectDelim(dec, ']')
		}
		return fmt.Errorf("unexpected %v", v)
	case string:
		return visit(path, v)
	case json.Number:
		return visit(path, v.String())
	case nil:
		return visit(path, "")
	default:
		return visit(path, fmt.Sprint(v))
	}
}

// visit files one scalar of tshark's JSON ({"_source":{"layers":{LAYER:
// {...}}}}) into p.
func (p *tsPacket) visit(path []string, v string) error {
	if len(path) < 3 || path[0] != "_source" || path[1] != "layers" {
		return nil
	}
	layer, rest := path[2], path[3:]
	if strings.HasPrefix(layer, "_ws.malformed") {
		p.Malformed = true
	}
	if len(rest) == 0 {
		return nil
	}
	key := rest[len(rest)-1]
	switch layer {
	case "frame":
		switch key {
		case "frame.number":
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("frame.number %q", v)
			}
			p.Number = n
		case "frame.protocols":
			p.Protocols = v
		}
	case "ip", "ipv6":
		if len(rest) == 1 {
			switch key {
			case layer + ".src":
				p.Src = v
			case layer + ".dst":
				p.Dst = v
			}
		}
	case "udp":
		switch key {
		case "udp.srcport":
			p.SPort = v
		case "udp.dstport":
			p.DPort = v
		}
	case "data":
		if key == "data.data" && !p.HasPayload {
			p.Payload, p.HasPayload = stripColons(v), true
		}
	case "infiniband":
		if len(rest) == 1 {
			switch {
			case key == "infiniband.invariant.crc":
				p.ICRC = v
			case key == "infiniband.payload" || key == "infiniband.mad":
				if !p.HasPayload {
					p.Payload, p.HasPayload = stripColons(v), true
				}
			case tsHeaderNames[key] != "":
				p.Headers = append(p.Headers, key)
				p.HdrHex[key] = stripColons(v)
			}
			return nil
		}
		hdr, ok := strings.CutSuffix(rest[0], "_tree")
		if !ok || tsHeaderNames[hdr] == "" {
			return nil
		}
		f := p.Fields[hdr]
		if f == nil {
			f = map[string]string{}
			p.Fields[hdr] = f
		}
		if _, dup := f[key]; !dup {
			f[key] = v
		}
	}
	return nil
}

func stripColons(s string) string { return strings.ReplaceAll(s, ":", "") }

// ourPacket is one line of `rxed decode -json -v`, by the documented keys.
type ourPacket struct {
	Frame   int    `json:"frame"`
	Skipped bool   `json:"skipped"`
	Reason  string `json:"reason"`

	Src   string `json:"src"`
	Dst   string `json:"dst"`
	SPort uint16 `json:"sport"`
	DPort uint16 `json:"dport"`

	Opcode     *uint8   `json:"opcode"`
	OpcodeName *string  `json:"opcode_name"`
	DQPN       *uint32  `json:"dqpn"`
	PSN        *uint32  `json:"psn"`
	Headers    []string `json:"headers"`
	BTH        *struct {
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
	} `json:"bth"`
	RETH *struct {
		VA     uint64 `json:"va"`
		RKey   uint32 `json:"rkey"`
		DMALen uint32 `json:"dmalen"`
	} `json:"reth"`
	AETH *struct {
		Syndrome      uint8  `json:"syndrome"`
		MSN           uint32 `json:"msn"`
		SyndromeKind  string `json:"syndrome_kind"`
		SyndromeValue uint8  `json:"syndrome_value"`
	} `json:"aeth"`
	AtomicETH *struct {
		VA      uint64 `json:"va"`
		RKey    uint32 `json:"rkey"`
		SwapAdd uint64 `json:"swap_add"`
		Compare uint64 `json:"compare"`
	} `json:"atomiceth"`
	AtomicAckETH *struct {
		OrigRemData uint64 `json:"orig_rem_data"`
	} `json:"atomicacketh"`
	DETH *struct {
		QKey     uint32 `json:"qkey"`
		Reserved uint8  `json:"reserved"`
		SrcQP    uint32 `json:"srcqp"`
	} `json:"deth"`
	ImmDt *struct {
		Data uint32 `json:"data"`
		Hex  string `json:"hex"`
	} `json:"immdt"`
	IETH *struct {
		RKey uint32 `json:"rkey"`
	} `json:"ieth"`
	CNP *struct {
		Reserved1 uint64 `json:"reserved1"`
		Reserved2 uint64 `json:"reserved2"`
	} `json:"cnp"`

	PayloadLen *int    `json:"payload_len"`
	PayloadHex *string `json:"payload_hex"`
	PadCount   *int    `json:"padcount"`
	ICRCValue  *uint32 `json:"icrc_le_u32"`
	ICRC       string  `json:"icrc"`
	Error      *string `json:"error"`
}

// decodeOurs runs `rxed decode -json -v` on file and parses its lines.
func decodeOurs(t testing.TB, file string) []ourPacket {
	t.Helper()
	var out bytes.Buffer
	if _, err := DecodeFile(file, Options{JSON: true, Verbose: true}, &out); err != nil {
		t.Fatalf("decode %s: %v", file, err)
	}
	var pkts []ourPacket
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var p ourPacket
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("decode %s: line %d: %v\n%s", file, len(pkts)+1, err, sc.Text())
		}
		pkts = append(pkts, p)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return pkts
}

// comparison collects field comparisons between rxed and tshark for one
// packet.
type comparison struct {
	n     int      // fields compared
	diffs []string // "field: rxed X, tshark Y"
}

func (c *comparison) failf(format string, args ...any) {
	c.diffs = append(c.diffs, fmt.Sprintf(format, args...))
}

// num compares a number of ours with a tshark field shown in decimal or
// 0x-hex.
func (c *comparison) num(name string, ours uint64, fields map[string]string, field string) {
	c.n++
	s, ok := fields[field]
	if !ok {
		c.failf("%s: rxed %d, tshark has no %s", name, ours, field)
		return
	}
	v, err := parseTsharkUint(s)
	if err != nil {
		c.failf("%s: tshark %s=%q: %v", name, field, s, err)
		return
	}
	if v != ours {
		c.failf("%s: rxed %d (%#x), tshark %s=%s", name, ours, ours, field, s)
	}
}

// bytesHex compares a hex string of ours with tshark's bytes.
func (c *comparison) bytesHex(name, ours, tshark string) {
	c.n++
	if !strings.EqualFold(ours, tshark) {
		c.failf("%s: rxed %s, tshark %s", name, ours, tshark)
	}
}

func (c *comparison) str(name, ours, tshark string) {
	c.n++
	if ours != tshark {
		c.failf("%s: rxed %q, tshark %q", name, ours, tshark)
	}
}

func parseTsharkUint(s string) (uint64, error) {
	if h, ok := strings.CutPrefix(s, "0x"); ok {
		return strconv.ParseUint(h, 16, 64)
	}
	return strconv.ParseUint(s, 10, 64)
}

func b2u(v int) uint64 { return uint64(v) }

// tsAETHKind maps tshark's syndrome opcode (bits 6-5) to our syndrome_kind.
var tsAETHKind = map[string]string{"0": "ACK", "1": "RNR_NAK", "3": "NAK", "2": "RESERVED"}

// comparePacket compares everything tshark shows of a RoCEv2 packet with
// rxed's decoding of it. rxed's ICRC verdict must be ok.
func comparePacket(ours *ourPacket, ts *tsPacket) *comparison {
	c := &comparison{}
	// Addressing.
	c.str("src", canonAddr(ours.Src), canonAddr(ts.Src))
	c.str("dst", canonAddr(ours.Dst), canonAddr(ts.Dst))
	c.str("sport", strconv.Itoa(int(ours.SPort)), ts.SPort)
	c.str("dport", strconv.Itoa(int(ours.DPort)), ts.DPort)
	if ts.Malformed {
		c.failf("tshark marks the packet malformed")
	}
	c.n++
	if ours.Error == nil || *ours.Error != "" || ours.ICRC != "ok" {
		errStr := "<null>"
		if ours.Error != nil {
			errStr = *ours.Error
		}
		c.failf("verdict: rxed icrc %q error %q, want icrc ok and no error", ours.ICRC, errStr)
	}
	b := ours.BTH
	if b == nil || ours.Opcode == nil || ours.DQPN == nil || ours.PSN == nil || ours.PayloadLen == nil ||
		ours.PadCount == nil || ours.PayloadHex == nil || ours.ICRCValue == nil {
		c.failf("rxed output lacks the BTH, payload or ICRC keys")
		return c
	}
	// BTH: tshark has no FECN/BECN fields but shows byte 4 whole as
	// infiniband.reserved.
	bf := ts.Fields["infiniband.bth"]
	c.num("bth.opcode", uint64(b.Opcode), bf, "infiniband.bth.opcode")
	c.num("opcode", uint64(*ours.Opcode), bf, "infiniband.bth.opcode")
	c.num("bth.solicited", b2u(b.Solicited), bf, "infiniband.bth.se")
	c.num("bth.migreq", b2u(b.MigReq), bf, "infiniband.bth.m")
	c.num("bth.padcount", b2u(b.PadCount), bf, "infiniband.bth.padcnt")
	c.num("padcount", b2u(*ours.PadCount), bf, "infiniband.bth.padcnt")
	c.num("bth.version", uint64(b.Version), bf, "infiniband.bth.tver")
	c.num("bth.pkey", uint64(b.PKey), bf, "infiniband.bth.p_key")
	byte4 := fmt.Sprintf("%02x", b.FECN<<7|b.BECN<<6|int(b.Resv6))
	c.bytesHex("bth.fecn/becn/resv6", byte4, bf["infiniband.reserved"])
	c.num("bth.dqpn", uint64(b.DQPN), bf, "infiniband.bth.destqp")
	c.num("dqpn", uint64(*ours.DQPN), bf, "infiniband.bth.destqp")
	c.num("bth.ackreq", b2u(b.AckReq), bf, "infiniband.bth.a")
	c.num("bth.resv7", uint64(b.Resv7), bf, "infiniband.bth.reserved7")
	c.num("bth.psn", uint64(b.PSN), bf, "infiniband.bth.psn")
	c.num("psn", uint64(*ours.PSN), bf, "infiniband.bth.psn")

	// Header list, in wire order.
	var tsNames []string
	for _, h := range ts.Headers {
		name := tsHeaderNames[h]
		if name == "vendor" && b.Opcode == 0x81 {
			name = "CNP"
		}
		tsNames = append(tsNames, name)
	}
	c.str("headers", strings.Join(ours.Headers, ","), strings.Join(tsNames, ","))

	if h := ours.RETH; h != nil {
		f := ts.Fields["infiniband.reth"]
		c.num("reth.va", h.VA, f, "infiniband.reth.va")
		c.num("reth.rkey", uint64(h.RKey), f, "infiniband.reth.r_key")
		c.num("reth.dmalen", uint64(h.DMALen), f, "infiniband.reth.dmalen")
	}
	if h := ours.AETH; h != nil {
		f := ts.Fields["infiniband.aeth"]
		c.num("aeth.syndrome", uint64(h.Syndrome), f, "infiniband.aeth.syndrome")
		c.num("aeth.msn", uint64(h.MSN), f, "infiniband.aeth.msn")
		c.str("aeth.syndrome_kind", h.SyndromeKind, tsAETHKind[f["infiniband.aeth.syndrome.opcode"]])
		valueField := map[string]string{
			"ACK":     "infiniband.aeth.syndrome.credit_count",
			"RNR_NAK": "infiniband.aeth.syndrome.timer",
			"NAK":     "infiniband.aeth.syndrome.error_code",
		}[h.SyndromeKind]
		if valueField != "" {
			c.num("aeth.syndrome_value", uint64(h.SyndromeValue), f, valueField)
		}
	}
	if h := ours.AtomicETH; h != nil {
		// tshark reuses the RETH's VA and R_Key fields in the AtomicETH.
		f := ts.Fields["infiniband.atomiceth"]
		c.num("atomiceth.va", h.VA, f, "infiniband.reth.va")
		c.num("atomiceth.rkey", uint64(h.RKey), f, "infiniband.reth.r_key")
		c.num("atomiceth.swap_add", h.SwapAdd, f, "infiniband.atomiceth.swapdt")
		c.num("atomiceth.compare", h.Compare, f, "infiniband.atomiceth.cmpdt")
	}
	if h := ours.AtomicAckETH; h != nil {
		c.num("atomicacketh.orig_rem_data", h.OrigRemData, ts.Fields["infiniband.atomicacketh"], "infiniband.atomicacketh.origremdt")
	}
	if h := ours.DETH; h != nil {
		f := ts.Fields["infiniband.deth"]
		c.num("deth.qkey", uint64(h.QKey), f, "infiniband.deth.q_key")
		c.bytesHex("deth.reserved", fmt.Sprintf("%02x", h.Reserved), f["infiniband.reserved"])
		c.num("deth.srcqp", uint64(h.SrcQP), f, "infiniband.deth.srcqp")
	}
	if h := ours.ImmDt; h != nil {
		c.bytesHex("immdt.hex", h.Hex, ts.HdrHex["infiniband.immdt"])
		c.bytesHex("immdt.data", fmt.Sprintf("%08x", h.Data), ts.HdrHex["infiniband.immdt"])
	}
	if h := ours.IETH; h != nil {
		c.bytesHex("ieth.rkey", fmt.Sprintf("%08x", h.RKey), ts.HdrHex["infiniband.ieth"])
	}

	// ICRC: tshark shows the wire bytes big-endian, rxed the value read
	// little-endian. A CNP, unknown to tshark 4.0, ends in vendor data:
	// the 16-byte body, then the ICRC.
	icrcWire := fmt.Sprintf("0x%08x", bits.ReverseBytes32(*ours.ICRCValue))
	if h := ours.CNP; h != nil {
		vendor := ts.Fields["infiniband.vendor"]["infiniband.vendor"]
		c.bytesHex("cnp+icrc", fmt.Sprintf("%016x%016x%s", h.Reserved1, h.Reserved2, icrcWire[2:]), stripColons(vendor))
	} else {
		c.str("icrc", icrcWire, ts.ICRC)
	}

	// Payload: tshark's includes the pad bytes.
	tsLen := len(ts.Payload) / 2
	c.num("payload_len+padcount", uint64(*ours.PayloadLen+*ours.PadCount), map[string]string{"len": strconv.Itoa(tsLen)}, "len")
	c.n++
	if !strings.HasPrefix(ts.Payload, *ours.PayloadHex) {
		c.failf("payload bytes differ (rxed %d bytes, tshark %d with pad)", *ours.PayloadLen, tsLen)
	}
	return c
}

func canonAddr(s string) string {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "invalid:" + s
	}
	return a.Unmap().String()
}

// fileResult is the outcome of comparing one capture.
type fileResult struct {
	roce, skipped, fields int
	diffs                 []string
}

// compareFile compares rxed's and tshark's view of every frame: both must
// agree on which frames are RoCEv2 and on every field of those.
func compareFile(ours []ourPacket, ts []tsPacket) fileResult {
	var r fileResult
	if len(ours) != len(ts) {
		r.diffs = append(r.diffs, fmt.Sprintf("frame count: rxed %d, tshark %d", len(ours), len(ts)))
		return r
	}
	for i := range ours {
		o, s := &ours[i], &ts[i]
		if o.Frame != s.Number {
			r.diffs = append(r.diffs, fmt.Sprintf("line %d: rxed frame %d, tshark frame %d", i+1, o.Frame, s.Number))
			continue
		}
		switch {
		case o.Skipped && !s.isRoCE():
			r.skipped++
			continue
		case o.Skipped:
			r.diffs = append(r.diffs, fmt.Sprintf("frame %d: rxed skips it (%s), tshark dissects %s", o.Frame, o.Reason, s.Protocols))
			continue
		case !s.isRoCE():
			r.diffs = append(r.diffs, fmt.Sprintf("frame %d: rxed decodes RoCEv2, tshark dissects %s", o.Frame, s.Protocols))
			continue
		}
		r.roce++
		c := comparePacket(o, s)
		r.fields += c.n
		for _, d := range c.diffs {
			r.diffs = append(r.diffs, fmt.Sprintf("frame %d: %s", o.Frame, d))
		}
	}
	return r
}

// tsharkVersion returns tshark's first version line, for the test log.
func tsharkVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown: " + err.Error()
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return line
}
