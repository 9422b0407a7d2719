//go:build linux

package interop

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// PerfRow is the result row of a perftest run, by column header (e.g. "BW average[MB/sec]",
// "t_typical[usec]").
type PerfRow map[string]float64

// perfHeaderToken matches one column header: "#bytes", "BW peak[MB/sec]", "99% percentile[usec]".
var perfHeaderToken = regexp.MustCompile(`#\w+|\S[^\[\]#]*?\[[^\]]*\]`)

// ParsePerf reads the result table perftest prints (the line starting with "#bytes" and the row
// after it). rxed perf is expected to print the same table. ok is false when there is none.
func ParsePerf(out string) (row PerfRow, ok bool) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(strings.TrimSpace(l), "#bytes") {
			continue
		}
		heads := perfHeaderToken.FindAllString(l, -1)
		for _, v := range lines[i+1:] {
			f := strings.Fields(v)
			if len(f) == 0 {
				continue
			}
			if strings.HasPrefix(f[0], "---") || strings.HasPrefix(f[0], "#bytes") {
				break // the table ended without a row
			}
			if _, err := strconv.ParseFloat(f[0], 64); err != nil {
				continue // a progress or warning line interleaved from stderr
			}
			row = PerfRow{}
			for j := 0; j < len(heads) && j < len(f); j++ {
				x, err := strconv.ParseFloat(f[j], 64)
				if err != nil {
					return nil, false
				}
				row[heads[j]] = x
			}
			return row, true
		}
	}
	return nil, false
}

// Metric renders the row's headline number: average bandwidth for bandwidth tests, typical and
// average latency for latency tests.
func (r PerfRow) Metric(k Kind) string {
	switch k {
	case PerfBW:
		if v, ok := r["BW average[MB/sec]"]; ok {
			return fmt.Sprintf("%.2f MiB/s", v)
		}
		if v, ok := r["BW average[Gb/sec]"]; ok {
			return fmt.Sprintf("%.3f Gbit/s", v)
		}
	case PerfLat:
		t, ok1 := r["t_typical[usec]"]
		a, ok2 := r["t_avg[usec]"]
		if ok1 && ok2 {
			return fmt.Sprintf("%.1f µs typ, %.1f µs avg", t, a)
		}
	}
	return ""
}

// PingpongResult is what ibv_*_pingpong prints at the end of a successful run.
type PingpongResult struct {
	Bytes       int64
	Mbits       float64
	Iters       int
	UsecPerIter float64
}

var (
	ppBytes = regexp.MustCompile(`(\d+) bytes in [\d.]+ seconds = ([\d.]+) Mbit/sec`)
	ppIters = regexp.MustCompile(`(\d+) iters in [\d.]+ seconds = ([\d.]+) usec/iter`)
)

// ParsePingpong finds the two result lines of ibv_*_pingpong (rxed pingpong prints the same).
func ParsePingpong(out string) (PingpongResult, bool) {
	var r PingpongResult
	b := ppBytes.FindStringSubmatch(out)
	it := ppIters.FindStringSubmatch(out)
	if b == nil || it == nil {
		return r, false
	}
	r.Bytes, _ = strconv.ParseInt(b[1], 10, 64)
	r.Mbits, _ = strconv.ParseFloat(b[2], 64)
	r.Iters, _ = strconv.Atoi(it[1])
	r.UsecPerIter, _ = strconv.ParseFloat(it[2], 64)
	return r, true
}

// Metric renders the pingpong result for the table.
func (r PingpongResult) Metric() string {
	return fmt.Sprintf("%.2f Mbit/s, %.0f µs/iter", r.Mbits, r.UsecPerIter)
}

// Counters is a set of named counters (rxe hw_counters or rxed's JSON dump).
type Counters map[string]uint64

// ParseHWCounters reads "name:value" lines, as printed by `grep -H . *` in the hw_counters
// directory. Lines that do not have that shape are ignored.
func ParseHWCounters(s string) Counters {
	c := Counters{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		name, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
		if err != nil {
			continue
		}
		c[name] = v
	}
	return c
}

