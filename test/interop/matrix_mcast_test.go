//go:build linux

package interop

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/testenv"
)

// The mckey cells are well formed: both directions, the three-receiver
// group both ways, one sender each, and the expected lines are mckey's own
// from the capture logs.
func TestMcastCellsAreWellFormed(t *testing.T) {
	cells := McastCells()
	require.Len(t, cells, 4)
	names := map[string]bool{}
	for _, c := range cells {
		require.False(t, names[c.Name], "duplicate %s", c.Name)
		names[c.Name] = true
		senders := 0
		for _, m := range c.Mcast.Members {
			if m.Sender {
				senders++
				require.Contains(t, m.Cmd, " -s ")
			}
			require.Contains(t, m.Cmd, "-m {group}")
			require.Equal(t, m.Rxed, strings.HasPrefix(m.Cmd, "{rxed} mckey"))
		}
		require.Equal(t, 1, senders, c.Name)
		require.NotEmpty(t, c.Mcast.Receivers())
	}
	b, err := os.ReadFile(testenv.SharedPath(t, "pcaps", "logs", "rdmacm_mckey.server.txt"))
	require.NoError(t, err)
	for _, l := range cells[0].Mcast.ExpectReceiver {
		require.Contains(t, string(b), l+"\n")
	}
	b, err = os.ReadFile(testenv.SharedPath(t, "pcaps", "logs", "rdmacm_mckey.client.txt"))
	require.NoError(t, err)
	for _, l := range cells[0].Mcast.ExpectSender {
		require.Contains(t, string(b), l+"\n")
	}
}

// The mckey cells are in the matrix with their spec, run once (rxed only: the members name
// their roles), and every member's command renders without a placeholder left; rxed members
// get their own counters and capture, the guest's bind to the guest's address.
func TestMcastCellsInTheMatrix(t *testing.T) {
	n := 0
	for _, c := range Matrix() {
		if c.Mcast == nil {
			continue
		}
		n++
		require.Equal(t, "mckey", c.Tool, c.Name)
		require.True(t, c.Runs(SubjectRxed, SubjectServer), c.Name)
		require.False(t, c.Runs(SubjectRxed, SubjectClient), c.Name)
		require.False(t, c.Runs(SubjectRxe, SubjectServer), c.Name)
		for _, m := range c.Mcast.Members {
			v := McastVars{Addr: "10.78.0.11", Group: c.Mcast.Group}
			if m.Rxed {
				v = McastVars{Rxed: "/x/rxed", Addr: HostIP, Group: c.Mcast.Group, Counters: "/x/c.json", Pcap: "/x/p.pcap"}
			}
			cmd := RenderMcast(m.Cmd, v)
			require.NotContains(t, cmd, "{", "%s: %q", c.Name, cmd)
			require.Contains(t, cmd, "-m 239.1.1.1", c.Name)
			if m.Rxed {
				require.Contains(t, cmd, "--counters-out /x/c.json", c.Name)
				require.Contains(t, cmd, "--pcap /x/p.pcap", c.Name)
				require.Regexp(t, `-b 10\.78\.0\.[123] `, cmd, c.Name)
			} else {
				require.Contains(t, cmd, "-b 10.78.0.11", c.Name)
			}
		}
	}
	require.Equal(t, len(McastCells()), n)
}
