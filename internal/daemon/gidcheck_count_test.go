package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// rxed_sessions_refused_gid_total counts clients refused because the GID
// they announced is not theirs (docs/security.md, docs/tools.md): a
// perftest client's GID that is not its TCP address, two GIDs in one
// session, an rxed client's failed proof. Bug (suspected by the daemon
// task, session AG; confirmed for sessions, the counter counts no
// packets): it also counted a key announcing the all-zero GID (a
// malformed key, refused as such) and an rxed client that left before it
// sent its proof (nothing was refused), so the counter an operator
// watches for reflection attempts rose for broken and vanished clients.
func TestRefusedGIDCountsOnlyGIDRefusals(t *testing.T) {
	logs := newLogWatch()
	d, err := New(Config{Addrs: addrs(t, "127.0.3.234"), OOBAddr: "127.0.3.234:0", IdleTimeout: -1, QPTimeout: 8,
		Logger: slog.New(logs), Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 20}}})
	require.NoError(t, err)
	runDaemon(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := func(ext bool) *oob.Session {
		cfg := &oob.SessionConfig{Options: oob.Options{Timeout: 10 * time.Second}}
		if ext {
			cfg.Ext = &oob.ExtConfig{}
		}
		s, err := oob.DialPerftest(ctx, d.OOBAddr().String(), cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.CloseWithoutExchange() })
		_, err = s.Negotiate(ctx, 3)
		require.NoError(t, err)
		return s
	}

	// A key with the all-zero GID: refused as malformed, not as a GID
	// that is someone else's.
	s := client(false)
	_, err = s.HandShake(ctx, oob.Key{OutReads: 1, QPN: 0x42, PSN: 1, RKey: 1, VAddr: 0x1000})
	require.Error(t, err)
	logs.waitFor(t, "perftest session failed", 1)
	require.Zero(t, d.refusedGID.Load(), "a key with the all-zero GID counted as a GID refusal")

	// An rxed client announcing another address leaves before its proof.
	s = client(true)
	key := oob.Key{OutReads: 1, QPN: 0x43, PSN: 1, RKey: 1, VAddr: 0x1000, GID: netip.MustParseAddr("127.0.0.99").As16()}
	for range 3 { // its QP, the two barriers
		_, err := s.HandShake(ctx, key)
		require.NoError(t, err)
	}
	require.NoError(t, s.CloseWithoutExchange())
	logs.waitFor(t, "perftest session failed", 2)
	require.Zero(t, d.refusedGID.Load(), "a client that left before its proof counted as a GID refusal")

	// A perftest client announcing another address is refused: counted.
	s = client(false)
	_, err = s.HandShake(ctx, key)
	require.Error(t, err)
	logs.waitFor(t, "perftest session failed", 3)
	require.Equal(t, uint64(1), d.refusedGID.Load())
}
