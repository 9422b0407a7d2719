//go:build linux

package interop

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// The TOS cells (matrix_tos.go) check the IP TOS and TTL of every RoCEv2 packet of their
// connections, read with tshark from a capture: which connection a packet belongs to comes from
// the CM MADs (a REQ's and REP's comm IDs and QPNs), its TOS and TTL from its IP header.

// WireFields are the tshark fields ParseWire reads, in this order
// (tshark -r FILE -T fields -E occurrence=f -e ... ): IPv4 and IPv6 columns both, the other
// family's empty; infiniband.cm.req and .rep are the REQ's and REP's local comm IDs.
var WireFields = []string{
	"frame.number", "ip.src", "ipv6.src", "ip.dst", "ipv6.dst",
	"ip.dsfield", "ipv6.tclass", "ip.ttl", "ipv6.hlim",
	"infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.mad.attributeid",
	"infiniband.cm.req", "infiniband.cm.req.localqpn", "infiniband.cm.req.prim_tfcclass", "infiniband.cm.req.prim_hoplim",
	"infiniband.cm.rep", "infiniband.cm.rep.remotecommid", "infiniband.cm.rep.localqpn",
	"infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.remotecommid",
	"infiniband.cm.dreq.localcommid", "infiniband.cm.dreq.remotecommid",
	"infiniband.cm.drsp.localcommid", "infiniband.cm.drsp.remotecommid",
	"infiniband.cm.rej.remotecommid", "infiniband.cm.rej.reason",
}

// Column indices of WireFields.
const (
	wfFrame = iota
	wfSrc4
	wfSrc6
	wfDst4
	wfDst6
	wfTOS4
	wfTClass6
	wfTTL4
	wfHop6
	wfOpcode
	wfDestQP
	wfAttr
	wfREQComm
	wfREQQPN
	wfREQTC
	wfREQHop
	wfREPComm
	wfREPRemote
	wfREPQPN
	wfRTULocal
	wfRTURemote
	wfDREQLocal
	wfDREQRemote
	wfDREPLocal
	wfDREPRemote
	wfREJRemote
	wfREJReason
	wfCount
)

// BTH opcode of an RC ACKNOWLEDGE.
const opRCAck = 17

// WirePacket is one RoCEv2 packet of a capture.
type WirePacket struct {
	Frame    int
	Src, Dst string
	TOS, TTL int // IPv4 TOS and TTL, IPv6 traffic class and hop limit
	Opcode   int
	DestQP   uint32
	Attr     uint16    // CM attribute ID of a MAD (DestQP 1), 0 otherwise
	Comm     [2]uint32 // a CM MAD's local and remote comm IDs (a REQ has no remote one)
	QPN      uint32    // a REQ's or REP's local QPN
	Reason   int       // a REJ's reason
	PathTC   int       // a REQ's primary path traffic class and hop limit, -1 otherwise
	PathHop  int
}

// num parses a tshark number: hex with 0x, else decimal; the first of several occurrences.
func num(s string) (uint64, bool) {
	s, _, _ = strings.Cut(strings.TrimSpace(s), ",")
	if s == "" {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 0, 32)
	return v, err == nil
}

