//go:build !amd64 || purego

package wire

import "testing"

// forEachFoldMode runs f once: there is no vector pass on this platform.
func forEachFoldMode(t *testing.T, f func(t *testing.T)) { t.Run("tables", f) }
