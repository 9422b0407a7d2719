//go:build linux

package interop

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// testdata/rdmacm_{ucmatose,send_bw_R}.wire.txt are tshark's WireFields (-E occurrence=f) of
// the reference captures /work/shared/pcaps/rdmacm_ucmatose.pcap and rdmacm_send_bw_R.pcap:
// two rdma_rxe guests, no TOS set. testdata/tos104_* are the first runs of the TOS cells
// against the Debian guest's rdma_rxe (rxed the client): the wire captured on the guest's
// tap, and rxed's own --pcap of the write_bw_R run.

func TestParseWireReal(t *testing.T) {
	ps := ParseWire(readTestdata(t, "rdmacm_ucmatose.wire.txt"))
	require.Len(t, ps, 25)
	require.Equal(t, WirePacket{Frame: 1, Src: "10.77.0.12", Dst: "10.77.0.11", TOS: 0, TTL: 64, Opcode: 100, DestQP: 1,
		Attr: AttrREQ, Comm: [2]uint32{0x4faf495a, 0}, QPN: 0x2c, PathTC: 0, PathHop: 64}, ps[0])
	require.Equal(t, WirePacket{Frame: 2, Src: "10.77.0.11", Dst: "10.77.0.12", TTL: 64, Opcode: 100, DestQP: 1,
		Attr: AttrREP, Comm: [2]uint32{0x7d12326c, 0x4faf495a}, QPN: 0x2b, PathTC: -1, PathHop: -1}, ps[1])
	require.Equal(t, [2]uint32{0x4faf495a, 0x7d12326c}, ps[2].Comm, "RTU")
	require.Equal(t, WirePacket{Frame: 6, Src: "10.77.0.12", Dst: "10.77.0.11", TTL: 64, Opcode: opRCAck, DestQP: 0x2b,
		PathTC: -1, PathHop: -1}, ps[5])
	require.Equal(t, [2]uint32{0x7d12326c, 0x4faf495a}, ps[23].Comm, "the server's DREQ")
	require.Equal(t, [2]uint32{0x4faf495a, 0x7d12326c}, ps[24].Comm, "the client's DREP")

	cs := WireConns(ps)
	require.Len(t, cs, 1)
	require.Equal(t, WireConn{Client: "10.77.0.12", Server: "10.77.0.11", ClientComm: 0x4faf495a, ServerComm: 0x7d12326c,
		ClientQPN: 0x2c, ServerQPN: 0x2b, PathTC: 0, PathHop: 64, REQFrame: 1, REPFrame: 2}, *cs[0])
}

// The reference captures have no TOS: they pass with TOS 0 and fail with 0x68 on every kind
// of packet from both sides, each named once with its frame.
func TestCheckTOSReal(t *testing.T) {
	names := map[string]string{"10.77.0.12": "client", "10.77.0.11": "server"}
	ucma := ParseWire(readTestdata(t, "rdmacm_ucmatose.wire.txt"))
	p, f, n := CheckTOS(ucma, TOSWant{TOS: 0, TTL: 64, Conns: 1, Names: names})
	require.Empty(t, p)
	require.Empty(t, n)
	require.Len(t, f, 1)
	require.Contains(t, f[0], "connection 1 (test; client client QPN 0x2c, server server QPN 0x2b; REQ frame 1 primary path traffic class 0x00 hop limit 64)")
	require.Contains(t, f[0], "server data: 5x TOS 0x00 TTL 64 (first frame 4)")
	require.Contains(t, f[0], "client ACK: 5x TOS 0x00 TTL 64 (first frame 6)")
	require.Contains(t, f[0], "client data: 5x TOS 0x00 TTL 64 (first frame 14)")
	require.Contains(t, f[0], "server DREQ: 1x TOS 0x00 TTL 64 (first frame 24)")

	p, _, _ = CheckTOS(ucma, TOSWant{TOS: 0x68, TTL: 64, Conns: 1, Names: names})
	require.ElementsMatch(t, []string{
		"connection 1: client's REQ of frame 1 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: server's REP of frame 2 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: client's RTU of frame 3 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: server's data of frame 4 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: client's ACK of frame 6 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: client's data of frame 14 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: server's ACK of frame 19 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: server's DREQ of frame 24 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: client's DREP of frame 25 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
		"connection 1: client's REQ (frame 1) has primary traffic class 0x00, want 0x68",
	}, p)

	// perftest -R: the control connection first, then the test one
	sendR := ParseWire(readTestdata(t, "rdmacm_send_bw_R.wire.txt"))
	cs := WireConns(sendR)
	require.Len(t, cs, 2)
	require.Equal(t, []int{1, 24}, []int{cs[0].REQFrame, cs[1].REQFrame})
	p, f, n = CheckTOS(sendR, TOSWant{TOS: 0, TTL: 64, Control: 1, Conns: 2, Names: names})
	require.Empty(t, p)
	require.Empty(t, n)
	require.Len(t, f, 2)
	require.Contains(t, f[0], "connection 1 (control;")
	require.Contains(t, f[1], "connection 2 (test;")
	// a TOS on the test connection only: the control connection's packets are right at 0
	p, _, _ = CheckTOS(sendR, TOSWant{TOS: 0x68, TTL: 64, Control: 1, Conns: 2, Names: names})
	require.NotEmpty(t, p)
	for _, x := range p {
		require.True(t, strings.HasPrefix(x, "connection 2: "), x)
	}
	// three connections wanted, two there
	p, _, _ = CheckTOS(sendR, TOSWant{TOS: 0, TTL: 64, Control: 1, Conns: 3})
	require.Equal(t, []string{"2 connection(s) (REQs answered by a REP) in the capture, want 3"}, p)
}

