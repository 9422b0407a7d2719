package conform

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestResponsesWithAnotherPKeyAnswerNothing: a responder whose ACKs and
// READ responses carry a P_Key other than its QP's (0x1234; the tools'
// QPs are full members of 0xffff) FAILs R-ACK-WRITE and R-READ-ONLY: a
// requester drops them (IBA 9.6.1.1.3; rxe_recv.c pkey_match). A limited
// member's 0x7fff matches and PASSes. Bug (conformance task, session CF):
// the engine judged responses whatever their P_Key, so that responder
// PASSed every case.
func TestResponsesWithAnotherPKeyAnswerNothing(t *testing.T) {
	for _, c := range []struct {
		id   string
		tool Tool
		pkey uint16
		want Verdict
	}{
		{"R-ACK-WRITE", IBWriteBW, 0x1234, Fail},
		{"R-READ-ONLY", IBReadBW, 0x1234, Fail},
		{"R-ACK-WRITE", IBWriteBW, 0x7fff, Pass},
		{"R-READ-ONLY", IBReadBW, 0x7fff, Pass},
	} {
		t.Run(fmt.Sprintf("%s/%#x", c.id, c.pkey), func(t *testing.T) {
			t.Parallel()
			o := runFake(t, c.id, c.tool, func(f *fakeResponder) { f.pkey = c.pkey })
			require.Equal(t, c.want, o.Verdict, o.Evidence)
		})
	}
}
