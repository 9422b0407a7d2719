package decode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func runDecode(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = Run(args, &o, &e)
	return code, o.String(), e.String()
}

func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var res []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		d := json.NewDecoder(strings.NewReader(sc.Text()))
		d.UseNumber()
		var m map[string]any
		require.NoError(t, d.Decode(&m), sc.Text())
		res = append(res, m)
	}
	return res
}

// checkTally parses CHECK.txt (written by the lab's independent Python
// checker) into file -> "TRANSPORT SHORTNAME" -> count.
func checkTally(t *testing.T, shared string) map[string]map[string]int {
	b, err := os.ReadFile(filepath.Join(shared, "pcaps", "CHECK.txt"))
	require.NoError(t, err)
	res := map[string]map[string]int{}
	file := ""
	head := regexp.MustCompile(`^== (\S+): (\d+) RoCEv2 packets, ICRC ok (\d+)/(\d+)`)
	for _, line := range strings.Split(string(b), "\n") {
		if m := head.FindStringSubmatch(line); m != nil {
			file = m[1]
			res[file] = map[string]int{}
			continue
		}
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "opcode: "); ok && file != "" {
			for _, item := range strings.Split(rest, ", ") {
				i := strings.LastIndex(item, " x")
				n, err := strconv.Atoi(item[i+2:])
				require.NoError(t, err)
				res[file][item[:i]] = n
			}
		}
	}
	return res
}

// shortName turns rxed's opcode names into CHECK.txt's abbreviations.
func shortName(name string) string {
	r := strings.NewReplacer("RDMA_READ_RESPONSE", "READ_RESP", "RDMA_READ_REQUEST", "READ_REQ",
		"RDMA_WRITE", "WRITE", "ACKNOWLEDGE", "ACK", "COMPARE_SWAP", "CMP_SWAP", "WITH_IMMEDIATE", "IMM")
	s := r.Replace(name)
	return strings.Replace(s, "_", " ", 1) // "RC_SEND_FIRST" -> "RC SEND_FIRST"
}

// TestDecodeRealCaptures runs `rxed decode -json` on every rdma_rxe
// capture: every RoCEv2 packet has ICRC ok and no error, the per-opcode
// counts equal those of the lab's independent checker, and everything else
// (the TCP out-of-band exchange) is reported as skipped.
func TestDecodeRealCaptures(t *testing.T) {
	shared := sharedDir(t)
	tally := checkTally(t, shared)
	files, err := filepath.Glob(filepath.Join(shared, "pcaps", "*.pcap"))
	require.NoError(t, err)
	require.Len(t, tally, len(files))
	for _, path := range files {
		base := filepath.Base(path)
		t.Run(base, func(t *testing.T) {
			code, out, errOut := runDecode(t, "-json", path)
			require.Equal(t, 0, code, errOut)
			got := map[string]int{}
			for _, m := range jsonLines(t, out) {
				if m["skipped"] == true {
					require.Contains(t, m["reason"], "TCP")
					continue
				}
				require.Equal(t, "ok", m["icrc"], "frame %v", m["frame"])
				require.Equal(t, "", m["error"], "frame %v", m["frame"])
				require.Equal(t, json.Number("4791"), m["dport"])
				got[shortName(m["opcode_name"].(string))]++
			}
			require.Equal(t, tally[base], got)
		})
	}
}

