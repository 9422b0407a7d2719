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