// ParseWire reads tshark's WireFields output. Lines without a BTH (tshark's warnings, packets
// it did not decode as RoCE) are skipped.
func ParseWire(s string) []WirePacket {
	var ps []WirePacket
	for _, l := range strings.Split(s, "\n") {
		f := strings.Split(strings.TrimRight(l, "\r"), "\t")
		if len(f) < wfCount {
			continue
		}
		frame, ok1 := num(f[wfFrame])
		op, ok2 := num(f[wfOpcode])
		dqp, ok3 := num(f[wfDestQP])
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		p := WirePacket{Frame: int(frame), Src: f[wfSrc4], Dst: f[wfDst4], Opcode: int(op), DestQP: uint32(dqp),
			PathTC: -1, PathHop: -1}
		tos, ttl := f[wfTOS4], f[wfTTL4]
		if p.Src == "" {
			p.Src, p.Dst, tos, ttl = f[wfSrc6], f[wfDst6], f[wfTClass6], f[wfHop6]
		}
		v, _ := num(tos)
		p.TOS = int(v)
		v, _ = num(ttl)
		p.TTL = int(v)
		if a, ok := num(f[wfAttr]); ok {
			p.Attr = uint16(a)
		}
		u32 := func(i int) uint32 { v, _ := num(f[i]); return uint32(v) }
		switch p.Attr {
		case AttrREQ:
			p.Comm, p.QPN = [2]uint32{u32(wfREQComm), 0}, u32(wfREQQPN)
			if v, ok := num(f[wfREQTC]); ok {
				p.PathTC = int(v)
			}
			if v, ok := num(f[wfREQHop]); ok {
				p.PathHop = int(v)
			}
		case AttrREP:
			p.Comm, p.QPN = [2]uint32{u32(wfREPComm), u32(wfREPRemote)}, u32(wfREPQPN)
		case AttrRTU:
			p.Comm = [2]uint32{u32(wfRTULocal), u32(wfRTURemote)}
		case AttrDREQ:
			p.Comm = [2]uint32{u32(wfDREQLocal), u32(wfDREQRemote)}
		case AttrDREP:
			p.Comm = [2]uint32{u32(wfDREPLocal), u32(wfDREPRemote)}
		case AttrREJ:
			p.Comm, p.Reason = [2]uint32{0, u32(wfREJRemote)}, int(u32(wfREJReason))
		}
		ps = append(ps, p)
	}
	return ps
}

// WireConn is one RC connection of a capture, from its REQ and REP.
type WireConn struct {
	Client, Server         string
	ClientComm, ServerComm uint32
	ClientQPN, ServerQPN   uint32
	PathTC, PathHop        int // the REQ's primary path
	REQFrame, REPFrame     int
	REJFrame, REJReason    int // a REQ refused: the REJ that answered it
}

// WireConns returns the capture's connections in REQ order (a retransmitted REQ, with the
// same comm ID from the same address, is the same connection).
func WireConns(ps []WirePacket) []*WireConn {
	var cs []*WireConn
	byClient := map[string]*WireConn{} // client address + comm ID
	key := func(a string, c uint32) string { return fmt.Sprintf("%s/%#x", a, c) }
	for _, p := range ps {
		switch p.Attr {
		case AttrREQ:
			if byClient[key(p.Src, p.Comm[0])] != nil {
				continue
			}
			c := &WireConn{Client: p.Src, Server: p.Dst, ClientComm: p.Comm[0], ClientQPN: p.QPN,
				PathTC: p.PathTC, PathHop: p.PathHop, REQFrame: p.Frame}
			byClient[key(p.Src, p.Comm[0])] = c
			cs = append(cs, c)
		case AttrREP:
			if c := byClient[key(p.Dst, p.Comm[1])]; c != nil && c.REPFrame == 0 {
				c.ServerComm, c.ServerQPN, c.REPFrame = p.Comm[0], p.QPN, p.Frame
			}
		case AttrREJ:
			if c := byClient[key(p.Dst, p.Comm[1])]; c != nil && c.REPFrame == 0 && c.REJFrame == 0 {
				c.REJFrame, c.REJReason = p.Frame, p.Reason
			}
		}
	}
	return cs
}

// TOSWant is what a TOS cell expects of its capture.
type TOSWant struct {
	TOS, TTL int
	// Control is how many connections at the start are control connections, which keep TOS
	// 0: perftest -R's exchange (its comm params' DEF_TOS); Conns how many connections the run
	// sets up in all.
	Control, Conns int
	// Names names the ends by address ("rxed", "guest") in findings.
	Names map[string]string
	// JudgeFrom, when set, judges only the packets sent from that address (rxed's own
	// capture: what it records of a received packet's TOS is not the wire's); the others are
	// only summarised.
	JudgeFrom string
}

