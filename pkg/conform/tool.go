package conform

import (
	"fmt"
	"strings"
)

// Tool is the peer's standard tool whose exchange the engine speaks.
type Tool string

// The tools the engine can play against.
const (
	IBWriteBW     Tool = "ib_write_bw"
	IBReadBW      Tool = "ib_read_bw"
	IBAtomicBW    Tool = "ib_atomic_bw"
	IBSendBW      Tool = "ib_send_bw"
	IBVRCPingpong Tool = "ibv_rc_pingpong"
	IBVUDPingpong Tool = "ibv_ud_pingpong"
)

// Tools lists every tool, in the order of the command line help.
var Tools = []Tool{IBWriteBW, IBReadBW, IBAtomicBW, IBSendBW, IBVRCPingpong, IBVUDPingpong}

// ParseTool accepts a tool name.
func ParseTool(s string) (Tool, error) {
	for _, t := range Tools {
		if string(t) == s {
			return t, nil
		}
	}
	names := make([]string, len(Tools))
	for i, t := range Tools {
		names[i] = string(t)
	}
	return "", fmt.Errorf("unknown tool %q: want one of %s", s, strings.Join(names, ", "))
}

// Perftest reports whether the tool speaks perftest's exchange.
func (t Tool) Perftest() bool {
	switch t {
	case IBWriteBW, IBReadBW, IBAtomicBW, IBSendBW:
		return true
	}
	return false
}

// RDMA reports whether the tool advertises a buffer (rkey and address).
func (t Tool) RDMA() bool { return t == IBWriteBW || t == IBReadBW || t == IBAtomicBW }

// PostsReceives reports whether the tool's QP has receives posted (SENDs
// land), as opposed to RDMA tools whose server posts none.
func (t Tool) PostsReceives() bool {
	return t == IBSendBW || t == IBVRCPingpong || t == IBVUDPingpong
}

// UD reports whether the tool's QP is unreliable datagram.
func (t Tool) UD() bool { return t == IBVUDPingpong }

// RC reports whether the tool's QP is reliable connected.
func (t Tool) RC() bool { return !t.UD() }

// Echoes reports whether the peer answers every message it receives with
// one of its own (the pingpong servers).
func (t Tool) Echoes() bool { return t == IBVRCPingpong || t == IBVUDPingpong }

// PeerCommand is how the peer's tool should be started for the suite, in
// responder (server) or requester (client of LOCAL) mode.
func (t Tool) PeerCommand(serve bool, local string, iters int) string {
	switch {
	case t.Perftest() && serve:
		return fmt.Sprintf("while :; do %s -n %d -s 4096 -m 1024 %s; sleep 0.1; done   (one client per scenario)", t, iters, local)
	case serve:
		return fmt.Sprintf("while :; do %s -n %d -s 4096 -m 1024 %s; sleep 0.1; done   (one client per scenario)", t, iters, local)
	case t.Perftest():
		return fmt.Sprintf("while :; do %s -n %d -m 1024; done", t, iters)
	case t == IBVRCPingpong:
		return fmt.Sprintf("while :; do %s -n %d -s 1024 -m 1024; done", t, iters)
	}
	return fmt.Sprintf("while :; do %s -n %d -s 512; done", t, iters)
}
