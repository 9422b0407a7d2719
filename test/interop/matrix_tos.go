//go:build linux

package interop

import (
	"time"
)

// The TOS cells: the client of an rdma_cm connection sets an IP TOS (rdma_set_option
// RDMA_OPTION_ID_TOS: ucmatose -t, perftest -T with -R) and the harness checks, on the wire,
// what each side makes of it. What rxed does, from reading the kernel (docs/DESIGN.md, "TOS"):
//
//	(a) the passive side takes the REQ's primary path traffic class into its QP's AV
//	    (cm_req_handler, cm_format_paths_from_req), so its data packets and ACKs carry the
//	    active side's TOS;
//	(b) the hop limit stays the route's: TTL 64 both ways;
//	(c) a connection's CM MADs (REQ, REP, RTU, DREQ, DREP) carry its TOS (answers built from
//	    a received MAD, REJ, MRA, SIDR_REP, carry 0 over IPv4: recorded, not judged here).
//
// No reference capture has a TOS set, so only these cells check it against a real kernel. A
// run fails when the wire shows otherwise, and its notes keep what every side sent (frames
// and fields) whether it passes or not.
//
// Where the packets are read: the wire, captured by dumpcap on the peer guest's tap inside
// the lab's namespace (runner_tos.go), both directions; and rxed's own capture (--pcap), also
// whole, its recorder having the socket report received TOS and TTL (it recorded TOS 0 for
// every received RC frame until the first runs of these cells showed it).

// cellTOS is the TOS the TOS cells' clients set: DSCP 26 (AF31), ECN 0.
const cellTOS = 0x68

// tosCells are the TOS cells: ucmatose with the client's -t (rxe's ucmatose and rxed's
// cmatose), and ib_write_bw -R with the client's -T, both directions. The servers get no TOS:
// theirs must come from the REQ.
func tosCells() []Cell {
	flags := "-p {port} -c 1 -C 10 -S 100"
	return []Cell{
		{Name: "rdmacm/ucmatose/tos104", Tool: "ucmatose", Size: 100, Iters: 10, MTU: 1024, TOS: cellTOS,
			Timeout: 90 * time.Second, CM: &CMSpec{
				Prog:       Ucmatose,
				RxeServer:  "ucmatose -b {addr} " + flags,
				RxeClient:  "ucmatose -s {srvaddr} -b {addr} -t 104 " + flags,
				RxedServer: "{rxed} cmatose -b {addr} " + flags + " " + cmRxedFlags,
				RxedClient: "{rxed} cmatose -s {srvaddr} -b {addr} -t 104 " + flags + " " + cmRxedFlags,
				Steps:      []CMStep{{}}, Conns: 1, Msgs: 10, Size: 100,
			}},
		// one control connection (TOS 0, perftest's DEF_TOS) and one test connection
		{Name: "write_bw_R/tos104/4096B", Tool: "write_bw", Size: 4096, Iters: 50, MTU: 1024, Args: "-R",
			ClientArgs: "-T 104", TOS: cellTOS, Timeout: 90 * time.Second},
	}
}

// TOSWantOf is what a TOS cell's capture must show: its TOS on every test connection, TTL 64
// (the route's), and for perftest -R a first connection, the control one, with TOS 0.
func TOSWantOf(c Cell) TOSWant {
	w := TOSWant{TOS: c.TOS, TTL: 64, Conns: 1}
	if c.CM != nil {
		w.Conns = max(c.CM.Conns, 1)
	} else if IsRDMACMPerf(c) {
		w.Control, w.Conns = 1, 2
	}
	return w
}
