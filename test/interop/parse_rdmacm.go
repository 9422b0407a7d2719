//go:build linux

package interop

import (
	"bufio"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// RpingPing is one "ping data: rdma-ping-N: ..." line (client) or "server ping data: ..." line
// (server) of rping -v.
type RpingPing struct {
	Index int    // N of "rdma-ping-N: "
	Data  string // everything after "ping data: "
}

var rpingLine = regexp.MustCompile(`^(server )?ping data: (rdma-ping-(\d+): .*)$`)

// ParseRpingPings returns the -v lines of one side in output order: the client's "ping data:"
// lines when server is false, the server's "server ping data:" lines when true. Other lines
// (stderr interleaved, debug lines) are skipped.
func ParseRpingPings(out string, server bool) []RpingPing {
	var ps []RpingPing
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		m := rpingLine.FindStringSubmatch(strings.TrimRight(sc.Text(), "\r"))
		if m == nil || (m[1] != "") != server {
			continue
		}
		n, err := strconv.Atoi(m[3])
		if err != nil {
			continue
		}
		ps = append(ps, RpingPing{Index: n, Data: m[2]})
	}
	return ps
}

// RpingData is the string rping's client puts in its start buffer for ping i with -S size, as
// the receiving side prints it: "rdma-ping-<i>: " then printable characters from 'A'+i (mod the
// 'A'..'z' range of 58) rotating through 'A'..'z', cut at size-1 bytes (the last byte is NUL).
// This is rping_test_client's fill loop; the pattern starts one character later every ping.
func RpingData(i, size int) string {
	b := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
	c := byte('A' + i%58)
	for len(b) < size-1 {
		b = append(b, c)
		if c++; c > 'z' {
			c = 'A'
		}
	}
	return string(b[:min(len(b), size-1)])
}

// CheckRpingPings judges one side's -v lines: exactly pings lines (per client: runs clients
// in a row each print 0..pings-1), each the data RpingData predicts. what names the side.
func CheckRpingPings(what string, ps []RpingPing, runs, pings, size int) []string {
	var problems []string
	if len(ps) != runs*pings {
		problems = append(problems, fmt.Sprintf("%s printed %d ping lines, want %d", what, len(ps), runs*pings))
	}
	seen := map[int]int{}
	for _, p := range ps {
		seen[p.Index]++
		if want := RpingData(p.Index, size); p.Data != want {
			problems = append(problems, fmt.Sprintf("%s ping %d: %q, want %q", what, p.Index, p.Data, want))
			break
		}
	}
	for i := range pings {
		if seen[i] != runs {
			problems = append(problems, fmt.Sprintf("%s printed ping %d %d times, want %d", what, i, seen[i], runs))
			break
		}
	}
	return problems
}

var returnStatus = regexp.MustCompile(`(?m)^return status (-?\d+)\s*$`)

// ParseReturnStatus reads the "return status N" line ucmatose and udaddy (and rxed's cmatose
// and udaddy) end with. ok is false without one.
func ParseReturnStatus(out string) (status int, ok bool) {
	m := returnStatus.FindAllStringSubmatch(out, -1)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[len(m)-1][1])
	return n, err == nil
}

// MissingLines returns the first of want that does not appear, as a whole line, after the
// previous one in out ("" when all appear in order).
func MissingLines(out string, want []string) string {
	lines := strings.Split(out, "\n")
	i := 0
	for _, w := range want {
		for i < len(lines) && strings.TrimSpace(lines[i]) != w {
			i++
		}
		if i == len(lines) {
			return w
		}
		i++
	}
	return ""
}

// The progress lines of librdmacm's examples, in the order each role prints them (ucmatose
// prints "cmatose: ..."; rxed's cmatose and udaddy print the same).
var (
	CmatoseServerLines = []string{"cmatose: starting server", "initiating data transfers", "completing sends",
		"receiving data transfers", "data transfers complete", "cmatose: disconnecting", "disconnected",
		"test complete", "return status 0"}
	CmatoseClientLines = []string{"cmatose: starting client", "cmatose: connecting", "receiving data transfers",
		"sending replies", "data transfers complete", "test complete", "return status 0"}
	UdaddyServerLines = []string{"udaddy: starting server", "receiving data transfers", "sending replies",
		"data transfers complete", "test complete", "return status 0"}
	UdaddyClientLines = []string{"udaddy: starting client", "udaddy: connecting", "initiating data transfers",
		"receiving data transfers", "data transfers complete", "test complete", "return status 0"}
)

// rejected8 matches how each client tool reports a REJ with reason 8 (invalid service ID):
// rping "cma event RDMA_CM_EVENT_REJECTED, error 8", ucmatose/udaddy "event: RDMA_CM_EVENT_REJECTED,
// error: 8", rxed "rejected: invalid service ID (8)".
var rejected8 = regexp.MustCompile(`RDMA_CM_EVENT_REJECTED, error:? 8\b|rejected: invalid service ID \(8\)`)

// ReportsReject8 tells whether a client's output names a REJ with reason 8.
func ReportsReject8(out string) bool { return rejected8.MatchString(out) }