// tosGroup collects the TOS/TTL pairs of one kind of packet from one sender.
type tosGroup struct {
	what  string
	count map[[2]int]int
	first map[[2]int]int
}

func (g *tosGroup) add(p WirePacket) {
	k := [2]int{p.TOS, p.TTL}
	if g.count[k] == 0 {
		g.first[k] = p.Frame
	}
	g.count[k]++
}

func (g *tosGroup) String() string {
	var ks [][2]int
	for k := range g.count {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return g.first[ks[i]] < g.first[ks[j]] })
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%dx TOS 0x%02x TTL %d (first frame %d)", g.count[k], k[0], k[1], g.first[k]))
	}
	return g.what + ": " + strings.Join(parts, ", ")
}

// CheckTOS judges a capture against w: every connection MAD (REQ, REP, RTU, DREQ, DREP) and
// every data packet and ACK of a connection must carry its TOS (w.TOS; a control connection 0)
// and TTL w.TTL, the REQ's primary path its traffic class, and each test connection must show
// packets from both ends and an ACK. A REQ refused with a REJ (an rxed perf -R client's first
// try at the test connection before perftest's server listens for it: REJ 8) is an attempt
// of the connection its client sets up next, whose TOS it must carry. findings says, per
// connection, what each end sent (the evidence the report keeps); notes lists what the check
// does not judge (MRA, REJ, packets of no connection).
func CheckTOS(ps []WirePacket, w TOSWant) (problems, findings, notes []string) {
	name := func(a string) string {
		if n := w.Names[a]; n != "" {
			return n
		}
		return a
	}
	conns := WireConns(ps)
	label := map[*WireConn]string{}
	kind := map[*WireConn]string{}
	want := map[*WireConn]int{} // the TOS a connection's packets must carry, -1: not judged
	est := 0
	for _, c := range conns {
		if c.REPFrame == 0 && c.REJFrame != 0 {
			continue
		}
		est++
		label[c], kind[c], want[c] = fmt.Sprintf("connection %d", est), "test", w.TOS
		if est <= w.Control {
			kind[c], want[c] = "control", 0
		}
	}
	for i, c := range conns {
		if label[c] != "" {
			continue
		}
		label[c], kind[c], want[c] = fmt.Sprintf("refused REQ of frame %d", c.REQFrame),
			fmt.Sprintf("REJ frame %d reason %d", c.REJFrame, c.REJReason), -1
		for _, n := range conns[i+1:] {
			if n.Client == c.Client && kind[n] != "" && n.REJFrame == 0 {
				want[c] = want[n]
				break
			}
		}
	}
	if est < w.Conns {
		problems = append(problems, fmt.Sprintf("%d connection(s) (REQs answered by a REP) in the capture, want %d", est, w.Conns))
	}
	byComm := map[string]*WireConn{} // sender address + its local comm ID
	byQP := map[string]*WireConn{}   // destination address + QPN
	ck := func(a string, n uint32) string { return fmt.Sprintf("%s/%#x", a, n) }
	for _, c := range conns {
		byComm[ck(c.Client, c.ClientComm)] = c
		if c.REPFrame == 0 {
			if c.REJFrame == 0 {
				problems = append(problems, fmt.Sprintf("the REQ of frame %d got no REP", c.REQFrame))
			}
			continue
		}
		byQP[ck(c.Client, c.ClientQPN)] = c
		byComm[ck(c.Server, c.ServerComm)] = c
		byQP[ck(c.Server, c.ServerQPN)] = c
	}
	// groups per connection, in order of first appearance
	groups := map[*WireConn][]*tosGroup{}
	group := func(c *WireConn, what string) *tosGroup {
		for _, g := range groups[c] {
			if g.what == what {
				return g
			}
		}
		g := &tosGroup{what: what, count: map[[2]int]int{}, first: map[[2]int]int{}}
		groups[c] = append(groups[c], g)
		return g
	}
	type sideKey struct {
		conn *WireConn
		from string
	}
	sent := map[sideKey]int{}
	acks := map[*WireConn]int{}
	bad := map[string]bool{} // one problem per connection, sender and kind
	var strays []int
	var unjudged []string
	for _, p := range ps {
		var c *WireConn
		var what string
		switch {
		case p.DestQP == 1 && p.Attr >= AttrREQ && p.Attr <= AttrDREP && p.Attr != AttrMRA && p.Attr != AttrREJ:
			c, what = byComm[ck(p.Src, p.Comm[0])], strings.ToUpper(cmName(p.Attr))
		case p.DestQP == 1:
			x := fmt.Sprintf("%s %s TOS 0x%02x TTL %d (frame %d)", name(p.Src), strings.ToUpper(cmName(p.Attr)), p.TOS, p.TTL, p.Frame)
			if p.Attr == AttrREJ {
				x = fmt.Sprintf("%s REJ reason %d TOS 0x%02x TTL %d (frame %d)", name(p.Src), p.Reason, p.TOS, p.TTL, p.Frame)
			}
			unjudged = append(unjudged, x)
			continue
		default:
			c, what = byQP[ck(p.Dst, p.DestQP)], "data"
			if p.Opcode == opRCAck {
				what = "ACK"
			}
		}
		if c == nil {
			strays = append(strays, p.Frame)
			continue
		}
		group(c, name(p.Src)+" "+what).add(p)
		if what == "data" || what == "ACK" {
			sent[sideKey{c, p.Src}]++
			if what == "ACK" {
				acks[c]++
			}
		}
		if (w.JudgeFrom != "" && p.Src != w.JudgeFrom) || want[c] < 0 {
			continue
		}
		if k := fmt.Sprint(label[c], p.Src, what); (p.TOS != want[c] || p.TTL != w.TTL) && !bad[k] {
			bad[k] = true
			problems = append(problems, fmt.Sprintf("%s: %s's %s of frame %d has TOS 0x%02x TTL %d, want TOS 0x%02x TTL %d",
				label[c], name(p.Src), what, p.Frame, p.TOS, p.TTL, want[c], w.TTL))
		}
	}
	for _, c := range conns {
		if (w.JudgeFrom == "" || c.Client == w.JudgeFrom) && want[c] >= 0 && c.PathTC != want[c] {
			problems = append(problems, fmt.Sprintf("%s: %s's REQ (frame %d) has primary traffic class 0x%02x, want 0x%02x",
				label[c], name(c.Client), c.REQFrame, c.PathTC, want[c]))
		}
		if kind[c] == "test" && c.REPFrame != 0 {
			for _, a := range []string{c.Client, c.Server} {
				if sent[sideKey{c, a}] == 0 {
					problems = append(problems, fmt.Sprintf("%s: no data packet or ACK from %s in the capture", label[c], name(a)))
				}
			}
			if acks[c] == 0 {
				problems = append(problems, fmt.Sprintf("%s: no ACK in the capture", label[c]))
			}
		}
		f := fmt.Sprintf("%s (%s; %s client QPN %#x, %s server QPN %#x; REQ frame %d primary path traffic class 0x%02x hop limit %d)",
			label[c], kind[c], name(c.Client), c.ClientQPN, name(c.Server), c.ServerQPN, c.REQFrame, c.PathTC, c.PathHop)
		var gs []string
		for _, g := range groups[c] {
			gs = append(gs, g.String())
		}
		findings = append(findings, f+": "+strings.Join(gs, "; "))
	}
	if len(unjudged) > 0 {
		notes = append(notes, "not judged: "+strings.Join(unjudged, ", "))
	}
	if len(strays) > 0 {
		notes = append(notes, fmt.Sprintf("%d RoCE packet(s) of no connection in the capture (first frame %d)", len(strays), strays[0]))
	}
	return problems, findings, notes
}