// wireLine builds one line of tshark's WireFields output.
func wireLine(set map[int]string) string {
	f := make([]string, wfCount)
	for i, v := range set {
		f[i] = v
	}
	return strings.Join(f, "\t")
}

// tosFlow is a synthetic ucmatose-like connection between rxed (10.78.0.1, the client) and the
// guest (10.78.0.11): REQ, REP, RTU, a SEND and its ACK each way, DREQ from the server, DREP;
// tos and ttl give each frame's IP header.
func tosFlow(tos, ttl func(frame int) int) []string {
	const cli, srv = "10.78.0.1", "10.78.0.11"
	l := func(frame int, src, dst string, op int, dqp string, extra map[int]string) string {
		m := map[int]string{wfFrame: fmt.Sprint(frame), wfSrc4: src, wfDst4: dst, wfTOS4: fmt.Sprintf("0x%02x", tos(frame)),
			wfTTL4: fmt.Sprint(ttl(frame)), wfOpcode: fmt.Sprint(op), wfDestQP: dqp}
		for k, v := range extra {
			m[k] = v
		}
		return wireLine(m)
	}
	return []string{
		l(1, cli, srv, 100, "0x000001", map[int]string{wfAttr: "0x0010", wfREQComm: "0x11", wfREQQPN: "0x000012",
			wfREQTC: "0x68", wfREQHop: "0x40"}),
		l(2, srv, cli, 100, "0x000001", map[int]string{wfAttr: "0x0013", wfREPComm: "0x22", wfREPRemote: "0x11", wfREPQPN: "0x000012"}),
		l(3, cli, srv, 100, "0x000001", map[int]string{wfAttr: "0x0014", wfRTULocal: "0x11", wfRTURemote: "0x22"}),
		l(4, cli, srv, 4, "0x000012", nil), // the same QPN on both hosts: told apart by address
		l(5, srv, cli, opRCAck, "0x000012", nil),
		l(6, srv, cli, 4, "0x000012", nil),
		l(7, cli, srv, opRCAck, "0x000012", nil),
		l(8, srv, cli, 100, "0x000001", map[int]string{wfAttr: "0x0015", wfDREQLocal: "0x22", wfDREQRemote: "0x11"}),
		l(9, cli, srv, 100, "0x000001", map[int]string{wfAttr: "0x0016", wfDREPLocal: "0x11", wfDREPRemote: "0x22"}),
	}
}

