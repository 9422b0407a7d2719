//go:build linux

package interop

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The testdata/rdmacm_* files are real rdmacm-utils runs between two rdma_rxe guests
// (/work/shared/pcaps/logs) and tshark's fields of their captures.

func TestParseRpingPingsReal(t *testing.T) {
	cli := ParseRpingPings(readTestdata(t, "rdmacm_rping_v4.client.txt"), false)
	require.Len(t, cli, 3)
	require.Equal(t, RpingPing{Index: 0, Data: "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"}, cli[0])
	require.Empty(t, CheckRpingPings("client", cli, 1, 3, 64))

	// the server's stderr lines come first in this log (stdout was a full-buffered pipe)
	srv := ParseRpingPings(readTestdata(t, "rdmacm_rping_v4.server.txt"), true)
	require.Len(t, srv, 3)
	require.Empty(t, CheckRpingPings("server", srv, 1, 3, 64))
	// the client's parser does not take the server's lines, nor the other way round
	require.Empty(t, ParseRpingPings(readTestdata(t, "rdmacm_rping_v4.server.txt"), false))
	require.Empty(t, ParseRpingPings(readTestdata(t, "rdmacm_rping_v4.client.txt"), true))
}

func TestRpingData(t *testing.T) {
	require.Equal(t, "rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst", RpingData(2, 64))
	require.Len(t, RpingData(7, 64), 63)
	// the start character wraps after 'z' (58 characters 'A'..'z')
	require.True(t, strings.HasPrefix(RpingData(58, 64), "rdma-ping-58: ABC"), RpingData(58, 64))
	require.True(t, strings.HasPrefix(RpingData(57, 64), "rdma-ping-57: zABC"), RpingData(57, 64))
	// and within a ping
	require.Contains(t, RpingData(0, 200), "xyzABC")
	// shorter than the prefix: cut at size-1
	require.Equal(t, "rdma-ping-1", RpingData(1, 12))
}

func TestCheckRpingPingsFindsProblems(t *testing.T) {
	good := []RpingPing{{0, RpingData(0, 64)}, {1, RpingData(1, 64)}}
	require.Empty(t, CheckRpingPings("c", good, 1, 2, 64))
	require.NotEmpty(t, CheckRpingPings("c", good[:1], 1, 2, 64), "a missing ping")
	require.NotEmpty(t, CheckRpingPings("c", []RpingPing{good[0], good[0]}, 1, 2, 64), "ping 0 twice, ping 1 never")
	bad := []RpingPing{good[0], {1, strings.Replace(RpingData(1, 64), "K", "k", 1)}}
	p := CheckRpingPings("c", bad, 1, 2, 64)
	require.Len(t, p, 1)
	require.Contains(t, p[0], "ping 1")
	// two clients in a row against one server
	require.Empty(t, CheckRpingPings("s", append(good, good...), 2, 2, 64))
	require.NotEmpty(t, CheckRpingPings("s", good, 2, 2, 64))
}

func TestParseReturnStatusAndLines(t *testing.T) {
	for _, tc := range []struct {
		file  string
		lines []string
	}{
		{"rdmacm_ucmatose.server.txt", CmatoseServerLines},
		{"rdmacm_ucmatose_3conn.server.txt", CmatoseServerLines},
		{"rdmacm_ucmatose.client.txt", CmatoseClientLines},
		{"rdmacm_udaddy.server.txt", UdaddyServerLines},
		{"rdmacm_udaddy.client.txt", UdaddyClientLines},
	} {
		out := readTestdata(t, tc.file)
		st, ok := ParseReturnStatus(out)
		require.True(t, ok, tc.file)
		require.Zero(t, st, tc.file)
		require.Empty(t, MissingLines(out, tc.lines), tc.file)
	}
	// the server's lines are not the client's
	require.Equal(t, "cmatose: starting server", MissingLines(readTestdata(t, "rdmacm_ucmatose.client.txt"), CmatoseServerLines))
	// order matters
	require.Equal(t, "b", MissingLines("b\na\n", []string{"a", "b"}))
	_, ok := ParseReturnStatus("cmatose: starting server\n")
	require.False(t, ok)
	st, ok := ParseReturnStatus("test complete\nreturn status -1\n")
	require.True(t, ok)
	require.Equal(t, -1, st)
}

