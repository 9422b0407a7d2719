//go:build linux

package main

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
)

// mckeyNetns makes a network namespace whose loopback carries multicast
// (the commands' UDP sockets must not send groups out of the host's real
// interfaces), deleted when the test ends.
func mckeyNetns(t *testing.T) *netns.NS {
	t.Helper()
	why := netns.Available()
	testenv.Need(t, why == "", "rxed mckey over UDP multicast: %s", why)
	ns, err := netns.Create(fmt.Sprintf("rxed-mckey-%d", os.Getpid()))
	require.NoError(t, err)
	t.Cleanup(func() { ns.Delete() })
	require.NoError(t, ns.LoopbackMulticast())
	return ns
}

// startIn runs rxed with args on a thread inside ns (the command opens its
// sockets from the calling goroutine, so they are the namespace's).
func startIn(ns *netns.NS, args ...string) (out, errOut *syncBuffer, done <-chan result) {
	out, errOut = newSyncBuffer(), newSyncBuffer()
	ch := make(chan result, 1)
	go func() {
		var code int
		if err := ns.Do(func() error { code = run(args, out, errOut); return nil }); err != nil {
			fmt.Fprintln(errOut, err)
			code = -1
		}
		ch <- result{code, out.String(), errOut.String()}
	}()
	return out, errOut, ch
}

// Two rxed mckey receivers and an rxed sender on one group over UDP
// multicast (three engines on 127.0.0.1-3, port 4791): both receive every
// message, and all three print what mckey printed in the capture's logs.
func TestMckeyTwoReceiversAndSender(t *testing.T) {
	ns := mckeyNetns(t)
	var outs []*syncBuffer
	var dones []<-chan result
	for _, b := range []string{"127.0.0.1", "127.0.0.2"} {
		out, _, done := startIn(ns, "mckey", "-m", "239.1.1.1", "-b", b, "-C", "5", "--pause", "0s", "--timeout", "20s")
		outs, dones = append(outs, out), append(dones, done)
	}
	for _, o := range outs {
		o.waitFor(t, "mckey: joined", 20*time.Second)
	}
	_, _, sdone := startIn(ns, "mckey", "-m", "239.1.1.1", "-s", "-b", "127.0.0.3", "-C", "5", "--pause", "0s", "--timeout", "20s")
	cli := await(t, sdone, 60*time.Second)
	requireOK(t, "sender", cli)
	require.Equal(t, toolLog(t, "rdmacm_mckey.client.txt"), outLines(cli.stdout))
	for i, d := range dones {
		srv := await(t, d, 60*time.Second)
		requireOK(t, fmt.Sprintf("receiver %d", i), srv)
		require.Equal(t, toolLog(t, "rdmacm_mckey.server.txt"), outLines(srv.stdout))
	}
}

// A receiver whose group never gets its messages gives up after
// --timeout with a one-line error and exit status 1; bad flags exit 2.
func TestMckeyErrors(t *testing.T) {
	ns := mckeyNetns(t)
	_, _, done := startIn(ns, "mckey", "-m", "239.1.1.2", "-b", "127.0.0.1", "-C", "2", "--pause", "0s", "--timeout", "300ms")
	r := await(t, done, 30*time.Second)
	require.Equal(t, 1, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Equal(t, "rxed mckey: 0 of 2 completions after 300ms (--timeout)\n", r.stderr)

	for _, args := range [][]string{
		{"mckey", "-b", "127.0.0.1"},
		{"mckey", "-m", "10.0.0.1", "-b", "127.0.0.1"},
		{"mckey", "-m", "239.1.1.1", "-b", "127.0.0.1", "-S", "5000"},
		{"mckey", "-m", "239.1.1.1", "-b", "127.0.0.1", "-p", "x"},
		{"mckey", "-m", "239.1.1.1"},
	} {
		r := runCmd(args...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "rxed mckey: ")
	}
	_, _, done = startIn(ns, "mckey", "-m", "239.1.1.1", "-b", "127.0.0.1", "-p", "0x0002", "--pause", "0s")
	r = await(t, done, 30*time.Second)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "failure joining")
}
