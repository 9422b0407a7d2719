package conform

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMalformedReadRequestsAreNotExecuted: D-READ-PAD (a READ REQUEST
// with PadCnt 2) and D-READ-EXTRA (8 bytes after its RETH) PASS against
// a responder that drops them and one that NAKs them invalid request,
// and FAIL against one that executes them, as rdma_rxe does
// (rxe_resp_check_length checks only opcodes with a payload). Conformance
// follow-up item 1: the corpus's bad_padding and bad_length READ packets
// (shared/conformance/invalid.jsonl, v4_padcnt2_read_request and
// v6_read_request_extra_8) had no case.
func TestMalformedReadRequestsAreNotExecuted(t *testing.T) {
	for _, id := range []string{"D-READ-PAD", "D-READ-EXTRA"} {
		for _, c := range []struct {
			mode readLenMode
			want Verdict
			says string
		}{
			{readLenDrop, Pass, "silently dropped; then probe answered"},
			{readLenNAK, Pass, "refused as a length error"},
			{readLenExecute, Fail, "was executed: the peer answered RC_RDMA_READ_RESPONSE_ONLY"},
		} {
			t.Run(fmt.Sprintf("%s/%d", id, c.mode), func(t *testing.T) {
				t.Parallel()
				o := runFake(t, id, IBReadBW, func(f *fakeResponder) { f.readLen = c.mode })
				require.Equal(t, c.want, o.Verdict, o.Evidence)
				require.Contains(t, o.Evidence, c.says)
			})
		}
	}
}
