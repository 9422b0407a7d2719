package ib

import (
	"errors"
	"fmt"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce"
)

// Errors of resource lifetime misuse; test with errors.Is.
var (
	// ErrBusy is returned when destroying a CQ or SRQ that QPs still use
	// (EBUSY from ibv_destroy_cq / ibv_destroy_srq). PD.Dealloc of a PD
	// with QPs, SRQs, regions or windows fails with mr.ErrPDBusy.
	ErrBusy = errors.New("ib: resource in use")
	// ErrDestroyed is returned by operations on a destroyed QP or SRQ.
	ErrDestroyed = errors.New("ib: resource destroyed")
)

// holdQPResources records that a new QP uses the PD, the CQs and the SRQ
// of attr, so that none of them can be destroyed under it.
func holdQPResources(pd *PD, attr *QPInitAttr) error {
	if err := pd.pd.Hold(); err != nil {
		return err
	}
	attr.SendCQ.users.Add(1)
	attr.RecvCQ.users.Add(1)
	if attr.SRQ != nil {
		attr.SRQ.users.Add(1)
	}
	return nil
}

// releaseQPResources undoes holdQPResources.
func releaseQPResources(pd *PD, attr *QPInitAttr) {
	attr.SendCQ.users.Add(-1)
	attr.RecvCQ.users.Add(-1)
	if attr.SRQ != nil {
		attr.SRQ.users.Add(-1)
	}
	pd.pd.Unhold()
}

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