// ParseRxedCounters reads rxed's --counters-out file: one JSON object of counter name to
// non-negative integer.
func ParseRxedCounters(b []byte) (Counters, error) {
	raw := map[string]any{}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("rxed counters: %w", err)
	}
	if dec.More() {
		return nil, errors.New("rxed counters: more than one JSON value")
	}
	c := Counters{}
	for k, x := range raw {
		n, ok := x.(json.Number)
		if !ok {
			return nil, fmt.Errorf("rxed counters: %s = %v is not a number", k, x)
		}
		v, err := strconv.ParseUint(n.String(), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("rxed counters: %s = %s is not a non-negative integer", k, n)
		}
		c[k] = v
	}
	return c, nil
}

// Delta returns after-before for every counter in after (counters that went down, e.g. after a
// reset, count from zero).
func Delta(before, after Counters) Counters {
	d := Counters{}
	for k, a := range after {
		if b := before[k]; a >= b {
			d[k] = a - b
		} else {
			d[k] = a
		}
	}
	return d
}

// String lists the non-zero counters, sorted by name.
func (c Counters) String() string {
	var parts []string
	for _, k := range c.names() {
		if c[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
		}
	}
	if len(parts) == 0 {
		return "(all zero)"
	}
	return strings.Join(parts, " ")
}

