//go:build linux

package interop

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMatrixCellsAreWellFormed(t *testing.T) {
	cells := Matrix()
	seen := map[string]bool{}
	lastMTU := 0
	for _, c := range cells {
		require.False(t, seen[c.Name], "duplicate cell %s", c.Name)
		seen[c.Name] = true
		if c.CM != nil || c.Mcast != nil {
			continue // TestRdmaCMCellsAreWellFormed, TestMcastCellsInTheMatrix
		}
		tool, ok := Tools[c.Tool]
		require.True(t, ok, "%s: unknown tool %q", c.Name, c.Tool)
		require.Contains(t, []int{1024, 4096}, c.MTU, c.Name)
		require.GreaterOrEqual(t, c.MTU, lastMTU, "cells must be grouped by MTU (the link MTU switches once)")
		lastMTU = c.MTU
		require.Positive(t, c.Timeout, c.Name)
		require.Positive(t, c.Size, c.Name)
		if tool.Kind != Pingpong {
			require.GreaterOrEqual(t, c.Iters, 5, "%s: perftest needs at least 5 iterations", c.Name)
		}
		if c.Tool == "ud_pingpong" || strings.Contains(c.Args, "-c UD") {
			require.LessOrEqual(t, c.Size, c.MTU, "%s: a UD message must fit the MTU", c.Name)
		}
		// at most a few MiB per run: TCG moves ~20 MiB/s; the 1% loss cells and their clean
		// twins move more, so that one run's ratio means something
		limit := 8 << 20
		if strings.Contains(c.Name, "/clean/") || c.LossPct == 1 {
			limit = 32 << 20
		}
		require.LessOrEqual(t, c.Size*c.Iters, limit, c.Name)
		for _, tmpl := range []string{tool.Rxe, tool.Rxed} {
			cmd := Render(tmpl, c, Vars{Rxed: "/x/rxed", Addr: HostIP, GID: 1, Port: 20000, Counters: "/x/c.json"})
			require.NotContains(t, cmd, "{", "%s: unexpanded placeholder in %q", c.Name, cmd)
			require.Contains(t, cmd, "-p 20000", c.Name)
		}
		require.Contains(t, Render(tool.Rxed, c, Vars{Counters: "/x/c.json"}), "--counters-out /x/c.json", c.Name)
	}
}

// TestMatrixCoversTheIssue pins the coverage the interop issue asks for.
func TestMatrixCoversTheIssue(t *testing.T) {
	cells := Matrix()
	has := func(pred func(Cell) bool) bool {
		for _, c := range cells {
			if pred(c) {
				return true
			}
		}
		return false
	}
	for _, pp := range []string{"rc_pingpong", "uc_pingpong", "ud_pingpong"} {
		for _, mtu := range []int{1024, 4096} {
			var sizes []int
			for _, c := range cells {
				if c.Tool == pp && c.MTU == mtu && !c.IPv6 {
					sizes = append(sizes, c.Size)
				}
			}
			require.Contains(t, sizes, 1, "%s mtu %d", pp, mtu)
			if pp != "ud_pingpong" {
				require.Contains(t, sizes, 8192, "%s mtu %d", pp, mtu)
			}
		}
	}
	for _, want := range []struct{ tool, args string }{
		{"send_bw", "-c RC"}, {"send_bw", "-c UD"}, {"write_bw", "-c RC"}, {"write_bw", "-c UC"},
	} {
		require.True(t, has(func(c Cell) bool { return c.Tool == want.tool && c.Args == want.args && c.Size == 2 }), "%v 2B", want)
		if want.args != "-c UD" {
			require.True(t, has(func(c Cell) bool { return c.Tool == want.tool && c.Args == want.args && c.Size == 1<<20 }), "%v 1MiB", want)
		}
	}
	require.True(t, has(func(c Cell) bool { return c.Tool == "read_bw" && strings.Contains(c.Args+c.RxeArgs, "-o 8") }))
	require.True(t, has(func(c Cell) bool { return c.Tool == "atomic_bw" && strings.Contains(c.Args, "CMP_AND_SWAP") }))
	require.True(t, has(func(c Cell) bool { return c.Tool == "atomic_bw" && strings.Contains(c.Args, "FETCH_AND_ADD") }))
	for _, lat := range []string{"write_lat", "send_lat", "read_lat"} {
		require.True(t, has(func(c Cell) bool { return c.Tool == lat }), lat)
	}
	for _, v6 := range []string{"rc_pingpong", "write_bw"} {
		require.True(t, has(func(c Cell) bool { return c.Tool == v6 && c.IPv6 }), v6)
	}
	for _, lossy := range []string{"write_bw", "read_bw"} {
		for _, pct := range []float64{1, 5} { // issue 14's goal 7
			require.True(t, has(func(c Cell) bool { return c.Tool == lossy && c.LossPct == pct }), "%s at %v%%", lossy, pct)
		}
	}
	// every loss cell runs after its clean twin, with only its sibling loss cells between them,
	// and differs from it in nothing but the loss and the message count; at 1% the count is
	// the twin's and at least 400 (a shorter run's ratio spread over 0.39-0.66x)
	for i, c := range cells {
		if c.LossPct == 0 {
			require.Empty(t, c.Baseline, c.Name)
			continue
		}
		require.NotEmpty(t, c.Baseline, c.Name)
		j := i - 1
		for j >= 0 && cells[j].LossPct > 0 {
			require.Equal(t, c.Baseline, cells[j].Baseline, "%s after %s", c.Name, cells[j].Name)
			j--
		}
		require.GreaterOrEqual(t, j, 0, c.Name)
		twin := cells[j]
		require.Equal(t, c.Baseline, twin.Name, c.Name)
		require.NotEqual(t, c.Name, twin.Name)
		if c.LossPct == 1 {
			require.Equal(t, twin.Iters, c.Iters, c.Name)
			require.GreaterOrEqual(t, c.Iters, 400, c.Name)
		}
		twin.Name, twin.LossPct, twin.Baseline, twin.Timeout, twin.Iters = c.Name, c.LossPct, c.Baseline, c.Timeout, c.Iters
		require.Equal(t, c, twin, "the clean twin of %s", c.Name)
	}
}

