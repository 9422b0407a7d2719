package daemon

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/rxed/rxed/pkg/oob"
)

// gidCheck decides whether the GID a client announces may receive the
// daemon's responses.
//
// RoCE has no notion of a client: every response goes to the GID in the
// client's key message, whoever sent it. A GID equal to the address of
// the TCP exchange is the client's own (it completed a TCP handshake from
// there). Any other GID is a third party until proved: perftest itself
// announces its IPv6 GID over an IPv4 exchange, and an rxed client may do
// the same, so an rxed client proves it by echoing a nonce the daemon
// sends to that GID over RoCE; a perftest client cannot, and is refused
// unless the operator allows unverified GIDs.
type gidCheck struct {
	gid       netip.Addr // the first key's GID, unmapped
	needProof bool       // the GID is not the TCP peer's: prove it
}

// errUnverifiedGID wraps every refusal of a GID.
var errUnverifiedGID = errors.New("unverified GID")

// check examines one address key (the first fixes the GID; the others of
// the session must announce the same).
func (g *gidCheck) check(k oob.Key, peer netip.Addr, ext, allowUnverified bool) error {
	gid := netip.AddrFrom16(k.GID).Unmap()
	if gid.IsUnspecified() {
		return errors.New("the client sent an all-zero GID")
	}
	if g.gid.IsValid() {
		if gid != g.gid {
			return fmt.Errorf("%w: the client's keys announce two GIDs, %s and %s", errUnverifiedGID, g.gid, gid)
		}
		return nil
	}
	g.gid = gid
	switch {
	case gid == peer.Unmap():
	case ext:
		g.needProof = true
	case !allowUnverified:
		return fmt.Errorf("%w: the client announces GID %s but its exchange comes from %s; refused, since responses "+
			"to that GID could flood a third party (choose the GID of the address you connect from with -x, use an rxed "+
			"client, which proves its GID, or start serve with --allow-unverified-gid on a trusted network)", errUnverifiedGID, gid, peer)
	}
	return nil
}
