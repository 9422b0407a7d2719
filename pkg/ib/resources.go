package ib

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce"
)

// Errors of resource lifetime misuse; test with errors.Is.
var (
	// ErrBusy is returned when destroying a CQ or SRQ that QPs still use
	// (EBUSY from ibv_destroy_cq / ibv_destroy_srq). PD.Dealloc of a PD
	// with QPs, SRQs, regions or windows fails with mr.ErrPDBusy.
	ErrBusy = errors.New("ib: resource in use")
	// ErrDestroyed is returned by operations on a destroyed QP, CQ or
	// SRQ, and by CreateQP given a destroyed CQ or SRQ.
	ErrDestroyed = errors.New("ib: resource destroyed")
)

// holdQPResources records that a new QP uses the PD, the CQs and the SRQ
// of attr, so that none of them can be destroyed under it; it fails with
// ErrDestroyed, holding nothing, if one of them already is.
func holdQPResources(pd *PD, attr *QPInitAttr) error {
	if err := pd.pd.Hold(); err != nil {
		return err
	}
	us := attr.useCounts()
	for i, u := range us {
		if !u.hold() {
			for _, h := range us[:i] {
				h.release()
			}
			pd.pd.Unhold()
			return errorf(ErrDestroyed, "%s destroyed", u.what)
		}
	}
	return nil
}

// releaseQPResources undoes holdQPResources.
func releaseQPResources(pd *PD, attr *QPInitAttr) {
	for _, u := range attr.useCounts() {
		u.release()
	}
	pd.pd.Unhold()
}

// useCounts returns the use counts of attr's CQs and SRQ (a CQ used for
// both sends and receives twice).
func (attr *QPInitAttr) useCounts() []*useCount {
	us := []*useCount{&attr.SendCQ.users, &attr.RecvCQ.users}
	if attr.SRQ != nil {
		us = append(us, &attr.SRQ.users)
	}
	return us
}

// useCount counts the QPs using a CQ or an SRQ, and retires the resource
// in the same atomic step that finds it unused: a CreateQP racing Destroy
// either holds the resource first (Destroy fails with ErrBusy) or finds it
// destroyed (CreateQP fails with ErrDestroyed). A separate check of the
// count and a destroyed flag would let both succeed.
type useCount struct {
	n    atomic.Int32 // QPs holding the resource; retiredUses once destroyed
	what string       // "CQ" or "SRQ", for errors
}

const retiredUses = -1

// hold adds a user; false if the resource is retired.
func (u *useCount) hold() bool {
	for {
		n := u.n.Load()
		if n == retiredUses {
			return false
		}
		if u.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release removes a user added by hold.
func (u *useCount) release() { u.n.Add(-1) }

// retire marks the resource destroyed if no QP uses it: first is true for
// the call that retired it, false if it was retired before; err is
// ErrBusy if QPs use it.
func (u *useCount) retire() (first bool, err error) {
	for {
		if u.n.CompareAndSwap(0, retiredUses) {
			return true, nil
		}
		switch n := u.n.Load(); {
		case n == retiredUses:
			return false, nil
		case n > 0:
			return false, busy(u.what, n)
		} // back to 0 since the swap failed: try again
	}
}

// retired reports whether retire has run.
func (u *useCount) retired() bool { return u.n.Load() == retiredUses }

// busy returns an ErrBusy naming what still uses a resource, or nil.
func busy(what string, users int32) error {
	if users > 0 {
		return fmt.Errorf("%w: %s used by %d QPs", ErrBusy, what, users)
	}
	return nil
}

// ErrDeviceClosed is returned by verbs on a closed device, and by the
// waits that Device.Close ended.
var ErrDeviceClosed = errors.New("ib: device closed")

// engineErr gives the engine's "closed" this package's ErrDeviceClosed,
// and qp's "destroyed" its ErrDestroyed.
func engineErr(err error) error {
	switch {
	case errors.Is(err, roce.ErrClosed):
		return ErrDeviceClosed
	case errors.Is(err, qp.ErrDestroyed):
		// A verb that raced with Destroy fails as one that came after it.
		return ErrDestroyed
	}
	return err
}

// checkOpen fails once Close was called: the engine no longer runs, so a
// work request posted now would never complete.
func (d *Device) checkOpen() error {
	if d.down.Load() {
		return ErrDeviceClosed
	}
	return nil
}
