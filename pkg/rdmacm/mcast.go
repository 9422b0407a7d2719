package rdmacm

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// Multicast: rdma_join_multicast and rdma_leave_multicast on RoCE
// (cma.c's cma_iboe_join_multicast). No MAD is sent on RoCE (there is no
// SA to ask): the group's IP address becomes the MGID (an IPv4 group
// IPv4-mapped, ::ffff:239.1.1.1, for RoCEv2: cma_iboe_set_mgid), the Q_Key
// is RDMA_UDP_QKEY (0x01234567) in the UDP port space, MLID 0, SL 0, the
// address handle's hop limit 64 (IPV6_DEFAULT_HOPLIMIT), and the QP is
// attached to the MGID (librdmacm's ucma_process_join: ibv_attach_mcast).
// The host's IP membership, which the kernel's rdma_cm adds with
// cma_igmp_send, comes with the attach in rxed (the transport joins the
// group when the device's first QP attaches; see pkg/ib's mcast.go).
//
// Deviation: the kernel refuses IPv6 groups on RoCEv2 (-EOPNOTSUPP);
// rxed joins them (an IPv6 multicast address is its own MGID), which only
// rxed peers can use.

// RDMAUDPQKey is rdma_cm's Q_Key of the UDP port space (RDMA_UDP_QKEY):
// the Q_Key of every UD QP and multicast group librdmacm sets up.
const RDMAUDPQKey = 0x01234567

// mcastHopLimit is the hop limit of a RoCEv2 group's address handle
// (cma_iboe_join_multicast: IPV6_DEFAULT_HOPLIMIT).
const mcastHopLimit = 64

// McastOptions tunes JoinMulticast; nil means the defaults.
type McastOptions struct {
	// Local is our address (rdma_bind_addr, mckey -b): the source GID of
	// the group's address handle. Invalid: the device's first GID of the
	// group's family.
	Local netip.Addr
	// PortSpace is the rdma_cm ID's port space; 0 means mad.PortSpaceUDP,
	// the only one that has a Q_Key on RoCE (RDMA_PS_IPOIB's comes from
	// the SA, which RoCE does not have).
	PortSpace mad.PortSpace
}

// Multicast is a joined group (the RDMA_CM_EVENT_MULTICAST_JOIN's ud
// parameters): what a sender addresses its datagrams to.
type Multicast struct {
	Group netip.Addr    // the IP group address joined
	MGID  netip.Addr    // the multicast GID: ::ffff:a.b.c.d for an IPv4 group
	MLID  uint16        // 0 on RoCE
	SL    uint8         // 0 on RoCE
	QPN   uint32        // ib.McastQPN (0xFFFFFF): the remote QPN of a send to the group
	QKey  uint32        // the group's Q_Key: RDMAUDPQKey
	AV    ib.AddrVector // the address handle's attributes (ah_attr): DGID = MGID, hop limit 64
	qp    *ib.QP
}

// ErrMcastPortSpace is returned by JoinMulticast for a port space other
// than UDP.
var ErrMcastPortSpace = errors.New("rdmacm: multicast on RoCE needs the UDP port space")

// MGIDOf maps an IP group address to its RoCEv2 multicast GID
// (cma_iboe_set_mgid): an IPv4 group IPv4-mapped, an IPv6 one as it is.
func MGIDOf(group netip.Addr) netip.Addr {
	g := group.Unmap()
	if g.Is4() {
		return netip.AddrFrom16(g.As16())
	}
	return g
}

// JoinMulticast joins the UD QP qp to the IP multicast group
// (rdma_join_multicast on an rdma_cm ID bound to opts.Local with qp as its
// QP). A QP still in RESET is first brought to RTS with the group's Q_Key,
// as rdma_create_qp sets up a UD QP (INIT with the Q_Key, RTR, RTS); a QP
// already past RESET must have that Q_Key. The returned Multicast holds
// the address handle attributes, remote QPN and Q_Key to send to the group.
func JoinMulticast(qp *ib.QP, group netip.Addr, opts *McastOptions) (*Multicast, error) {
	if opts == nil {
		opts = &McastOptions{}
	}
	if qp == nil {
		return nil, errors.New("rdmacm: JoinMulticast: nil QP")
	}
	if qp.Type() != ib.UD {
		return nil, fmt.Errorf("rdmacm: JoinMulticast: %w", ib.ErrMcastQPType)
	}
	g := group.Unmap()
	if !g.IsMulticast() {
		return nil, fmt.Errorf("rdmacm: JoinMulticast %v: %w", group, ib.ErrNotMcastGID)
	}
	if ps := opts.PortSpace; ps != 0 && ps != mad.PortSpaceUDP {
		return nil, fmt.Errorf("rdmacm: JoinMulticast %v: %w (got %#x)", group, ErrMcastPortSpace, uint16(ps))
	}
	dev := qp.PD().Device()
	local, ok := localGID(dev, opts.Local, g)
	if !ok {
		return nil, fmt.Errorf("rdmacm: JoinMulticast %v: no local address %v of the group's family on the device", group, opts.Local)
	}
	if err := udReady(qp, RDMAUDPQKey); err != nil {
		return nil, fmt.Errorf("rdmacm: JoinMulticast %v: %w", group, err)
	}
	mgid := MGIDOf(g)
	if err := qp.AttachMcast(mgid, 0); err != nil {
		return nil, fmt.Errorf("rdmacm: JoinMulticast %v: %w", group, err)
	}
	return &Multicast{Group: g, MGID: mgid, QPN: ib.McastQPN, QKey: RDMAUDPQKey, qp: qp,
		AV: ib.AddrVector{DGID: mgid, SGIDIndex: uint8(dev.GIDIndex(local)), HopLimit: mcastHopLimit, PortNum: 1}}, nil
}

// Leave detaches the QP from the group (rdma_leave_multicast).
func (m *Multicast) Leave() error { return LeaveMulticast(m.qp, m.Group) }

// LeaveMulticast detaches qp from the IP multicast group
// (rdma_leave_multicast); ib.ErrNotAttached if it had not joined.
func LeaveMulticast(qp *ib.QP, group netip.Addr) error {
	if qp == nil {
		return errors.New("rdmacm: LeaveMulticast: nil QP")
	}
	if err := qp.DetachMcast(MGIDOf(group), 0); err != nil {
		return fmt.Errorf("rdmacm: LeaveMulticast %v: %w", group, err)
	}
	return nil
}

// udReady brings a UD QP in RESET to RTS with qkey (ucma_init_ud_qp), or
// checks that a QP past RESET has qkey.
func udReady(qp *ib.QP, qkey uint32) error {
	if qp.State() == ib.QPSReset {
		if err := ib.InitQP(qp, ib.ConnectAttr{QKey: qkey}); err != nil {
			return err
		}
		if err := qp.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState); err != nil {
			return fmt.Errorf("to RTR: %w", err)
		}
		if err := qp.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState|ib.AttrSQPSN); err != nil {
			return fmt.Errorf("to RTS: %w", err)
		}
		return nil
	}
	a, _, err := qp.Query()
	if err != nil {
		return err
	}
	if a.QKey != qkey {
		return fmt.Errorf("QP %#x has Q_Key %#x, the group's is %#x", qp.Num(), a.QKey, qkey)
	}
	return nil
}
