package conform

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestResponderCasesWaitForASlowPeer: a conformant responder whose every
// answer leaves 700 ms late (an emulated guest under load; answerWait is
// 1.5 s) gets the verdict a fast one gets. Bug (found by the conformance
// audit, session AF): R-DUP-READ, R-DUP-READ-MIDDLE, R-SEQ-NAK-ONCE and
// R-READ-OUTSTANDING collected the answers in fixed windows (300 or
// 500 ms) and FAILed it ("original READ got 0 responses", "no NAK for
// three packets", "0 of 17 READs answered").
func TestResponderCasesWaitForASlowPeer(t *testing.T) {
	for _, c := range []struct {
		id   string
		tool Tool
		want Verdict
	}{
		{"R-DUP-READ", IBReadBW, Pass},
		{"R-DUP-READ-MIDDLE", IBReadBW, Pass},
		{"R-SEQ-NAK-ONCE", IBWriteBW, Pass},
		{"R-SEQ-NAK-ONCE", IBSendBW, Pass},
		{"R-READ-OUTSTANDING", IBReadBW, Deviation}, // the fake recycles its resources, as rxe does
	} {
		t.Run(c.id+"/"+string(c.tool), func(t *testing.T) {
			t.Parallel()
			o := runFake(t, c.id, c.tool, func(f *fakeResponder) { f.delay = 700 * time.Millisecond })
			require.Equal(t, c.want, o.Verdict, o.Evidence)
		})
	}
}