// TestDecodeImmediates checks decoded fields against what the lab's
// rxe_imm program sent (README of the captures).
func TestDecodeImmediates(t *testing.T) {
	path := filepath.Join(sharedDir(t), "pcaps", "rc_imm_write_send_with_imm.pcap")
	code, out, _ := runDecode(t, path)
	require.Equal(t, 0, code)
	var imms []string
	for _, m := range regexp.MustCompile(`ImmDt\((0x[0-9a-f]{8})\)`).FindAllStringSubmatch(out, -1) {
		imms = append(imms, m[1])
	}
	require.Equal(t, []string{"0x11223344", "0x55667788", "0x99aabbcc", "0xddeeff00"}, imms)
	require.Contains(t, out, "   10    0.015849 10.77.0.12:49441 -> 10.77.0.11:4791 RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE QP=0x000011 PSN=8741295 AckReq RETH(va=0x55a4694af000 rkey=0x2d1 dmalen=64) ImmDt(0x11223344) len=64 icrc=ok\n")
	require.Contains(t, out, "    1    0.000000 skipped (not RoCEv2: TCP 10.77.0.12:45300 -> 10.77.0.11:18515)\n")

	code, out, _ = runDecode(t, path, "-v")
	require.Equal(t, 0, code)
	require.Contains(t, out, "      RETH: va=0x000055a4694af000 rkey=0x000002d1 dmalen=64\n")
	require.Contains(t, out, "      AETH: syndrome=0x1f (ACK credits=31) msn=1\n")
	require.Contains(t, out, "      IPv4: 10.77.0.12 -> 10.77.0.11 ihl=5 tos=0x00 len=128 id=30524 flags=0x2 frag=0 ttl=64 proto=17 checksum=0xae80\n")
}

// TestDecodeConformance runs -json on the conformance corpus: valid frames
// print exactly the header objects of valid.jsonl, invalid frames the
// expected error.
func TestDecodeConformance(t *testing.T) {
	dir := filepath.Join(sharedDir(t), "conformance")
	read := func(name string) []map[string]any {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return jsonLines(t, string(b))
	}
	want := read("valid.jsonl")
	code, out, _ := runDecode(t, "-json", "-v", filepath.Join(dir, "valid.pcap"))
	require.Equal(t, 0, code)
	got := jsonLines(t, out)
	require.Len(t, got, len(want))
	for i := range want {
		w, g := want[i], got[i]
		require.Equal(t, "ok", g["icrc"], w["name"])
		require.Equal(t, "", g["error"], w["name"])
		require.Equal(t, w["bth"].(map[string]any)["opcode"], g["opcode"])
		require.Equal(t, w["bth"].(map[string]any)["dqpn"], g["dqpn"])
		require.Equal(t, w["bth"].(map[string]any)["psn"], g["psn"])
		for _, k := range []string{"opcode_name", "transport", "bth", "headers", "reth", "deth", "atomiceth",
			"aeth", "atomicacketh", "immdt", "ieth", "cnp", "payload_len", "payload_hex", "icrc_le_u32"} {
			require.Equal(t, w[k], g[k], "%v: %s", w["name"], k)
		}
		require.Equal(t, w["udp"].(map[string]any)["sport"], g["sport"])
	}

	wantBad := read("invalid.jsonl")
	code, out, _ = runDecode(t, "-json", filepath.Join(dir, "invalid.pcap"))
	require.Equal(t, 0, code)
	got = jsonLines(t, out)
	require.Len(t, got, len(wantBad))
	for i := range wantBad {
		require.Equal(t, wantBad[i]["verdict"], got[i]["error"], "%v", wantBad[i]["name"])
	}
}