func (c Counters) names() []string {
	ks := make([]string, 0, len(c))
	for k := range c {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// rxeHardErrors are rdma_rxe's hw_counters that mean a request failed for good. Any change
// fails a cell.
var rxeHardErrors = []string{"retry_exceeded_err", "retry_rnr_exceeded_err", "send_err", "link_downed"}

// rxeRecoveryCounters count recovery: retransmission, duplicate and out-of-sequence detection,
// RNR flow control. They are expected under netem loss, and under TCG emulation rxe's own
// retransmit timer (4.096 µs * 2^14 = 67 ms for the tools' QPs) fires spuriously now and then, so
// outside strict mode they are reported as notes rather than failures.
var rxeRecoveryCounters = []string{
	"duplicate_request", "out_of_seq_request", "rcvd_seq_err", "completer_retry_err", "rcvd_rnr_err", "send_rnr_err",
}

// CheckRxeCounters judges the change of rxe-named counters during a cell: problems fail the
// cell, notes are reported. strict makes recovery counters problems unless the cell adds loss.
func CheckRxeCounters(delta Counters, loss, strict bool) (problems, notes []string) {
	for _, k := range rxeHardErrors {
		if delta[k] != 0 {
			problems = append(problems, fmt.Sprintf("%s +%d", k, delta[k]))
		}
	}
	for _, k := range rxeRecoveryCounters {
		if delta[k] == 0 {
			continue
		}
		if strict && !loss {
			problems = append(problems, fmt.Sprintf("%s +%d", k, delta[k]))
		} else {
			notes = append(notes, fmt.Sprintf("%s +%d", k, delta[k]))
		}
	}
	return problems, notes
}

// CheckDelivery compares what one side put on the wire with what the other accepted: rxe
// counts rcvd_pkts only after its header, QP and ICRC checks, so without loss a shortfall is the
// number of packets rxe silently dropped (rdma_rxe 6.1 logs nothing for a bad ICRC). slack
// forgives that many missing packets: outside strict mode it is the sender's retransmission
// count, because a spurious retransmission that arrives after the peer destroyed its QP is not
// counted either. Counters missing on either side skip the check.
func CheckDelivery(from string, sender Counters, to string, receiver Counters, slack uint64) string {
	sent, ok1 := sender["sent_pkts"]
	rcvd, ok2 := receiver["rcvd_pkts"]
	if !ok1 || !ok2 || sent == rcvd || (sent > rcvd && sent-rcvd <= slack) {
		return ""
	}
	return fmt.Sprintf("%s sent_pkts %d but %s rcvd_pkts %d", from, sent, to, rcvd)
}

// Retransmissions is a sender's count of retransmission events (rxe's completer_retry_err;
// rxed also reports retransmit_timeouts and fast_retransmits, its resends before the timer).
func Retransmissions(c Counters) uint64 {
	return c["completer_retry_err"] + c["retransmit_timeouts"] + c["fast_retransmits"]
}

// LateAnswers is how many packets the peer may have sent in answer to duplicate requests (an
// ACK, or a READ's or atomic's response, per duplicate rxe counts in duplicate_request). A
// duplicate the requester resent spuriously (the TCG guest stalled past its round-trip estimate)
// is answered after the first answer completed the WR, so the answer can arrive once the
// requester's QP has left RTS (rdma_disconnect moves it to ERR): it is counted by neither
// rcvd_pkts nor as a delivery, but as drop_state. Outside strict mode those are forgiven.
func LateAnswers(peer Counters, strict bool) uint64 {
	if strict {
		return 0
	}
	return peer["duplicate_request"]
}

// IDJumps is how many drop_ipv4_id drops rxed's counters c show to be the guest's own
// Identification counter moving on rather than damaged packets: each ipv4_id_resync is a packet
// whose ID followed the one rejected before it, which re-anchored the window (pkg/roce/ipv4id.go:
// a legitimate jump costs one packet, and RC resends it). rdma_rxe's counter jumps by a random
// amount below the jiffies since its bucket was last used; an emulated guest's jiffies can
// outrun rxed's clock after the guest stalls (the CI run at e3e59b3: rc_pingpong/mtu4096/1B, one
// ACK rejected, re-anchored, resent on rxed's retransmit timer, while the host was also running
// benchmarks). Outside strict mode those drops are notes; in strict mode none is forgiven.
func IDJumps(c Counters, strict bool) uint64 {
	if strict {
		return 0
	}
	return c["ipv4_id_resync"]
}

// CheckRxedCounters applies the counters contract (README.md) to rxed's dump: every counter
// named drop_* must be 0 (a packet rxe sent was rejected: bad ICRC, bad header, unknown QP...),
// except that up to late drop_state drops are notes (LateAnswers: answers to duplicates that
// reached a QP after it left RTS) and, outside strict mode, drop_ipv4_id drops each followed by
// an ipv4_id_resync are notes (IDJumps), and counters that carry rxe's names are judged like the
// guest's.
func CheckRxedCounters(c Counters, loss, strict bool, late uint64) (problems, notes []string) {
	jumps := IDJumps(c, strict)
	for _, k := range c.names() {
		switch {
		case !strings.HasPrefix(k, "drop_") || c[k] == 0:
		case k == "drop_state" && c[k] <= late:
			notes = append(notes, fmt.Sprintf("rxed %s=%d (answers to %d duplicate requests may come late)", k, c[k], late))
		case k == "drop_ipv4_id" && c[k] <= jumps:
			notes = append(notes, fmt.Sprintf("rxed %s=%d (the guest's IPv4 ID counter jumped out of the window; re-anchored %d times)", k, c[k], jumps))
		default:
			problems = append(problems, fmt.Sprintf("rxed %s=%d", k, c[k]))
		}
	}
	p, n := CheckRxeCounters(c, loss, strict)
	for _, x := range p {
		problems = append(problems, "rxed "+x)
	}
	for _, x := range n {
		notes = append(notes, "rxed "+x)
	}
	return problems, notes
}

// ParseGIDs reads "index:gid" lines (gid in sysfs form, eight groups of four hex digits) and
// returns the indices of the GIDs equal to v4 (as an IPv4-mapped GID) and v6; -1 when absent.
func ParseGIDs(s string, v4, v6 netip.Addr) (idx4, idx6 int) {
	idx4, idx6 = -1, -1
	want4 := netip.AddrFrom16(v4.As16())
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		i, g, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(i)
		if err != nil {
			continue
		}
		a, err := netip.ParseAddr(g)
		if err != nil {
			continue
		}
		if a == want4 && idx4 < 0 {
			idx4 = n
		}
		if a == v6 && idx6 < 0 {
			idx6 = n
		}
	}
	return idx4, idx6
}

// ParseSNMP reads the "Udp:" header and value lines of /proc/net/snmp and returns the UDP
// counters prefixed "udp_" (e.g. udp_InErrors, udp_RcvbufErrors).
func ParseSNMP(s string) Counters {
	c := Counters{}
	var head []string
	for _, l := range strings.Split(s, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f[1:]
			continue
		}
		for i, v := range f[1:] {
			if i < len(head) {
				if x, err := strconv.ParseUint(v, 10, 64); err == nil {
					c["udp_"+head[i]] = x
				}
			}
		}
		break
	}
	return c
}

// UDPDrops is the number of datagrams a host's UDP layer discarded, from ParseSNMP's counters.
func UDPDrops(c Counters) uint64 {
	return c["udp_InErrors"] + c["udp_RcvbufErrors"]
}
