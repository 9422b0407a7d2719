package conform

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestZeroLengthRDMAChecksNoKey: R-READ-ZERO and R-WRITE-ZERO PASS a
// responder that validates no R_Key or VA for a zero-length READ or
// WRITE (IBA C9-88; rxe_resp.c check_rkey returns before the lookup) and
// FAIL one that does. Bug (conformance task, session CF): R-READ-ZERO
// sent the buffer's own R_Key and VA, so a responder that checks them
// anyway PASSed, although its Expect says none is checked.
func TestZeroLengthRDMAChecksNoKey(t *testing.T) {
	for _, c := range []struct {
		id   string
		tool Tool
	}{{"R-READ-ZERO", IBReadBW}, {"R-WRITE-ZERO", IBWriteBW}} {
		t.Run(c.id, func(t *testing.T) {
			t.Parallel()
			o := runFake(t, c.id, c.tool, nil)
			require.Equal(t, Pass, o.Verdict, o.Evidence)
			o = runFake(t, c.id, c.tool, func(f *fakeResponder) { f.zeroLenKeyChecked = true })
			require.Equal(t, Fail, o.Verdict, o.Evidence)
			require.Contains(t, o.Evidence, "REMOTE_ACCESS")
		})
	}
}