func TestRender(t *testing.T) {
	c := Cell{Size: 4096, Iters: 20, MTU: 1024, Args: "-c UD  -x", RxeArgs: "-o 2"}
	require.Equal(t, "a 4096 20 1024 -c UD -x -o 2 fd78::1 3 20001 /c rxed",
		Render("a {size} {iters} {mtu} {args} {rxeargs} {addr} {gid} {port} {counters} {rxed}", c,
			Vars{Rxed: "rxed", Addr: HostIP6, GID: 3, Port: 20001, Counters: "/c"}))
	require.Equal(t, "x {unknown}", Render("x {unknown} {args}", Cell{}, Vars{}))
}

func TestSelect(t *testing.T) {
	cells := Matrix()
	require.Len(t, Select(cells, ""), len(cells))
	got := Select(cells, "loss,ipv6")
	// 4 loss cells (write_bw, read_bw at 1% and 5%) and their 2 clean twins, 3 IPv6
	// (rc_pingpong, write_bw, rdmacm/rping)
	var names []string
	for _, c := range got {
		names = append(names, c.Name)
		require.True(t, c.IPv6 || c.LossPct > 0 || strings.Contains(c.Name, "/clean/"), c.Name)
	}
	require.Len(t, got, 9, names)
	var wl []string
	for _, c := range Select(cells, "write_bw/loss") {
		wl = append(wl, c.Name)
	}
	require.Equal(t, []string{"write_bw/clean/65536B", "write_bw/loss1%/65536B", "write_bw/loss5%/65536B"}, wl)
	require.Equal(t, []string{"write_bw/clean/65536B", "write_bw/loss5%/65536B"},
		[]string{Select(cells, "write_bw/loss5")[0].Name, Select(cells, "write_bw/loss5")[1].Name})
	require.Len(t, Select(cells, "write_bw/clean"), 1) // a twin alone brings no loss cell
	require.Empty(t, Select(cells, "no-such-cell"))
}

func TestPingpongDest(t *testing.T) {
	d := PingpongDest{QPN: 0x123, PSN: 0xabcdef, GID: netip.AddrFrom16(netip.MustParseAddr("10.78.0.1").As16())}
	b := d.Marshal()
	require.Equal(t, "0000:000123:abcdef:00000000000000000000ffff0a4e0001\x00", string(b))
	require.Len(t, b, PingpongDestLen)
	got, err := ParsePingpongDest(b)
	require.NoError(t, err)
	require.Equal(t, d, got)
	// every truncation is rejected
	for i := range len(b) - 1 {
		_, err := ParsePingpongDest(b[:i])
		require.Error(t, err, "prefix %d", i)
	}
	for _, bad := range []string{
		"000g:000123:abcdef:00000000000000000000ffff0a4e0001",
		"0000:000123:abcdef:00000000000000000000ffff0a4e000z",
		"0000-000123:abcdef:00000000000000000000ffff0a4e0001",
	} {
		_, err := ParsePingpongDest([]byte(bad))
		require.Error(t, err, bad)
	}
}

