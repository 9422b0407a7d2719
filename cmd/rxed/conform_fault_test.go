package main

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/conform"
)

// TestConformDetectsFaultyPeer shows scenarios can FAIL: an rxed peer
// whose engine drops everything it sends (--fault loss=1,dir=send) never
// acknowledges, so the ACK, NAK and keeps-serving checks must FAIL.
func TestConformDetectsFaultyPeer(t *testing.T) {
	t.Parallel()
	ids := []string{"R-ACK-WRITE", "R-ACK-COALESCE", "R-SEQ-NAK", "R-RKEY-WRITE", "R-OPSEQ-WMIDDLE", "D-ICRC", "D-PKEY", "R-PSN-WRAP"}
	res := conformAgainst(t, conform.IBWriteBW, "^("+strings.Join(ids, "|")+")$", conform.Config{Timeout: 5 * time.Second},
		"perf", "write", "--fault", "loss=1,dir=send")
	for _, id := range ids {
		r, ok := res[id]
		require.Truef(t, ok, "%s did not run", id)
		require.Equalf(t, conform.Fail, r.Verdict, "%s against a mute peer: %s %s", id, r.Verdict, r.Evidence)
		require.NotEmpty(t, r.Evidence)
	}
}

// TestConformBadPeers: a peer running another tool, a peer that vanishes
// mid-exchange, a wrong exchange version and no peer at all are each
// reported per scenario as ERROR, within the deadline, never a hang.
func TestConformBadPeers(t *testing.T) {
	t.Parallel()
	one := func(t *testing.T, cfg conform.Config, id string) conform.Result {
		s, err := conform.Lookup(id)
		require.NoError(t, err)
		start := time.Now()
		r := conform.Run(context.Background(), cfg, s)
		require.Less(t, time.Since(start), cfg.Timeout+9*time.Second, "scenario outlived its deadline")
		return r
	}
	t.Run("wrong tool", func(t *testing.T) {
		res := conformAgainst(t, conform.IBSendBW, "^R-ACK-SEND$", conform.Config{Timeout: 3 * time.Second}, "perf", "write")
		r := res["R-ACK-SEND"]
		require.Equal(t, conform.Error, r.Verdict, r.Evidence)
		require.Contains(t, r.Evidence, "not an ib_send_bw server")
	})
	fake := func(t *testing.T, serve func(c net.Conn)) conform.Config {
		a, b := addrPair(t)
		peer := tcpPeer(t, b, serve)
		return conform.Config{Tool: conform.IBWriteBW, Local: netip.MustParseAddr(a), Peer: netip.MustParseAddr(b),
			OOBPort: uint16(peer.Port), Timeout: 2 * time.Second}
	}
	t.Run("old version", func(t *testing.T) {
		cfg := fake(t, func(c net.Conn) {
			buf := make([]byte, 16)
			_, _ = c.Read(buf)
			v := make([]byte, 16)
			copy(v, "5.00")
			_, _ = c.Write(v)
			_, _ = c.Read(buf)
		})
		r := one(t, cfg, "R-ACK-WRITE")
		require.Equal(t, conform.Error, r.Verdict, r.Evidence)
		require.Contains(t, r.Evidence, "5.00")
	})
	t.Run("vanishes", func(t *testing.T) {
		cfg := fake(t, func(c net.Conn) {
			buf := make([]byte, 16)
			_, _ = c.Read(buf)
			_, _ = c.Write(buf[:8]) // half a version, then gone
		})
		r := one(t, cfg, "R-SEQ-NAK")
		require.Equal(t, conform.Error, r.Verdict, r.Evidence)
		require.Contains(t, r.Evidence, "setup:")
	})
	t.Run("silent", func(t *testing.T) {
		cfg := fake(t, func(c net.Conn) { time.Sleep(5 * time.Second) })
		r := one(t, cfg, "D-ICRC")
		require.Equal(t, conform.Error, r.Verdict, r.Evidence)
	})
	t.Run("nobody", func(t *testing.T) {
		a, b := addrPair(t)
		cfg := conform.Config{Tool: conform.IBVRCPingpong, Local: netip.MustParseAddr(a), Peer: netip.MustParseAddr(b),
			OOBPort: uint16(mustAtoi(t, reservePort(t))), Timeout: time.Second}
		r := one(t, cfg, "R-ACK-SEND")
		require.Equal(t, conform.Error, r.Verdict, r.Evidence)
	})
}

// TestConformCommand runs the subcommand: table, -json, --pcap-dir files
// rxed decode reads, --report, -v, --list, bad flags.
func TestConformCommand(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	serverLoop(t, "perf", "write", "--addr", b, "-p", port)
	dir := t.TempDir()
	report := tempPath(t, "r.html")
	r := runCmd("conform", "--addr", a, "--tool", "ib_write_bw", "-p", port, "--timeout", "5s", "-run", "^(R-ACK-WRITE|R-SEQ-NAK|R-ACK-SEND)$",
		"--pcap-dir", dir, "--report", report, "-v", b)
	requireOK(t, "conform", r)
	require.Contains(t, r.stdout, "R-ACK-WRITE")
	require.Contains(t, r.stdout, "PASS")
	require.Contains(t, r.stdout, "SKIP") // R-ACK-SEND needs a send tool
	require.Contains(t, r.stdout, "|<-- RC_ACKNOWLEDGE")
	d := runCmd("decode", dir+"/R-SEQ-NAK.pcap")
	requireOK(t, "decode", d)
	require.Contains(t, d.stdout, "PSN_SEQ")
	html := readFile(t, report)
	require.Contains(t, html, "<svg")
	require.NotContains(t, html, "http://cdn")
	j := runCmd("conform", "--addr", a, "--tool", "ib_write_bw", "-p", port, "--timeout", "5s", "-run", "^R-ACK-WRITE$", "-json", b)
	requireOK(t, "conform -json", j)
	require.Contains(t, j.stdout, `"verdict":"PASS"`)

	l := runCmd("conform", "--list")
	requireOK(t, "conform --list", l)
	require.GreaterOrEqual(t, strings.Count(l.stdout, "  rule: "), 40)
	for _, bad := range [][]string{
		{"conform", "--addr", a, b},
		{"conform", "--addr", a, "--tool", "ib_nope", b},
		{"conform", "--addr", a, "--tool", "ib_write_bw"},
		{"conform", "--addr", a, "--tool", "ib_write_bw", "-run", "(", b},
		{"conform", "--addr", a, "--tool", "ib_write_bw", "--serve", b},
	} {
		r := runCmd(bad...)
		require.Equalf(t, 2, r.code, "%v: %s", bad, r.stderr)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}
