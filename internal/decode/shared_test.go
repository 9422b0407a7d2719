package decode

import (
	"testing"

	"github.com/rxed/rxed/internal/testenv"
)

// sharedDir locates ../shared beside the repository root; see testenv.
func sharedDir(t testing.TB) string { return testenv.SharedDir(t) }
