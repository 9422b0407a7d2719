package oob

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// captureCase is one reference capture with its tool logs.
type captureCase struct {
	name     string // file name without .pcap
	pcap     string
	pingpong bool
	ud       bool // ibv_ud_pingpong
	test     Test // perftest captures
}

// captureCases lists the captures with a TCP out-of-band exchange
// (rdma_cm runs have none, rxe_imm speaks its own format).
func captureCases(t *testing.T) []captureCase {
	dir := filepath.Join(sharedDir(t), "pcaps")
	files, err := filepath.Glob(filepath.Join(dir, "*.pcap"))
	require.NoError(t, err)
	var out []captureCase
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".pcap")
		c := captureCase{name: name, pcap: f}
		switch {
		case strings.Contains(name, "_pingpong_"):
			c.pingpong = true
			c.ud = strings.HasPrefix(name, "ud_")
		case strings.HasPrefix(name, "perftest_") && !strings.Contains(name, "rdmacm"):
			parts := strings.Split(name, "_")
			c.test.Latency = parts[2] == "lat"
			c.test.Verb = map[string]Verb{"send": VerbSend, "write": VerbWrite, "read": VerbRead, "atomic": VerbAtomic}[parts[1]]
		default:
			continue
		}
		out = append(out, c)
	}
	require.GreaterOrEqual(t, len(out), 19, "expected the 5 pingpong and 14 perftest TCP captures")
	return out
}

// readLog returns a tool log without the lab's "# ..." comment lines.
func readLog(t *testing.T, name, side string) (cmd string, body string) {
	b, err := os.ReadFile(filepath.Join(sharedDir(t), "pcaps", "logs", name+"."+side+".txt"))
	require.NoError(t, err)
	var keep []string
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if strings.HasPrefix(l, "# VM") {
			cmd = l[strings.Index(l, "): ")+3:]
			continue
		}
		if strings.HasPrefix(l, "# exit") || l == "" {
			continue
		}
		keep = append(keep, l)
	}
	return strings.TrimSpace(cmd), strings.Join(keep, "")
}

// perftestSide is one direction of a perftest exchange, decoded.
type perftestSide struct {
	Version string
	Sys     SysData
	MTU     int
	Key     Key
	Keys    int
	Report  *BWReport
	Done    bool
}

// walkPerftest decodes one direction of a perftest stream in the order the
// test makes its exchanges, checking that re-encoding gives the same bytes
// and that nothing is left over.
func walkPerftest(t *testing.T, b []byte, test Test) perftestSide {
	t.Helper()
	var s perftestSide
	take := func(n int) []byte {
		require.GreaterOrEqual(t, len(b), n, "stream ends early")
		m := b[:n]
		b = b[n:]
		return m
	}
	m := take(VersionMsgLen)
	v, err := ParseVersion(m)
	require.NoError(t, err)
	s.Version = v
	var enc [VersionMsgLen]byte
	require.NoError(t, EncodeVersion(enc[:], v))
	require.Equal(t, m, enc[:])
	cb, cl := take(4), take(4)
	s.Sys = SysData{CycleBuffer: uint32(cb[0])<<24 | uint32(cb[1])<<16 | uint32(cb[2])<<8 | uint32(cb[3]),
		CacheLineSize: uint32(cl[0])<<24 | uint32(cl[1])<<16 | uint32(cl[2])<<8 | uint32(cl[3])}
	m = take(MTUMsgLen)
	mtu, ok := ParseMTU(m)
	require.True(t, ok)
	s.MTU = mtu
	var menc [MTUMsgLen]byte
	require.NoError(t, EncodeMTU(menc[:], mtu))
	require.Equal(t, m, menc[:])

	key := func() {
		m := take(KeyMsgLen)
		k, err := ParseKey(m)
		require.NoError(t, err)
		if s.Keys > 0 {
			require.Equal(t, s.Key, k, "every key message of a session carries the same content")
		}
		s.Key = k
		s.Keys++
		enc, err := k.MarshalBinary()
		require.NoError(t, err)
		require.Equal(t, m, enc)
	}
	for range 1 + test.Barriers() {
		key()
	}
	if test.ExchangesReports() {
		key()
		m := take(BWReportLen(8, false))
		r, err := ParseBWReport(m, 8, false)
		require.NoError(t, err)
		s.Report = &r
		require.Equal(t, m, AppendBWReport(nil, r, 8, false))
	}
	if test.ClosesWithExchange() {
		key()
		require.Equal(t, PerftestDoneMsg[:], take(len(PerftestDoneMsg)))
		s.Done = true
	}
	require.Empty(t, b, "bytes left after the exchange")
	return s
}

