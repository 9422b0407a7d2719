package conform

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestResponderCasesJudgeTheMSN: every responder case whose verdict is
// about the peer's responses judges the AETH MSN they carry, against a
// fake responder that counts right and three that count wrong (never,
// per packet, before validating). A wrong counter FAILs exactly the cases
// where its count differs from a right one's, naming the MSN; elsewhere
// it gets the right counter's verdict. Bug (conformance task, session
// CF): NAKs (sequence, remote access, invalid request), RNR NAKs, READ
// responses, atomic ACKs and the probe answers after a dropped packet
// were never checked for their MSN, so a responder that never counted
// passed every case but the ACK ones, and one that counted a duplicate
// READ or atomic, or a refused request, passed all.
func TestResponderCasesJudgeTheMSN(t *testing.T) {
	const (
		P = Pass
		F = Fail
		D = Deviation
	)
	modes := []struct {
		name string
		mode msnMode
	}{{"right", msnRight}, {"frozen", msnFrozen}, {"packets", msnPackets}, {"eager", msnEager}}
	cases := []struct {
		id   string
		tool Tool
		want [4]Verdict // by mode: right, frozen, packets, eager
	}{
		{"R-ACK-WRITE", IBWriteBW, [4]Verdict{P, F, P, P}},
		{"R-ACK-WRITE-MULTI", IBWriteBW, [4]Verdict{P, F, F, P}},
		{"R-ACK-COALESCE", IBWriteBW, [4]Verdict{P, F, P, P}},
		{"R-WRITE-ZERO", IBWriteBW, [4]Verdict{P, F, P, P}},
		{"R-DUP-WRITE", IBWriteBW, [4]Verdict{P, F, F, F}},
		{"R-WRITE-READBACK", IBWriteBW, [4]Verdict{P, F, P, P}},
		{"R-RKEY-WRITE", IBWriteBW, [4]Verdict{P, P, P, F}},
		{"R-BOUNDS-WRITE", IBWriteBW, [4]Verdict{P, P, P, F}},
		{"R-SEQ-NAK", IBWriteBW, [4]Verdict{P, P, P, F}},
		{"R-SEQ-NAK-ONCE", IBWriteBW, [4]Verdict{P, F, P, F}},
		{"R-SEQ-RECOVER", IBWriteBW, [4]Verdict{P, F, P, F}},
		{"R-RNR-NO-RECV", IBWriteBW, [4]Verdict{P, F, P, F}},
		{"D-ICRC", IBWriteBW, [4]Verdict{P, F, P, P}},
		{"R-ACK-SEND", IBSendBW, [4]Verdict{P, F, P, P}},
		{"R-ACK-SEND-MULTI", IBSendBW, [4]Verdict{P, F, F, P}},
		{"R-DUP-SEND", IBSendBW, [4]Verdict{P, F, F, F}},
		{"R-READ-ONLY", IBReadBW, [4]Verdict{P, F, P, P}},
		{"R-READ-MULTI", IBReadBW, [4]Verdict{P, F, F, P}},
		{"R-READ-ZERO", IBReadBW, [4]Verdict{P, F, P, P}},
		{"R-DUP-READ", IBReadBW, [4]Verdict{P, F, F, F}},
		{"R-DUP-READ-MIDDLE", IBReadBW, [4]Verdict{P, F, F, F}},
		{"R-RKEY-READ", IBReadBW, [4]Verdict{P, P, P, F}},
		{"R-READ-OUTSTANDING", IBReadBW, [4]Verdict{D, F, D, D}}, // the fakes recycle READ resources, as rxe does
		{"R-ATOMIC-FETCHADD", IBAtomicBW, [4]Verdict{P, F, P, P}},
		{"R-ATOMIC-CMPSWAP", IBAtomicBW, [4]Verdict{P, F, P, P}},
		{"R-DUP-ATOMIC", IBAtomicBW, [4]Verdict{P, F, F, F}},
		{"R-RKEY-ATOMIC", IBAtomicBW, [4]Verdict{P, P, P, F}},
		{"R-ATOMIC-UNALIGNED", IBAtomicBW, [4]Verdict{P, P, P, F}},
	}
	for i, m := range modes {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/%s/%s", m.name, c.id, c.tool), func(t *testing.T) {
				t.Parallel()
				o := runFake(t, c.id, c.tool, func(f *fakeResponder) { f.msnMode = m.mode })
				require.Equal(t, c.want[i], o.Verdict, o.Evidence)
				if o.Verdict == Fail {
					require.Contains(t, o.Evidence, "MSN", "a FAIL for another reason than the MSN")
				}
			})
		}
	}
}
