//go:build linux

package interop

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRdmaCMCellsAreWellFormed(t *testing.T) {
	var cm []Cell
	for _, c := range Matrix() {
		if c.CM != nil {
			cm = append(cm, c)
		}
	}
	require.NotEmpty(t, cm)
	for _, c := range cm {
		s := c.CM
		require.Equal(t, 1024, c.MTU, c.Name)
		require.Positive(t, c.Timeout, c.Name)
		require.NotEmpty(t, s.Steps, c.Name)
		require.Equal(t, s.Prog.String(), c.Tool, c.Name)
		v := CMVars{Rxed: "/x/rxed", Addr: HostIP, SrvAddr: "10.78.0.11", Port: 20000, Counters: "/x/c.json", Pcap: "/x/p.pcap"}
		for _, tmpl := range []string{s.RxeServer, s.RxeClient, s.RxedServer, s.RxedClient} {
			cmd := RenderCM(tmpl, v)
			require.NotContains(t, cmd, "{", "%s: unexpanded placeholder in %q", c.Name, cmd)
			if s.Port == 0 || strings.HasPrefix(cmd, "/x/rxed") {
				require.Contains(t, cmd, "-p 20000", c.Name)
			}
		}
		for _, tmpl := range []string{s.RxedServer, s.RxedClient} {
			cmd := RenderCM(tmpl, v)
			require.Contains(t, cmd, "--counters-out /x/c.json", c.Name)
			require.Contains(t, cmd, "--pcap /x/p.pcap", c.Name)
		}
		require.Contains(t, RenderCM(s.RxeClient, v), "10.78.0.11", "%s: the client names the server", c.Name)
		if s.Prog == Rping {
			// rxed's server must print its readiness line
			require.Contains(t, s.RxedServer, " -d", c.Name)
		}
	}
}

// TestRdmaCMMatrixCoversTheBrief pins the rdma_cm coverage: rping IPv4/IPv6/long/persistent,
// a REJ, ucmatose 1 and 8 connections, udaddy, and a DREQ from each role.
func TestRdmaCMMatrixCoversTheBrief(t *testing.T) {
	has := func(pred func(Cell) bool) bool {
		for _, c := range Matrix() {
			if c.CM != nil && pred(c) {
				return true
			}
		}
		return false
	}
	require.True(t, has(func(c Cell) bool { return c.CM.Prog == Rping && !c.IPv6 && c.CM.Pings == 10 && c.CM.ClientV }))
	require.True(t, has(func(c Cell) bool { return c.CM.Prog == Rping && c.IPv6 }))
	require.True(t, has(func(c Cell) bool { return c.CM.Prog == Rping && c.CM.Pings >= 500 }))
	require.True(t, has(func(c Cell) bool {
		return c.CM.Prog == Rping && c.CM.Persistent && len(c.CM.Steps) == 2 && strings.Contains(c.CM.RxeServer, "-P")
	}))
	require.True(t, has(func(c Cell) bool { return len(c.CM.Steps) > 0 && c.CM.Steps[0].WrongPort }))
	require.True(t, has(func(c Cell) bool { return c.CM.Prog == Ucmatose && c.CM.Conns == 1 }))
	require.True(t, has(func(c Cell) bool { return c.CM.Prog == Ucmatose && c.CM.Conns == 8 }))
	require.True(t, has(func(c Cell) bool { return c.CM.Prog == Udaddy }))
	for _, role := range []Role{Client, Server} {
		require.True(t, has(func(c Cell) bool { return c.CM.ExpectCM()[role][AttrDREQ] > 0 }), "a DREQ from the %s", role)
	}
}

func TestRenderCM(t *testing.T) {
	require.Equal(t, "r rping -c -a fd78::11 -I fd78::1 -p 7 --counters-out /c --pcap /p",
		RenderCM("{rxed} rping -c  -a {srvaddr} -I {addr} -p {port} --counters-out {counters} --pcap {pcap}",
			CMVars{Rxed: "r", Addr: "fd78::1", SrvAddr: "fd78::11", Port: 7, Counters: "/c", Pcap: "/p"}))
}