func TestCapturesPingpong(t *testing.T) {
	for _, c := range captureCases(t) {
		if !c.pingpong {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			st := readOOBStreams(t, c.pcap)
			require.Equal(t, []int{PingpongMsgLen, len(PingpongDoneMsg)}, st.C2SSegments)
			require.Equal(t, []int{PingpongMsgLen}, st.S2CSegments)
			client, err := ParsePingpongDest(st.ClientToServer[:PingpongMsgLen])
			require.NoError(t, err)
			server, err := ParsePingpongDest(st.ServerToClient)
			require.NoError(t, err)
			require.Equal(t, PingpongDoneMsg[:], st.ClientToServer[PingpongMsgLen:])
			for _, d := range []struct {
				dest PingpongDest
				wire []byte
			}{{client, st.ClientToServer[:PingpongMsgLen]}, {server, st.ServerToClient}} {
				enc, err := d.dest.MarshalBinary()
				require.NoError(t, err)
				require.Equal(t, d.wire, enc)
			}

			// The tools print exactly what we print from the parsed
			// messages, on both sides, and the summary arithmetic agrees.
			for _, side := range []string{"client", "server"} {
				_, log := readLog(t, c.name, side)
				lines := strings.SplitAfter(log, "\n")
				require.Len(t, lines, 5) // 4 lines and the empty tail
				local, remote := client, server
				if side == "server" {
					local, remote = server, client
				}
				var b bytes.Buffer
				require.NoError(t, WritePingpongAddress(&b, false, local, c.ud))
				require.NoError(t, WritePingpongAddress(&b, true, remote, c.ud))
				require.Equal(t, lines[0]+lines[1], b.String())

				// "10 iters in 0.02 seconds = 2456.00 usec/iter": the
				// elapsed microseconds are iters * usec/iter.
				m := regexp.MustCompile(`^(\d+) iters in [\d.]+ seconds = ([\d.]+) usec/iter\n$`).FindStringSubmatch(lines[3])
				require.NotNil(t, m, lines[3])
				iters, _ := strconv.Atoi(m[1])
				per, _ := strconv.ParseFloat(m[2], 64)
				usec := math.Round(per * float64(iters))
				size := map[string]uint32{"rc_pingpong_send_64": 64, "ud_pingpong_send_512": 512}[c.name]
				if size == 0 {
					size = 4096
				}
				b.Reset()
				require.NoError(t, WritePingpongSummary(&b, size, uint32(iters), time.Duration(usec)*time.Microsecond))
				require.Equal(t, lines[2]+lines[3], b.String())
			}
		})
	}
}

