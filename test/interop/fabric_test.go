//go:build linux

package interop

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every fabric cell's plan: command lines fully rendered, every rxed process on its own host's
// address, a fresh port per server, the guest in the roles the cell's name says.
func TestFabricPlans(t *testing.T) {
	r := &Runner{Lab: &Lab{VMs: []*VM{{Index: 1, IP: "10.78.0.11", GID4: 1}}}, Subject: SubjectRxed, Rxed: "/bin/rxed", LogDir: t.TempDir()}
	var hs []*FabricHost
	for i := 1; i <= FabricHosts; i++ {
		hs = append(hs, &FabricHost{Index: i, IP: fabricIP(i)})
	}
	require.Equal(t, "10.78.0.101", hs[0].IP)
	cells := FabricCells()
	require.Len(t, cells, 4)
	for _, c := range cells {
		pairs, mcast := r.fabricPlan(c, hs, r.LogDir+"/"+slug(c.Name))
		var runs []*fabricRun
		ports := map[int]bool{}
		guest := 0
		for _, p := range pairs {
			require.True(t, p.srv.server, c.Name)
			require.False(t, p.cli.server, c.Name)
			require.False(t, ports[p.srv.port], "%s: port %d twice", c.Name, p.srv.port)
			ports[p.srv.port] = true
			srvIP := "10.78.0.11"
			if p.srv.host != nil {
				srvIP = p.srv.host.IP
			}
			require.NotEqual(t, p.srv.host, p.cli.host, "%s: a pair on one host", c.Name)
			if c.Tool != "rping" {
				require.True(t, strings.HasSuffix(p.cli.cmdline, " "+srvIP), "%s: client %q to %s", c.Name, p.cli.cmdline, srvIP)
			} else {
				require.Contains(t, p.cli.cmdline, "-a "+srvIP, c.Name)
			}
			runs = append(runs, p.srv, p.cli)
		}
		runs = append(runs, mcast...)
		hosts := map[*FabricHost]bool{}
		for _, f := range runs {
			require.NotContains(t, f.cmdline, "{", "%s: %s", c.Name, f.cmdline)
			if f.host == nil {
				guest++
				require.NotContains(t, f.cmdline, "/bin/rxed", c.Name)
				require.Empty(t, f.counters)
				continue
			}
			require.False(t, hosts[f.host], "%s: two rxed processes on %s (one UDP 4791 each)", c.Name, f.host.IP)
			hosts[f.host] = true
			require.True(t, strings.HasPrefix(f.cmdline, "/bin/rxed "), f.cmdline)
			require.Contains(t, f.cmdline, " "+f.host.IP+" ", "%s: rxed not on its host's address: %s", c.Name, f.cmdline)
			require.Contains(t, f.cmdline, "--counters-out "+f.counters, c.Name)
		}
		require.Len(t, hosts, FabricHosts, "%s: every host takes part", c.Name)
		switch c.Tool {
		case "rc_pingpong":
			require.Equal(t, 3, guest, c.Name)
		case "mckey":
			require.Equal(t, 1, guest, c.Name)
			require.Len(t, mcast, FabricHosts+1)
			require.Contains(t, mcast[FabricHosts].cmdline, " -s ")
		default:
			require.Equal(t, 3, guest, c.Name)
		}
	}
	require.Len(t, Select(FabricCells(), "fabric/rping"), 1)
	require.Empty(t, Select(Matrix(), "fabric"), "the matrix has no fabric cells: RunFabric runs them")
}
