// Package testenv is what tests share about their environment: where the
// reference data (../shared beside the repository) is, and the one rule for
// a test that lacks something it needs: fail when CI=true, skip otherwise,
// with the same message either way.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// InCI reports whether the tests run under CI (CI=true), where anything a
// test needs must be present.
func InCI() bool { return os.Getenv("CI") == "true" }

// Need stops the test when ok is false: t.Fatal under CI, t.Skip elsewhere.
func Need(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg + " (skipping; with CI=true this fails)")
}

// RepoRoot returns the directory holding go.mod above the test's directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: go.mod not found above the test directory")
		}
		dir = parent
	}
}

// SharedDir returns ../shared beside the repository root: the reference
// captures and conformance corpus nobody here wrote. Its absence fails the
// test under CI and skips it elsewhere.
func SharedDir(t testing.TB) string {
	t.Helper()
	shared := filepath.Join(RepoRoot(t), "..", "shared")
	_, err := os.Stat(shared)
	Need(t, err == nil, "reference data %s missing: %v", shared, err)
	return shared
}

// SharedPath returns a path inside SharedDir, requiring it to exist.
func SharedPath(t testing.TB, elem ...string) string {
	t.Helper()
	p := filepath.Join(append([]string{SharedDir(t)}, elem...)...)
	_, err := os.Stat(p)
	Need(t, err == nil, "reference data %s missing: %v", p, err)
	return p
}

// ReturnsWithin runs f in a goroutine and reports whether it returned
// within d: a hang detector for a call that should return on an event
// (a device close whose linger the test's fake clock never ends), with d
// far above how long it takes, so a loaded machine does not fail it.
func ReturnsWithin(f func(), d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		f()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}