var (
	reBannerNum = regexp.MustCompile(`(?m)^ (TX depth|RX depth|CQ Moderation|Mtu|GID index|Max inline data|Outstand reads)\s*: (\d+)`)
	reRelax     = regexp.MustCompile(`(?m)^ PCIe relax order: (ON|OFF)$`)
	reBWRow     = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$`)
	reLatRow    = regexp.MustCompile(`(?m)^ 2\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$`)
)

func TestCapturesPerftest(t *testing.T) {
	for _, c := range captureCases(t) {
		if c.pingpong {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			st := readOOBStreams(t, c.pcap)
			client := walkPerftest(t, st.ClientToServer, c.test)
			server := walkPerftest(t, st.ServerToClient, c.test)
			for _, s := range []perftestSide{client, server} {
				require.Equal(t, PerftestVersion, s.Version)
				require.Equal(t, SysData{CycleBuffer: 4096, CacheLineSize: 64}, s.Sys)
				wantMTU := 3
				if strings.Contains(c.name, "mtu4096") {
					wantMTU = 5
				}
				require.Equal(t, wantMTU, s.MTU)
			}
			if c.test.ExchangesReports() {
				// The client's report is real: size and iterations of its
				// command line.
				cmd, _ := readLog(t, c.name, "client")
				m := regexp.MustCompile(`-n (\d+)`).FindStringSubmatch(cmd)
				require.NotNil(t, m)
				iters, _ := strconv.ParseUint(m[1], 10, 64)
				size := uint64(8) // atomics
				if m := regexp.MustCompile(`-s (\d+)`).FindStringSubmatch(cmd); m != nil {
					size, _ = strconv.ParseUint(m[1], 10, 64)
				}
				require.Equal(t, iters, client.Report.Iters)
				require.Equal(t, size, client.Report.Size)
			}

			for _, side := range []string{"client", "server"} {
				cmd, log := readLog(t, c.name, side)
				local, remote := client.Key, server.Key
				if side == "server" {
					local, remote = server.Key, client.Key
				}
				require.Equal(t, buildPerftestLog(t, c, cmd, log, side == "server", local, remote, client.Report), log)
			}
		})
	}
}

// buildPerftestLog prints, with this package, everything a perftest run
// printed: the banner from the command line (numbers perftest derives from
// the device are read back from the log), the addresses from the captured
// keys, and the result row (from the captured report where there is one).
func buildPerftestLog(t *testing.T, c captureCase, cmd, log string, server bool, local, remote Key, report *BWReport) string {
	t.Helper()
	var b bytes.Buffer
	// read/atomic tests on rxe first warn about inline data.
	if c.test.Verb == VerbRead || c.test.Verb == VerbAtomic {
		b.WriteString(InlineWarning + ResultLine)
	}
	if server {
		require.NoError(t, WriteWaitingForClient(&b))
	}
	flags := strings.Fields(cmd)
	flag := func(name, def string) string {
		for i, f := range flags {
			if f == name && i+1 < len(flags) {
				return flags[i+1]
			}
		}
		return def
	}
	num := map[string]int{}
	for _, m := range reBannerNum.FindAllStringSubmatch(log, -1) {
		num[m[1]], _ = strconv.Atoi(m[2])
	}
	gid := -1
	if v, ok := num["GID index"]; ok {
		gid = v
	}
	require.Equal(t, flag("-x", "?"), strconv.Itoa(gid))
	relax := reRelax.FindStringSubmatch(log)
	require.NotNil(t, relax)
	ti := TestInfo{
		Test:           c.test,
		AtomicType:     flag("-A", "FETCH_AND_ADD"),
		Server:         server,
		Device:         flag("-d", "?"),
		NumQPs:         1,
		Connection:     flag("-c", "RC"),
		PCIeRelaxOrder: relax[1] == "ON",
		TxDepth:        num["TX depth"],
		RxDepth:        num["RX depth"],
		CQMod:          num["CQ Moderation"],
		MTU:            MTUEnum(num["Mtu"]),
		GIDIndex:       gid,
		InlineSize:     num["Max inline data"],
		OutReads:       num["Outstand reads"],
	}
	require.NoError(t, WriteTestInfo(&b, ti))
	require.NoError(t, WriteAddress(&b, false, c.test.Verb, local, true))
	require.NoError(t, WriteAddress(&b, true, c.test.Verb, remote, true))
	switch {
	case strings.Contains(log, BWHeader):
		require.NoError(t, WriteBWHeader(&b, false))
		r := report
		if r == nil { // send tests: each side's own figures, not exchanged
			m := reBWRow.FindStringSubmatch(log)
			require.NotNil(t, m)
			r = &BWReport{}
			r.Size, _ = strconv.ParseUint(m[1], 10, 64)
			r.Iters, _ = strconv.ParseUint(m[2], 10, 64)
			r.BWPeak, _ = strconv.ParseFloat(m[3], 64)
			r.BWAvg, _ = strconv.ParseFloat(m[4], 64)
			r.MsgRateAvg, _ = strconv.ParseFloat(m[5], 64)
		}
		require.NoError(t, WriteBWResult(&b, *r, nil, false))
	case strings.Contains(log, LatHeader):
		require.NoError(t, WriteLatencyHeader(&b, false))
		m := reLatRow.FindStringSubmatch(log)
		require.NotNil(t, m)
		v := make([]float64, 8)
		for i := range v {
			v[i], _ = strconv.ParseFloat(m[i+1], 64)
		}
		require.NoError(t, WriteLatencyResult(&b, 2, int(v[0]), LatencyStats{Min: v[1], Max: v[2], Typical: v[3], Avg: v[4], Stdev: v[5], P99: v[6], P999: v[7]}))
	}
	b.WriteString(ResultLine)
	return b.String()
}
