//go:build linux

package interop

import (
	"fmt"
	"time"
)

// This file holds the UD multicast cells: librdmacm's mckey (rdmacm-utils) against rxed
// mckey. A multicast cell has no rdma_cm connection: every member joins the group (IGMP from
// the guest's kernel rdma_cm, from rxed's group socket) and the sender's SEND_ONLY_IMMs to
// the group address (QP 0xFFFFFF, Q_Key 0x01234567) reach every receiver. The receivers must
// have joined before the sender starts: both tools print "mckey: joined" once joined, which is
// the ready line, and the sender's own pause (mckey's sleep(3), rxed's --pause) covers the
// guest's IGMP report reaching the bridge.
//
// Running them needs a case in the runner (see /work/helpers/mcast-needs.md): start every
// receiver of McastSpec.Receivers, wait for each one's Ready line, run the sender, then wait
// for the receivers; judge each side by Expect (the lines mckey printed in
// ../shared/pcaps/logs/rdmacm_mckey.*.txt) and exit status 0, and rxed's capture by its
// UD SEND_ONLY_IMM packets to the group with destination QP 0xFFFFFF.

// McastMember is one mckey process of a multicast cell.
type McastMember struct {
	Rxed   bool   // rxed mckey (else the guest's mckey)
	Sender bool   // -s
	Cmd    string // the command template ({rxed}, {addr}, {group}, {counters}, {pcap})
}

// McastSpec is a multicast cell: the members, receivers first.
type McastSpec struct {
	Group   string // the IPv4 group address
	Msgs    int    // -C
	Size    int    // -S
	Members []McastMember
	// Ready is the line a receiver prints once it has joined.
	Ready string
	// Expect are the lines each role prints, as mckey prints them.
	ExpectReceiver, ExpectSender []string
}

// Receivers returns the receiving members.
func (s *McastSpec) Receivers() []McastMember {
	var r []McastMember
	for _, m := range s.Members {
		if !m.Sender {
			r = append(r, m)
		}
	}
	return r
}

// McastCell is a multicast cell: a Cell (name, tool "mckey", size, count, timeout) and its
// members. Until Cell gets a Mcast field (matrix.go), the spec travels beside it.
type McastCell struct {
	Cell
	Mcast *McastSpec
}

// McastCells returns the mckey cells: an rxe sender to an rxed receiver, an rxed sender to an
// rxe receiver (both directions), and two rxed receivers plus an rxe receiver on one group
// with an rxe sender, and the same with an rxed sender. The rxed commands of one host share
// UDP 4791 on the group socket (SO_REUSEADDR), so two rxed receivers may run on one host
// with two addresses ({addr} and {addr2}).
func McastCells() []McastCell {
	const group, msgs, size = "239.1.1.1", 5, 100
	flags := fmt.Sprintf("-m {group} -C %d -S %d", msgs, size)
	rxe := func(sender bool) McastMember {
		c := "mckey " + flags + " -b {addr}"
		if sender {
			c = "mckey " + flags + " -s -b {addr}"
		}
		return McastMember{Sender: sender, Cmd: c}
	}
	rxed := func(sender bool, addr string) McastMember {
		c := "{rxed} mckey " + flags + " -b " + addr + " --pause 1s --timeout 60s --counters-out {counters} --pcap {pcap}"
		if sender {
			c = "{rxed} mckey " + flags + " -s -b " + addr + " --pause 3s --timeout 60s --counters-out {counters} --pcap {pcap}"
		}
		return McastMember{Rxed: true, Sender: sender, Cmd: c}
	}
	spec := func(members ...McastMember) *McastSpec {
		return &McastSpec{Group: group, Msgs: msgs, Size: size, Members: members, Ready: "mckey: joined",
			ExpectReceiver: []string{"mckey: starting server", "mckey: joining",
				"mckey: joined dgid: ::ffff:" + group + " mlid 0x0 sl 0", "receiving data transfers",
				"data transfers complete", "test complete", "return status 0"},
			ExpectSender: []string{"mckey: starting client", "mckey: joining",
				"mckey: joined dgid: ::ffff:" + group + " mlid 0x0 sl 0", "initiating data transfers",
				"data transfers complete", "test complete", "return status 0"}}
	}
	cell := func(name string, s *McastSpec) McastCell {
		return McastCell{Cell{Name: name, Tool: "mckey", Size: size, Iters: msgs, MTU: 1024, Timeout: 90 * time.Second}, s}
	}
	return []McastCell{
		cell("mcast/mckey/rxe-to-rxed", spec(rxed(false, "{addr}"), rxe(true))),
		cell("mcast/mckey/rxed-to-rxe", spec(rxe(false), rxed(true, "{addr}"))),
		cell("mcast/mckey/rxe-to-2rxed+rxe", spec(rxed(false, "{addr}"), rxed(false, "{addr2}"), rxe(false), rxe(true))),
		cell("mcast/mckey/rxed-to-2rxed+rxe", spec(rxed(false, "{addr}"), rxed(false, "{addr2}"), rxe(false), rxed(true, "{addr3}"))),
	}
}