// CM attribute IDs (IBA 16.7.1; tshark's infiniband.mad.attributeid).
const (
	AttrREQ     = 0x10
	AttrMRA     = 0x11
	AttrREJ     = 0x12
	AttrREP     = 0x13
	AttrRTU     = 0x14
	AttrDREQ    = 0x15
	AttrDREP    = 0x16
	AttrSIDRREQ = 0x17
	AttrSIDRREP = 0x18
)

// cmAttrNames are the names of the kernel's ib_cm counter files
// (/sys/class/infiniband_cm/<dev>/<port>/cm_{tx_msgs,rx_msgs,...}/<name>).
var cmAttrNames = map[uint16]string{
	AttrREQ: "req", AttrMRA: "mra", AttrREJ: "rej", AttrREP: "rep", AttrRTU: "rtu",
	AttrDREQ: "dreq", AttrDREP: "drep", AttrSIDRREQ: "sidr_req", AttrSIDRREP: "sidr_rep",
}

// cmName names a CM attribute as the kernel's counter files do.
func cmName(a uint16) string {
	if n, ok := cmAttrNames[a]; ok {
		return n
	}
	return fmt.Sprintf("%#x", a)
}

// CMMsg is one CM MAD seen on the wire.
type CMMsg struct {
	From   string // source IP address
	Attr   uint16
	Reason int // REJ reason (REJ only)
}

// ParseCMFlow reads the output of
//
//	tshark -r FILE -Y infiniband.mad -T fields -e ip.src -e ipv6.src -e infiniband.mad.attributeid -e infiniband.cm.rej.reason
//
// (tab-separated; the IP column of the other family is empty) into the CM messages in order.
// Lines that do not have that shape (tshark's warnings) are skipped.
func ParseCMFlow(s string) []CMMsg {
	var ms []CMMsg
	for _, l := range strings.Split(s, "\n") {
		f := strings.Split(strings.TrimRight(l, "\r"), "\t")
		if len(f) < 3 {
			continue
		}
		from := f[0]
		if from == "" {
			from = f[1]
		}
		a, err := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 16)
		if err != nil || from == "" {
			continue
		}
		m := CMMsg{From: from, Attr: uint16(a)}
		if len(f) > 3 && f[3] != "" {
			if r, err := strconv.ParseUint(strings.TrimPrefix(f[3], "0x"), 16, 16); err == nil {
				m.Reason = int(r)
			}
		}
		ms = append(ms, m)
	}
	return ms
}

// CMCount is how many of each CM message one side sent, by attribute.
type CMCount map[uint16]int

// String renders the counts as "req=1 rtu=1", sorted by attribute.
func (c CMCount) String() string {
	var ks []int
	for k, v := range c {
		if v != 0 {
			ks = append(ks, int(k))
		}
	}
	sort.Ints(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s=%d", cmName(uint16(k)), c[uint16(k)]))
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}

// CountFrom counts the messages of flow sent from address from.
func CountFrom(flow []CMMsg, from string) CMCount {
	c := CMCount{}
	for _, m := range flow {
		if m.From == from {
			c[m.Attr]++
		}
	}
	return c
}

// GuestCMSent reads what the kernel's ib_cm sent from the delta of its counters (cm_tx_msgs
// includes retransmissions, cm_tx_retries counts them): first sends, and retransmissions.
func GuestCMSent(delta Counters) (sent, retries CMCount) {
	sent, retries = CMCount{}, CMCount{}
	for a, name := range cmAttrNames {
		r := delta["cm_tx_retries/"+name]
		sent[a] = int(delta["cm_tx_msgs/"+name] - min(r, delta["cm_tx_msgs/"+name]))
		retries[a] = int(r)
	}
	return sent, retries
}

// GuestCMReceived reads what the kernel's ib_cm received (cm_rx_msgs, with cm_rx_duplicates
// of them recognised as duplicates).
func GuestCMReceived(delta Counters) (rcvd, dups CMCount) {
	rcvd, dups = CMCount{}, CMCount{}
	for a, name := range cmAttrNames {
		d := delta["cm_rx_duplicates/"+name]
		rcvd[a] = int(delta["cm_rx_msgs/"+name] - min(d, delta["cm_rx_msgs/"+name]))
		dups[a] = int(d)
	}
	return rcvd, dups
}

// CompareCM judges the messages one side sent (got) against what the tools' protocol implies
// (want): a missing message is a problem, an extra one (a retransmission under TCG) a note.
func CompareCM(who string, got, want CMCount) (problems, notes []string) {
	attrs := map[uint16]bool{}
	for a := range got {
		attrs[a] = true
	}
	for a := range want {
		attrs[a] = true
	}
	for a := range attrs {
		switch g, w := got[a], want[a]; {
		case g < w:
			problems = append(problems, fmt.Sprintf("%s sent %s, want %s", who, got, want))
			return problems, nil
		case g > w && w == 0 && (a == AttrREJ || a == AttrDREQ || a == AttrMRA):
			// a message the flow has no place for: a REJ or DREQ (or MRA) nobody asked for
			problems = append(problems, fmt.Sprintf("%s sent %s, want %s", who, got, want))
			return problems, nil
		case g > w:
			notes = append(notes, fmt.Sprintf("%s sent %d extra %s (retransmitted)", who, g-w, cmName(a)))
		}
	}
	sort.Strings(notes)
	return problems, notes
}