func TestCheckTOS(t *testing.T) {
	const rxed, guest = "10.78.0.1", "10.78.0.11"
	names := map[string]string{rxed: "rxed", guest: "guest"}
	want := TOSWant{TOS: 0x68, TTL: 64, Conns: 1, Names: names}
	all := func(v int) func(int) int { return func(int) int { return v } }
	except := func(v int, frames map[int]int) func(int) int {
		return func(f int) int {
			if x, ok := frames[f]; ok {
				return x
			}
			return v
		}
	}
	for _, tc := range []struct {
		name      string
		lines     []string
		w         TOSWant
		problems  []string
		notes     []string
		findingIn string
	}{
		{name: "all at the TOS", lines: tosFlow(all(0x68), all(64)), w: want,
			findingIn: "guest ACK: 1x TOS 0x68 TTL 64 (first frame 5)"},
		{name: "the passive kernel's data and ACK at TOS 0",
			lines: tosFlow(except(0x68, map[int]int{5: 0, 6: 0}), all(64)), w: want,
			problems: []string{
				"connection 1: guest's ACK of frame 5 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
				"connection 1: guest's data of frame 6 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
			}},
		{name: "the REQ's hop limit taken for the TTL",
			lines: tosFlow(all(0x68), except(64, map[int]int{6: 1})), w: want,
			problems: []string{"connection 1: guest's data of frame 6 has TOS 0x68 TTL 1, want TOS 0x68 TTL 64"}},
		{name: "the passive side's REP and DREQ at TOS 0",
			lines: tosFlow(except(0x68, map[int]int{2: 0, 8: 0}), all(64)), w: want,
			problems: []string{
				"connection 1: guest's REP of frame 2 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
				"connection 1: guest's DREQ of frame 8 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64",
			}},
		{name: "rxed's capture: received frames are not judged",
			lines:     tosFlow(except(0x68, map[int]int{2: 0, 5: 0, 6: 0, 8: 0}), all(64)),
			w:         TOSWant{TOS: 0x68, TTL: 64, Conns: 1, Names: names, JudgeFrom: rxed},
			findingIn: "guest data: 1x TOS 0x00 TTL 64 (first frame 6)"},
		{name: "rxed's capture: what rxed sent is",
			lines:    tosFlow(except(0x68, map[int]int{7: 0}), all(64)),
			w:        TOSWant{TOS: 0x68, TTL: 64, Conns: 1, Names: names, JudgeFrom: rxed},
			problems: []string{"connection 1: rxed's ACK of frame 7 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64"}},
		{name: "no REP", lines: append(tosFlow(all(0x68), all(64))[:1], tosFlow(all(0x68), all(64))[3:]...), w: want,
			problems: []string{"the REQ of frame 1 got no REP"},
			notes:    []string{"5 RoCE packet(s) of no connection in the capture (first frame 4)"}},
		{name: "no ACK, no data from the server",
			lines: func() []string { l := tosFlow(all(0x68), all(64)); return append(l[:4], l[7:]...) }(), w: want,
			problems: []string{"connection 1: no data packet or ACK from guest in the capture", "connection 1: no ACK in the capture"}},
		{name: "an MRA is recorded, not judged",
			lines: append(tosFlow(all(0x68), all(64)), wireLine(map[int]string{wfFrame: "10", wfSrc4: guest, wfDst4: rxed,
				wfTOS4: "0x00", wfTTL4: "64", wfOpcode: "100", wfDestQP: "0x000001", wfAttr: "0x0011"})), w: want,
			notes: []string{"not judged: guest MRA TOS 0x00 TTL 64 (frame 10)"}},
		{name: "nothing at all", w: want, problems: []string{"0 connection(s) (REQs answered by a REP) in the capture, want 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, f, n := CheckTOS(ParseWire(strings.Join(tc.lines, "\n")), tc.w)
			require.Equal(t, tc.problems, p)
			require.Equal(t, tc.notes, n)
			if tc.findingIn != "" {
				require.Len(t, f, 1)
				require.Contains(t, f[0], tc.findingIn)
			}
		})
	}
}

// IPv6: the traffic class and hop limit columns, and tshark's header-line noise.
func TestParseWireIPv6(t *testing.T) {
	ps := ParseWire("Running as user \"root\"\n" + wireLine(map[int]string{wfFrame: "3", wfSrc6: "fd78::1", wfDst6: "fd78::11",
		wfTClass6: "0x00000068", wfHop6: "64", wfOpcode: "4", wfDestQP: "0x000012"}) + "\n\n")
	require.Equal(t, []WirePacket{{Frame: 3, Src: "fd78::1", Dst: "fd78::11", TOS: 0x68, TTL: 64, Opcode: 4, DestQP: 0x12,
		PathTC: -1, PathHop: -1}}, ps)
}

