package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "4K": 4096, "64M": 64 << 20, "1G": 1 << 30, "2GiB": 2 << 30, "1t": 1 << 40} {
		got, err := ParseBytes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "K", "-1", "1.5G", "lots", "99999999999T"} {
		_, err := ParseBytes(in)
		require.Error(t, err, in)
	}
}

// TestNewErrorsReleaseEverything: a failing New leaves nothing mapped or
// bound, so the same configuration works once the problem is fixed.
func TestNewErrorsReleaseEverything(t *testing.T) {
	dir := t.TempDir()
	ShmDir = dir
	good := filepath.Join(dir, "good.img")
	require.NoError(t, os.WriteFile(good, make([]byte, 8192), 0o644))
	specs := []ExportSpec{
		{Name: "a", Kind: ExportFile, Path: good},
		{Name: "s", Kind: ExportShm, Path: "obj", Size: 4096},
		{Name: "b", Kind: ExportFile, Path: filepath.Join(dir, "missing.img")},
	}
	_, err := New(Config{Addrs: addrs(t, "127.0.3.253"), Port: 4791, Exports: specs})
	require.ErrorContains(t, err, "export b: file")
	require.ErrorContains(t, err, "does not exist")
	fi, err := os.Stat(filepath.Join(dir, "obj"))
	require.NoError(t, err, "shm object created")
	require.Equal(t, int64(4096), fi.Size())

	_, err = New(Config{Addrs: addrs(t, "127.0.3.253"), Exports: specs[:1], PerftestExport: "zz"})
	require.ErrorContains(t, err, `"zz"`)
	_, err = New(Config{Addrs: addrs(t, "127.0.3.253"), Exports: []ExportSpec{specs[0], specs[0]}})
	require.ErrorContains(t, err, "twice")

	d, err := New(Config{Addrs: addrs(t, "127.0.3.253"), Exports: specs[:2], MetricsAddr: "127.0.0.1:0"})
	require.NoError(t, err)
	m := d.Metrics()
	require.Contains(t, m, `rxed_export_bytes{export="a",kind="file"} 8192`)
	require.Contains(t, m, "# TYPE rxed_sessions_active gauge")
	require.True(t, strings.HasSuffix(m, "\n"))
	require.NoError(t, d.release())
}
