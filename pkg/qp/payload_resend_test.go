package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/stretchr/testify/require"
)

// refEnv is a capEnv that also takes payloads where they lie (PayloadEnv)
// and notes, packet by packet, whether the payload was left in the
// application's memory (true) or copied behind the headers (false).
type refEnv struct {
	capEnv
	byRef []bool
}

func (e *refEnv) Transmit(n int, av *AddrVector) error {
	e.byRef = append(e.byRef, false)
	return e.capEnv.Transmit(n, av)
}

func (e *refEnv) TransmitPayload(hdrLen int, payload []byte, reg mr.Region, n int, av *AddrVector) error {
	copy(e.buf[hdrLen:], payload)
	reg.Release()
	e.byRef = append(e.byRef, true)
	return e.capEnv.Transmit(n, av)
}

// take returns and forgets what byRef noted.
func (e *refEnv) take() []bool {
	b := e.byRef
	e.byRef = nil
	e.capEnv.take()
	return b
}

// TestResentPayloadIsCopied: a first transmission may leave its payload
// in registered memory until its batch is sent, since the WR cannot
// complete before the peer has the packet; a resent one may not. Its
// batch can still be waiting when the ACK of the first transmission comes
// in, completes the WR and gives the buffer back to the application, which
// may then write it while the engine reads it to send the resend.
//
// Bug (a race report in TestConnSharedByManyPostersLossy, session AG: a
// poster refilled its buffer after the send completion while the fault
// injector's flush read it for a go-back-N resend built before the ACK).
func TestResentPayloadIsCopied(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	env := &refEnv{}
	require.NoError(t, l.a.q.PostSend(&SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 600)}}))
	l.a.q.Run(env, l.now, 1000)
	require.Equal(t, []bool{true, true, true}, env.take(), "first transmissions: in place")

	l.now = l.a.q.retransmitAt
	l.a.q.OnTimer(env, l.now, 1000)
	require.Equal(t, []bool{false, false, false}, env.take(), "the go-back-N resend: copied")

	// New work after the resend goes out in place again.
	require.NoError(t, l.a.q.PostSend(&SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(1024, 300)}}))
	l.a.q.Run(env, l.now, 1000)
	require.Equal(t, []bool{true, true}, env.take(), "a new message's first transmission: in place")
}
