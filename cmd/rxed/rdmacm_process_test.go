package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Issue 11 asks for two rxed processes connecting through the new tools
// over loopback, clean and with --fault loss: the other tool tests run
// both ends in this process (separate engines and sockets, one address
// space); here each end is a process of its own, so nothing but UDP and
// the CM's MADs joins them.
func TestRdmacmToolsAsProcesses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault []string
	}{
		{"clean", nil},
		{"loss", []string{"--ack-timeout", "14", "--fault", "loss=0.05,seed=31"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := addrPair(t)
			srvArgs := append([]string{"rping", "-s", "-a", a, "-v", "-d", "-S", "200", "--timeout", "20s"}, tc.fault...)
			srv := startProcess(t, srvArgs...)
			deadline := time.Now().Add(20 * time.Second)
			for !strings.Contains(srv.stdout.String(), "rdma_listen") {
				require.Truef(t, time.Now().Before(deadline), "the rping server never listened:\n%s\n%s", srv.stdout, srv.stderr)
				time.Sleep(5 * time.Millisecond)
			}
			cliArgs := append([]string{"rping", "-c", "-a", a, "-I", b, "-C", "10", "-S", "200", "-V", "-v", "--timeout", "20s"}, tc.fault...)
			cli := startProcess(t, cliArgs...)
			cli.wait(t, 60*time.Second)
			srv.wait(t, 60*time.Second)
			require.Equalf(t, 0, cli.code, "client: %s\n%s", cli.stdout, cli.stderrOf(t))
			require.Equalf(t, 0, srv.code, "server: %s\n%s", srv.stdout, srv.stderrOf(t))
			require.Equal(t, rpingData("ping data: ", 10, 200), outLines(cli.stdout.String()))
			require.Equal(t, rpingData("server ping data: ", 10, 200), outLines(srv.stdout.String(), rpingDebug...))
		})
	}
}