func TestReportsReject8(t *testing.T) {
	require.True(t, ReportsReject8(readTestdata(t, "rdmacm_rej_no_listener.client.txt")))
	require.True(t, ReportsReject8("rxed rping: connect 10.78.0.11:20001: rejected: invalid service ID (8)\n"))
	require.True(t, ReportsReject8("cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8\n"))
	require.False(t, ReportsReject8("cma event RDMA_CM_EVENT_REJECTED, error 28\n"))
	require.False(t, ReportsReject8("rxed rping: connect 10.78.0.11:20001: rejected: consumer reject (28)\n"))
	require.False(t, ReportsReject8(readTestdata(t, "rdmacm_rping_v4.client.txt")))
}

func TestParseCMFlowReal(t *testing.T) {
	rej := ParseCMFlow(readTestdata(t, "rdmacm_rej_no_listener.tshark.txt"))
	require.Equal(t, []CMMsg{{From: "10.77.0.12", Attr: AttrREQ}, {From: "10.77.0.11", Attr: AttrREJ, Reason: 8}}, rej)

	// the expectations of the cells are what the real tools do
	for _, tc := range []struct {
		file string
		spec *CMSpec
	}{
		{"rdmacm_rping_v4.tshark.txt", &CMSpec{Prog: Rping, Steps: []CMStep{{}}}},
		{"rdmacm_ucmatose_3conn.tshark.txt", &CMSpec{Prog: Ucmatose, Conns: 3, Steps: []CMStep{{}}}},
		{"rdmacm_udaddy.tshark.txt", &CMSpec{Prog: Udaddy, Steps: []CMStep{{}}}},
		{"rdmacm_rej_no_listener.tshark.txt", &CMSpec{Prog: Rping, Steps: []CMStep{{WrongPort: true}}}},
	} {
		flow := ParseCMFlow(readTestdata(t, tc.file))
		want := tc.spec.ExpectCM()
		for role, addr := range map[Role]string{Server: "10.77.0.11", Client: "10.77.0.12"} {
			p, n := CompareCM(role.String(), CountFrom(flow, addr), want[role])
			require.Empty(t, p, "%s %s", tc.file, role)
			require.Empty(t, n, "%s %s", tc.file, role)
		}
	}
	// rping: the client sends the DREQ; ucmatose: the server
	require.Equal(t, 1, (&CMSpec{Prog: Rping, Steps: []CMStep{{}}}).ExpectCM()[Client][AttrDREQ])
	require.Equal(t, 8, (&CMSpec{Prog: Ucmatose, Conns: 8, Steps: []CMStep{{}}}).ExpectCM()[Server][AttrDREQ])

	// IPv6 sources, tshark noise
	v6 := ParseCMFlow("Running as user \"root\"\n\tfd78::11\t0x0015\t\nbad line\n")
	require.Equal(t, []CMMsg{{From: "fd78::11", Attr: AttrDREQ}}, v6)
}

func TestCompareCM(t *testing.T) {
	want := CMCount{AttrREQ: 1, AttrRTU: 1, AttrDREQ: 1}
	p, n := CompareCM("x", CMCount{AttrREQ: 1, AttrRTU: 1, AttrDREQ: 1}, want)
	require.Empty(t, p)
	require.Empty(t, n)
	p, _ = CompareCM("x", CMCount{AttrREQ: 1, AttrRTU: 1}, want)
	require.Equal(t, []string{"x sent req=1 rtu=1, want req=1 rtu=1 dreq=1"}, p)
	// a retransmitted REQ is a note, an unexpected REJ a problem
	p, n = CompareCM("x", CMCount{AttrREQ: 2, AttrRTU: 1, AttrDREQ: 1}, want)
	require.Empty(t, p)
	require.Equal(t, []string{"x sent 1 extra req (retransmitted)"}, n)
	p, _ = CompareCM("x", CMCount{AttrREQ: 1, AttrRTU: 1, AttrDREQ: 1, AttrREJ: 1}, want)
	require.Len(t, p, 1)
}

func TestGuestCMCounters(t *testing.T) {
	before := ParseHWCounters("cm_tx_msgs/req:4\ncm_tx_retries/req:1\ncm_rx_msgs/rep:2\ncm_rx_duplicates/rep:0\n")
	after := ParseHWCounters("cm_tx_msgs/req:7\ncm_tx_retries/req:2\ncm_rx_msgs/rep:4\ncm_rx_duplicates/rep:1\n")
	sent, retries := GuestCMSent(Delta(before, after))
	require.Equal(t, 2, sent[AttrREQ])
	require.Equal(t, 1, retries[AttrREQ])
	rcvd, dups := GuestCMReceived(Delta(before, after))
	require.Equal(t, 1, rcvd[AttrREP])
	require.Equal(t, 1, dups[AttrREP])
	require.Equal(t, "req=2", sent.String())
}
