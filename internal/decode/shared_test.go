package decode

import (
	"os"
	"path/filepath"
	"testing"
)

// sharedDir locates ../shared next to the repository root (the directory
// holding go.mod). Without it the reference-data tests cannot run: that is
// a failure in CI and a skip elsewhere.
func sharedDir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
	shared := filepath.Join(dir, "..", "shared")
	if _, err := os.Stat(shared); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("reference data %s missing: %v", shared, err)
		}
		t.Skipf("reference data %s missing (%v): skipping (set CI=true to make this fatal)", shared, err)
	}
	return shared
}