func TestTOSWantOf(t *testing.T) {
	var cm, perf Cell
	for _, c := range tosCells() {
		if c.CM != nil {
			cm = c
		} else {
			perf = c
		}
	}
	require.Equal(t, TOSWant{TOS: 0x68, TTL: 64, Conns: 1}, TOSWantOf(cm))
	require.Equal(t, TOSWant{TOS: 0x68, TTL: 64, Control: 1, Conns: 2}, TOSWantOf(perf))
	require.True(t, IsRDMACMPerf(perf))
	// the TOS is the client's only: the servers must take it from the REQ
	require.Contains(t, cm.CM.RxeClient, "-t 104")
	require.Contains(t, cm.CM.RxedClient, "-t 104")
	require.NotContains(t, cm.CM.RxeServer+cm.CM.RxedServer, "-t ")
	require.Equal(t, "-T 104", perf.ClientArgs)
	require.NotContains(t, perf.Args, "-T")
}

// The kernel against rxed, TOS 104 set by rxed's client: every packet of the test connection
// carries TOS 0x68 TTL 64 both ways on the wire, the kernel's REP, DREQ/DREP and data/ACKs
// included; perftest -R's control connection stays at 0, and the REJ 8 that refused rxed's
// first test REQ (perftest's server was not listening yet) carries TOS 0.
func TestCheckTOSAgainstTheKernel(t *testing.T) {
	names := map[string]string{"10.78.0.1": "rxed", "10.78.0.11": "guest"}
	ucma := ParseWire(readTestdata(t, "tos104_ucmatose_rxed_client.wire.txt"))
	p, f, n := CheckTOS(ucma, TOSWant{TOS: 0x68, TTL: 64, Conns: 1, Names: names})
	require.Empty(t, p)
	require.Empty(t, n)
	require.Len(t, f, 1)
	for _, x := range []string{"guest REP: 1x TOS 0x68 TTL 64 (first frame 2)", "guest data: 10x TOS 0x68 TTL 64 (first frame 4)",
		"guest ACK: 10x TOS 0x68 TTL 64 (first frame 34)", "guest DREQ: 1x TOS 0x68 TTL 64 (first frame 44)"} {
		require.Contains(t, f[0], x)
	}

	wbw := ParseWire(readTestdata(t, "tos104_write_bw_R_rxed_client.wire.txt"))
	w := TOSWant{TOS: 0x68, TTL: 64, Control: 1, Conns: 2, Names: names}
	p, f, n = CheckTOS(wbw, w)
	require.Empty(t, p)
	require.Equal(t, []string{"not judged: guest REJ reason 8 TOS 0x00 TTL 64 (frame 25)"}, n)
	require.Len(t, f, 3)
	require.Contains(t, f[0], "connection 1 (control;")
	require.Contains(t, f[0], "guest REP: 1x TOS 0x00 TTL 64 (first frame 2)")
	require.Contains(t, f[1], "refused REQ of frame 24 (REJ frame 25 reason 8;")
	require.Contains(t, f[1], "rxed REQ: 1x TOS 0x68 TTL 64 (first frame 24)")
	require.Contains(t, f[2], "connection 2 (test;")
	require.Contains(t, f[2], "guest ACK: 50x TOS 0x68 TTL 64 (first frame 174)")
	require.Contains(t, f[2], "guest DREP: 1x TOS 0x68 TTL 64 (first frame 324)")

	// a refused REQ is judged with the TOS of the connection its client set up next
	bad := append([]WirePacket(nil), wbw...)
	for i := range bad {
		if bad[i].Frame == 24 {
			bad[i].TOS = 0
		}
	}
	p, _, _ = CheckTOS(bad, w)
	require.Equal(t, []string{"refused REQ of frame 24: rxed's REQ of frame 24 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64"}, p)

	// rxed's own capture: what rxed sent is right; the kernel's packets are recorded with TOS
	// 0 (rxed reports received TOS only while a UD QP exists), which JudgeFrom leaves alone
	own := ParseWire(readTestdata(t, "tos104_write_bw_R_rxed_client.rxedpcap.txt"))
	w.JudgeFrom = "10.78.0.1"
	p, f, _ = CheckTOS(own, w)
	require.Empty(t, p)
	require.Contains(t, f[2], "guest ACK: 50x TOS 0x00 TTL 64 (first frame 174)")
	w.JudgeFrom = ""
	p, _, _ = CheckTOS(own, w)
	require.Contains(t, p, "connection 2: guest's ACK of frame 174 has TOS 0x00 TTL 64, want TOS 0x68 TTL 64")
}
