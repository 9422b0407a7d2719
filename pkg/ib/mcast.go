package ib

import (
	"net/netip"
	"strings"

	"github.com/rxed/rxed/pkg/roce"
)

// UD multicast (ibv_attach_mcast / ibv_detach_mcast), as rdma_rxe does it:
// a UD QP attached to a multicast GID receives every datagram sent to the
// GID with destination QP McastQPN and the QP's Q_Key. A sender posts a
// UD SEND whose address vector's DGID is the group's GID (IPv4 groups
// IPv4-mapped: ::ffff:239.1.1.1), RemoteQPN McastQPN and RemoteQKey the
// group's Q_Key; on the wire it is a datagram to the group's IP address
// on UDP 4791. Every QP attached to the group on every device that
// receives it gets a copy, the sender's own device included (the IP
// stack loops multicast back to local members; a sender that must not
// hear itself posts no receives). See pkg/roce's mcast.go for the
// details and the differences from rxe.
//
// The first QP attached to a group makes the device's transport join it
// (IGMP / MLD on the interfaces of the device's addresses, on the
// device's UDP port); the last detach leaves. Destroying a QP detaches it
// from all its groups.

// McastQPN is the destination QP number of a multicast send
// (IB_MULTICAST_QPN).
const McastQPN = roce.McastQPN

// Multicast limits, rdma_rxe's (rxe_param.h): groups per device, QPs per
// group, attachments per device.
const (
	MaxMcastGrp           = roce.MaxMcastGroups
	MaxMcastQPAttach      = roce.MaxMcastQPAttach
	MaxTotalMcastQPAttach = roce.MaxTotalMcastQPAttach
)

// Multicast errors (errors.Is): an address that is not a multicast GID, a
// QP that is not UD, a detach of a QP that is not attached, and the
// limits above.
var (
	ErrNotMcastGID    = roce.ErrNotMcastGID
	ErrMcastQPType    = roce.ErrMcastQPType
	ErrNotAttached    = roce.ErrNotAttached
	ErrMcastGroups    = roce.ErrMcastGroups
	ErrMcastGroupFull = roce.ErrMcastGroupFull
)

// AttachMcast attaches the UD QP to the multicast group gid
// (ibv_attach_mcast). lid is the group's LID, 0 on RoCE, and is not used.
// Attaching a QP twice is not an error.
func (q *QP) AttachMcast(gid netip.Addr, lid uint16) error {
	if err := q.mcastCheck("AttachMcast"); err != nil {
		return err
	}
	if err := q.pd.d.eng.AttachMcast(q.q, gid); err != nil {
		return mcastErr("AttachMcast", err)
	}
	return nil
}

// DetachMcast detaches the QP from gid (ibv_detach_mcast); ErrNotAttached
// if it is not attached.
func (q *QP) DetachMcast(gid netip.Addr, lid uint16) error {
	if err := q.mcastCheck("DetachMcast"); err != nil {
		return err
	}
	if err := q.pd.d.eng.DetachMcast(q.q, gid); err != nil {
		return mcastErr("DetachMcast", err)
	}
	return nil
}

// mcastErr is the engine's err as the failure of op ("ib: op: ..."),
// matching the engine's sentinel (and ErrDeviceClosed for a closed one).
func mcastErr(op string, err error) error {
	err = engineErr(err)
	return &libError{msg: "ib: " + op + ": " + strings.TrimPrefix(err.Error(), "roce: "), err: err}
}

func (q *QP) mcastCheck(op string) error {
	if q.destroyed.Load() {
		return errorf(ErrDestroyed, "ib: %s: QP %#x destroyed", op, q.Num())
	}
	return q.pd.d.checkOpen()
}

// McastGroups returns the multicast groups the device's QPs are attached
// to, with the number of QPs attached to each.
func (d *Device) McastGroups() map[netip.Addr]int { return d.eng.McastGroups() }
