package conform

import (
	"regexp"
	"strings"
	"testing"
)

// TestRegistry checks every scenario is described and reachable by some
// tool, and that IDs are unique and selectable.
func TestRegistry(t *testing.T) {
	all := All()
	if len(all) < 40 {
		t.Errorf("%d scenarios, want at least 40", len(all))
	}
	for _, s := range all {
		if s.ID == "" || s.Title == "" || s.Rule == "" || s.Expect == "" || len(s.Tools) == 0 || s.Run == nil {
			t.Errorf("scenario %q is incompletely described: %+v", s.ID, s)
		}
		if strings.ContainsAny(s.ID, " \t") {
			t.Errorf("scenario ID %q has blanks", s.ID)
		}
	}
	got := Select(regexp.MustCompile(`^R-DUP-`))
	if len(got) < 4 {
		t.Errorf("Select(^R-DUP-) = %d scenarios", len(got))
	}
	if _, err := Lookup("no-such"); err == nil {
		t.Error("Lookup of an unknown ID succeeded")
	}
}