func TestParseBTH(t *testing.T) {
	p := []byte{0x04, 0x40, 0xff, 0xff, 0x00, 0x00, 0x01, 0x23, 0x80, 0x29, 0x44, 0x2d, 1, 2, 3, 4}
	b, err := ParseBTH(p)
	require.NoError(t, err)
	require.Equal(t, BTHInfo{Opcode: 0x04, DestQPN: 0x123, PSN: 0x29442d, AckReq: true}, b)
	for i := range len(p) {
		_, err := ParseBTH(p[:i])
		require.ErrorIs(t, err, ErrShortBTH)
	}
}

func TestWriteReport(t *testing.T) {
	ok := Result{Cell: Cell{Name: "rc_pingpong/mtu1024/1B"}, Dir: SubjectServer, Pass: true, Metric: "1.00 Mbit/s, 10 µs/iter"}
	bad := Result{Cell: Cell{Name: "write_bw/RC/2B"}, Dir: SubjectClient, Problems: []string{"client: exit 1"},
		ServerCmd: "ib_write_bw -p 1", ClientCmd: "rxed perf write -p 1 10.78.0.11",
		ServerOut: "srv line\n", ClientOut: "cli line\nFailed to connect\n",
		PeerDelta: Counters{"sent_pkts": 3}, Subject: Counters{"drop_icrc": 2}, LogPrefix: "/logs/write_bw_RC_2B.cli"}
	var b bytes.Buffer
	WriteReport(&b, RunInfo{Subject: SubjectRxed, Accel: "tcg"}, []Result{ok, bad})
	s := b.String()
	require.Contains(t, s, "**1 passed, 1 failed**")
	require.Contains(t, s, "| rc_pingpong/mtu1024/1B | rxe→rxed (rxed server) | PASS | 1.00 Mbit/s, 10 µs/iter |  |")
	require.Contains(t, s, "| write_bw/RC/2B | rxed→rxe (rxed client) | **FAIL** |  | rxed -→-, rxe 3→- |")
	require.Contains(t, s, "### write_bw/RC/2B, rxed→rxe (rxed client)")
	require.Contains(t, s, "- client: exit 1")
	require.Contains(t, s, "Failed to connect")
	require.Contains(t, s, "guest rxe0 hw_counters delta: sent_pkts=3")
	require.Contains(t, s, "rxed counters: drop_icrc=2")
	require.Contains(t, s, "/logs/write_bw_RC_2B.cli.{server,client}.txt")

	b.Reset()
	WriteReport(&b, RunInfo{Subject: SubjectRxe}, []Result{ok})
	require.NotContains(t, b.String(), "## Failures")
	require.Contains(t, b.String(), "vm1→vm2 (vm2 server)")
}

func TestLossRatios(t *testing.T) {
	twin := Cell{Name: "write_bw/clean/65536B", Tool: "write_bw"}
	lossy := Cell{Name: "write_bw/loss2%/65536B", Tool: "write_bw", LossPct: 2, Baseline: twin.Name}
	rs := []Result{
		{Cell: twin, Dir: SubjectServer, Pass: true, BW: 16, Metric: "16.00 MiB/s"},
		{Cell: lossy, Dir: SubjectServer, Pass: true, BW: 4, Metric: "4.00 MiB/s"},
		{Cell: twin, Dir: SubjectClient, Pass: false, BW: 30, Metric: "30.00 MiB/s"}, // a failed twin is no baseline
		{Cell: lossy, Dir: SubjectClient, Pass: true, BW: 12, Metric: "12.00 MiB/s"},
		{Cell: twin, Dir: SubjectServer, Pass: true, BW: 16, Metric: "16.00 MiB/s"}, // the twin itself gets no ratio
	}
	LossRatios(rs)
	require.Equal(t, "16.00 MiB/s", rs[0].Metric)
	require.Equal(t, "4.00 MiB/s, 0.25x clean", rs[1].Metric) // the same direction's twin, not the other's
	require.Equal(t, "12.00 MiB/s", rs[3].Metric)
	require.Equal(t, "16.00 MiB/s", rs[4].Metric)

	// a failed loss cell, or one whose twin did not run (or printed no bandwidth), gets none
	failed := []Result{{Cell: twin, Pass: true, BW: 16, Metric: "a"}, {Cell: lossy, Pass: false, BW: 4, Metric: "b"}}
	LossRatios(failed)
	require.Equal(t, "b", failed[1].Metric)
	alone := []Result{{Cell: twin, Pass: true, Metric: "a"}, {Cell: lossy, Pass: true, BW: 4, Metric: "b"}}
	LossRatios(alone)
	require.Equal(t, "b", alone[1].Metric)
}