func TestDecodeBadInput(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := runDecode(t, filepath.Join(dir, "missing.pcap"))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "rxed decode:")
	require.Contains(t, errOut, "no such file")

	junk := filepath.Join(dir, "junk.pcap")
	require.NoError(t, os.WriteFile(junk, []byte("GET / HTTP/1.1\r\n\r\n"), 0o600))
	code, _, errOut = runDecode(t, junk)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not a pcap or pcapng file")

	// A real capture cut in the middle of a record: the frames before the
	// cut are printed, then the error.
	src, err := os.ReadFile(filepath.Join(sharedDir(t), "pcaps", "rc_pingpong_send_64.pcap"))
	require.NoError(t, err)
	cut := filepath.Join(dir, "cut.pcap")
	require.NoError(t, os.WriteFile(cut, src[:len(src)-10], 0o600))
	code, out, errOut := runDecode(t, cut)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "unexpected EOF")
	require.Contains(t, out, "RC_SEND_ONLY")

	// A wrong number of files: a line saying so, then the usage. Bug
	// (newcomer walkthrough, item 4): the usage alone, nothing saying
	// what was wrong.
	code, _, errOut = runDecode(t)
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(errOut, "rxed decode: no capture file given"), errOut)
	require.Contains(t, errOut, "usage: rxed decode")
	code, _, errOut = runDecode(t, "a.pcap", "b.pcap")
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(errOut, "rxed decode: want one capture file, got 2: a.pcap b.pcap\n"), errOut)
	require.Contains(t, errOut, "usage: rxed decode")
	code, _, _ = runDecode(t, "-nosuchflag", "a.pcap")
	require.Equal(t, 2, code)
	code, _, errOut = runDecode(t, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "-json")
}

// TestDecodeMatchesPerftestLogs checks the first RDMA request of each
// perftest WRITE/READ capture against what perftest itself printed: the
// requester's initial PSN, and the responder's QPN, R_Key and buffer
// address, which must appear in the BTH and RETH.
func TestDecodeMatchesPerftestLogs(t *testing.T) {
	shared := sharedDir(t)
	addr := regexp.MustCompile(`(local|remote) address: LID \w+ QPN (0x[0-9a-f]+) PSN (0x[0-9a-f]+)(?: OUT 0x[0-9a-f]+)? RKey (0x[0-9a-f]+) VAddr (0x[0-9a-f]+)`)
	num := func(s string) uint64 {
		v, err := strconv.ParseUint(s, 0, 64)
		require.NoError(t, err)
		return v
	}
	checked := 0
	for _, name := range []string{"perftest_write_bw_rc_4096", "perftest_write_bw_rc_64", "perftest_write_bw_rc_65536",
		"perftest_write_bw_rc_16384_mtu4096", "perftest_write_bw_rc_4096_ipv6", "perftest_write_lat_rc_2",
		"perftest_read_bw_rc_4096", "perftest_read_bw_rc_64", "perftest_read_lat_rc_2"} {
		log, err := os.ReadFile(filepath.Join(shared, "pcaps", "logs", name+".client.txt"))
		require.NoError(t, err)
		m := map[string][]string{}
		for _, a := range addr.FindAllStringSubmatch(string(log), -1) {
			m[a[1]] = a
		}
		require.Len(t, m, 2, name)
		code, out, _ := runDecode(t, "-json", filepath.Join(shared, "pcaps", name+".pcap"))
		require.Equal(t, 0, code)
		for _, p := range jsonLines(t, out) {
			// The client (VM2, 10.77.0.12 / fd77::12) logged these values.
			if p["skipped"] == true || p["reth"] == nil || !strings.HasSuffix(p["src"].(string), "12") {
				continue
			}
			reth := p["reth"].(map[string]any)
			require.Equal(t, json.Number(strconv.FormatUint(num(m["remote"][2]), 10)), p["dqpn"], name)
			require.Equal(t, json.Number(strconv.FormatUint(num(m["local"][3]), 10)), p["psn"], name)
			require.Equal(t, json.Number(strconv.FormatUint(num(m["remote"][4]), 10)), reth["rkey"], name)
			require.Equal(t, json.Number(strconv.FormatUint(num(m["remote"][5]), 10)), reth["va"], name)
			checked++
			break
		}
	}
	require.Equal(t, 9, checked)
}

func TestDecodeStdin(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(sharedDir(t), "pcaps", "rc_pingpong_send_64.pcap"))
	require.NoError(t, err)
	old := stdin
	stdin = bytes.NewReader(b)
	defer func() { stdin = old }()
	code, out, errOut := runDecode(t, "-")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, 40, strings.Count(out, "icrc=ok"))
}
