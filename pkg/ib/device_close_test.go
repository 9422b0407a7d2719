package ib_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// closeBound is how long a waiter may take to notice Device.Close. It
// only bounds a failure: a waiter that is never woken fails the test
// instead of hanging it.
const closeBound = 10 * time.Second

// Device.Close wakes every goroutine waiting on the device's CQs and
// completion channels, each with ErrDeviceClosed, including a goroutine
// spinning on PollCQ. (issue 15: a WaitPoll on context.Background()
// blocked forever, a Poll spinner kept getting 0.)
func TestDeviceCloseWakesWaiters(t *testing.T) {
	net := transport.NewMemNetwork()
	a := openPeer(net, "10.9.5.1")
	ch := a.dev.CreateCompChannel()
	chCQ, err := a.dev.CreateCQOnChannel(4, ch)
	require.NoError(t, err)
	require.NoError(t, chCQ.ReqNotify(false))
	require.NoError(t, a.cq.ReqNotify(false))

	type result struct {
		who string
		err error
	}
	results := make(chan result, 8)
	started := make(chan struct{}, 8)
	waiters := map[string]func() error{
		"WaitPoll": func() error {
			var wcs [4]ib.WC
			started <- struct{}{}
			_, err := a.cq.WaitPoll(context.Background(), wcs[:])
			return err
		},
		"Wait": func() error {
			started <- struct{}{}
			return a.cq.Wait(context.Background())
		},
		"Notify": func() error {
			started <- struct{}{}
			<-a.cq.Notify()
			return a.cq.ReqNotify(false) // says why the channel woke
		},
		"GetCQEvent": func() error {
			started <- struct{}{}
			_, err := ch.GetCQEvent(context.Background())
			return err
		},
		"PollCQ spinner": func() error {
			var wcs [4]ib.WC
			started <- struct{}{}
			for {
				n, err := a.cq.PollCQ(wcs[:])
				if err != nil || n > 0 {
					return err
				}
			}
		},
		"Done": func() error {
			started <- struct{}{}
			<-a.dev.Done()
			return ib.ErrDeviceClosed
		},
	}
	for who, w := range waiters {
		go func() { results <- result{who, w()} }()
	}
	for range waiters {
		<-started
	}
	require.NoError(t, a.dev.Close())
	deadline := time.After(closeBound)
	for range waiters {
		select {
		case r := <-results:
			require.ErrorIs(t, r.err, ib.ErrDeviceClosed, r.who)
		case <-deadline:
			t.Fatalf("a waiter was not woken by Device.Close within %v", closeBound)
		}
	}
}

// After Device.Close every verb that creates, posts or arms fails with
// ErrDeviceClosed. (issue 15: CreateCQ and RegMR still succeeded.)
func TestDeviceCloseRefusesVerbs(t *testing.T) {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.9.5.3"), openPeer(net, "10.9.5.4")
	defer b.close()
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)
	srq, err := a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	require.NoError(t, a.dev.Close())

	_, err = a.dev.CreateCQ(4)
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "CreateCQ")
	_, err = a.dev.CreateCQOnChannel(4, a.dev.CreateCompChannel())
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "CreateCQOnChannel")
	_, err = a.pd.RegMR(make([]byte, 64), ib.AccessLocalWrite)
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "RegMR")
	_, err = a.pd.AllocMR(4096)
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "AllocMR")
	_, err = a.pd.AllocMW(ib.MWType2)
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "AllocMW")
	_, err = a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "CreateSRQ")
	_, err = a.pd.CreateAH(ib.AHAttr{DGID: netip.MustParseAddr("10.9.5.4")})
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "CreateAH")
	_, err = a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq})
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "CreateQP")
	_, err = a.dev.AllocPD()
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "AllocPD")
	_, err = a.dev.QueryPort(1)
	require.ErrorIs(t, err, ib.ErrDeviceClosed, "QueryPort")
	requirePostError(t, qa.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("x")}), 0, ib.ErrDeviceClosed)
	requirePostError(t, srq.PostRecv(ib.RecvWR{SGL: []ib.SGE{a.sge(0, 8)}}), 0, ib.ErrDeviceClosed)
	require.ErrorIs(t, qa.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState), ib.ErrDeviceClosed, "Modify")
	require.ErrorIs(t, a.cq.ReqNotify(false), ib.ErrDeviceClosed, "ReqNotify")
	require.ErrorIs(t, a.cq.SetNotifyHandler(func(*ib.CQ) {}), ib.ErrDeviceClosed, "SetNotifyHandler")
	require.NotContains(t, ib.ErrDeviceClosed.Error(), "roce", "the error is the verbs layer's")
}

// After Device.Close the objects left can be destroyed in the usual
// order and every destroy succeeds. (issue 15: QP.Destroy failed with
// "engine closed", so CQ.Destroy and PD.Dealloc stayed busy forever.)
func TestDeviceCloseThenDestroyChildren(t *testing.T) {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.9.5.5"), openPeer(net, "10.9.5.6")
	defer b.close()
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)
	srq, err := a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	cq2, err := a.dev.CreateCQ(4)
	require.NoError(t, err)
	qs, err := a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq2, RecvCQ: cq2, SRQ: srq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	require.NoError(t, err)
	mw, err := a.pd.AllocMW(ib.MWType2)
	require.NoError(t, err)
	require.NoError(t, a.dev.Close())

	require.NoError(t, qa.Destroy(), "QP.Destroy after Close")
	require.NoError(t, qs.Destroy(), "QP.Destroy of a QP with an SRQ after Close")
	err = qa.Destroy()
	require.ErrorIs(t, err, ib.ErrDestroyed, "a second Destroy")
	require.NoError(t, srq.Destroy(), "SRQ.Destroy")
	require.NoError(t, a.cq.Destroy(), "CQ.Destroy once its QP is gone")
	require.NoError(t, cq2.Destroy(), "CQ.Destroy")
	require.NoError(t, mw.Dealloc(), "MW.Dealloc")
	require.NoError(t, a.mr.Dereg(), "MR.Dereg")
	require.NoError(t, a.pd.Dealloc(), "PD.Dealloc with every child gone")
	require.NoError(t, a.dev.Close(), "Close again")
}

// Concurrent Close calls all return once the device is closed: none
// returns early while another is still stopping the engine.
func TestDeviceCloseConcurrent(t *testing.T) {
	net := transport.NewMemNetwork()
	a := openPeer(net, "10.9.5.7")
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			err := a.dev.Close()
			select {
			case <-a.dev.Done():
			default:
				err = errors.New("Close returned before the device was closed")
			}
			errs <- err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
}
