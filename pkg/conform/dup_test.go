package conform

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDuplicateAnswersAreJudged: R-DUP-WRITE and R-DUP-SEND accept a
// duplicate's ACK at the latest PSN received (rdma_rxe) or at the
// duplicate's own, and FAIL one at the expected PSN, which acknowledges a
// request the responder never received; R-DUP-READ FAILs a duplicate READ
// answered as a continuation (MIDDLE where the original had FIRST), which
// the requester that lost the responses drops. Bug (conformance task,
// session CF): the duplicate's ACK PSN and the replayed opcodes were not
// looked at, so both wrong responders PASSed.
func TestDuplicateAnswersAreJudged(t *testing.T) {
	for _, c := range []struct {
		name string
		id   string
		tool Tool
		tune func(*fakeResponder)
		want Verdict
		ev   string
	}{
		{"latest", "R-DUP-WRITE", IBWriteBW, func(f *fakeResponder) { f.dupACKAt = dupACKLatest }, Pass, ""},
		{"own", "R-DUP-WRITE", IBWriteBW, func(f *fakeResponder) { f.dupACKAt = dupACKOwn }, Pass, ""},
		{"ahead", "R-DUP-WRITE", IBWriteBW, func(f *fakeResponder) { f.dupACKAt = dupACKAhead }, Fail, "never received"},
		{"latest", "R-DUP-SEND", IBSendBW, func(f *fakeResponder) { f.dupACKAt = dupACKLatest }, Pass, ""},
		{"own", "R-DUP-SEND", IBSendBW, func(f *fakeResponder) { f.dupACKAt = dupACKOwn }, Pass, ""},
		{"ahead", "R-DUP-SEND", IBSendBW, func(f *fakeResponder) { f.dupACKAt = dupACKAhead }, Fail, "ACKed at"},
		{"whole", "R-DUP-READ", IBReadBW, nil, Pass, ""},
		{"continues", "R-DUP-READ", IBReadBW, func(f *fakeResponder) { f.dupReadContinues = true }, Fail, "answered as the whole READ"},
		{"continues", "R-DUP-READ-MIDDLE", IBReadBW, func(f *fakeResponder) { f.dupReadContinues = true }, Pass, ""}, // MIDDLE/LAST from a middle PSN is what rxe sends
	} {
		t.Run(c.id+"/"+c.name, func(t *testing.T) {
			t.Parallel()
			o := runFake(t, c.id, c.tool, c.tune)
			require.Equal(t, c.want, o.Verdict, o.Evidence)
			require.Contains(t, o.Evidence, c.ev)
		})
	}
}
