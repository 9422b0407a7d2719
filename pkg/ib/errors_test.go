package ib_test

import (
	"regexp"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// doubledPrefix matches a message that names a package twice, such as
// "ib: Destroy: QP 0x11: ib: resource destroyed".
var doubledPrefix = regexp.MustCompile(`\b(ib|qp|mr|roce|transport|wire): .*\b(ib|qp|mr|roce|transport|wire): `)

// Errors of the verbs name the verb once and then say what is wrong,
// without a second package prefix, and still match their sentinels.
// (issue 15: "ib: Destroy: QP 0x11: ib: resource destroyed".)
func TestErrorMessagesHaveOnePrefix(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	type errCase struct {
		name string
		err  error
		is   error
	}
	var cases []errCase
	add := func(name string, err, is error) { cases = append(cases, errCase{name, err, is}) }

	_, err := a.dev.CreateCQ(0)
	add("CreateCQ size", err, ib.ErrCQSize)
	_, err = a.pd.RegMR(nil, ib.AccessLocalWrite)
	add("RegMR empty", err, ib.ErrEmptyBuffer)
	_, err = a.pd.RegMR(make([]byte, 8), ib.AccessRemoteWrite)
	add("RegMR access combo", err, ib.ErrAccessCombo)
	_, err = a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, Cap: ib.QPCap{MaxSendSGE: 1000}})
	add("CreateQP cap", err, nil)
	_, err = a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 0, MaxSGE: 1})
	add("CreateSRQ", err, nil)
	add("PostSend SGEs", qa.PostSend(ib.SendWR{Opcode: ib.WRSend, SGL: make([]ib.SGE, 9)}), ib.ErrTooManySGE)
	add("Modify bad transition", qa.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState), ib.ErrInvalidTransition)
	q := a.createQP(ib.RC)
	require.NoError(t, q.Destroy())
	add("Destroy twice", q.Destroy(), ib.ErrDestroyed)
	add("Modify destroyed", q.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState), ib.ErrDestroyed)
	add("PostSend destroyed", q.PostSend(ib.SendWR{Opcode: ib.WRSend}), ib.ErrDestroyed)
	add("CQ busy", a.cq.Destroy(), ib.ErrBusy)
	add("PD busy", a.pd.Dealloc(), ib.ErrPDBusy)
	for _, c := range cases {
		require.Error(t, c.err, c.name)
		require.NotRegexp(t, doubledPrefix, c.err.Error(), c.name)
		require.Regexp(t, `^ib: `, c.err.Error(), c.name)
		if c.is != nil {
			require.ErrorIs(t, c.err, c.is, c.name)
		}
	}
}

// A refused PD.Dealloc names what still uses the PD: QPs by number, SRQs,
// regions by lkey, windows by rkey; what was destroyed is not named.
// (issue 15: "pd 1 has 2 users".)
func TestPDDeallocNamesUsers(t *testing.T) {
	net := transport.NewMemNetwork()
	a := openPeer(net, "10.9.7.1")
	defer a.close()
	q := a.createQP(ib.RC)
	srq, err := a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	mw, err := a.pd.AllocMW(ib.MWType2)
	require.NoError(t, err)
	gone, err := a.pd.RegMR(make([]byte, 64), ib.AccessLocalWrite)
	require.NoError(t, err)
	goneKey := gone.LKey()
	require.NoError(t, gone.Dereg())

	err = a.pd.Dealloc()
	require.ErrorIs(t, err, ib.ErrPDBusy)
	msg := err.Error()
	require.Contains(t, msg, "QP "+hex(q.Num()))
	require.Contains(t, msg, "an SRQ")
	require.Contains(t, msg, "MR lkey "+hex(a.mr.LKey()))
	require.Contains(t, msg, "MW rkey "+hex(mw.RKey()))
	require.NotContains(t, msg, hex(goneKey), "a deregistered region is not a user")

	require.NoError(t, q.Destroy())
	require.NoError(t, srq.Destroy())
	require.NoError(t, mw.Dealloc())
	err = a.pd.Dealloc()
	require.ErrorIs(t, err, ib.ErrPDBusy)
	require.NotContains(t, err.Error(), "QP ")
	require.NotContains(t, err.Error(), "SRQ")
	require.NotContains(t, err.Error(), "MW")
	require.Contains(t, err.Error(), "MR lkey "+hex(a.mr.LKey()))
	require.NoError(t, a.mr.Dereg())
	require.NoError(t, a.cq.Destroy())
	require.NoError(t, a.pd.Dealloc())
}

func hex(v uint32) string { return "0x" + fmtHex(v) }

func fmtHex(v uint32) string {
	const digits = "0123456789abcdef"
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v >>= 4 {
		b = append([]byte{digits[v&15]}, b...)
	}
	return string(b)
}

// Device.Progress is the tools' way to receive in their own goroutine;
// after Close it does nothing. (issue 15: the tools called
// Device.Engine().Progress().)
func TestDeviceProgressAfterClose(t *testing.T) {
	net := transport.NewMemNetwork()
	a := openPeer(net, "10.9.7.2")
	require.Equal(t, 0, a.dev.Progress(), "an in-memory transport cannot be polled")
	require.NoError(t, a.dev.Close())
	require.Equal(t, 0, a.dev.Progress())
}
