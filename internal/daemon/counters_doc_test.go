package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/qp"
)

// TestEveryEngineCounterIsInTheToolsDocs: docs/tools.md's metrics table
// names every engine counter /metrics exports, rdma_rxe's and rxed's own.
// Bug (found by the daemon audit, session AF): fast_retransmits,
// read_response_gaps and read_replies_kept were exported but missing from
// the list.
func TestEveryEngineCounterIsInTheToolsDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "docs", "tools.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range qp.CounterNames {
		if !strings.Contains(string(b), "`"+name+"`") {
			t.Errorf("docs/tools.md does not name the engine counter `%s`", name)
		}
	}
}
