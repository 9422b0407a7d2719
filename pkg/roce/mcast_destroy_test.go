package roce

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

var destroyTestGroup = netip.MustParseAddr("239.1.2.3")

// TestAttachMcastAfterDestroyIsRefused: an attach before the destroy is
// undone by it; an attach after it fails with qp.ErrDestroyed and leaves
// no group behind (the two orders of an attach racing a destroy). Bug (found by an audit
// of the engine, session AE; fixed in session AF): AttachMcast checked
// only the engine, so an attach that ran after DestroyQP's detachAll put
// the dead QP in the group for good, and the engine kept the membership
// and fanned every datagram of the group out to it.
func TestAttachMcastAfterDestroyIsRefused(t *testing.T) {
	s := newSide(t, transport.NewMemNetwork(), "10.0.0.1", qp.UD)
	require.NoError(t, s.e.AttachMcast(s.q, destroyTestGroup))
	require.Equal(t, map[netip.Addr]int{destroyTestGroup: 1}, s.e.McastGroups())
	require.NoError(t, s.e.DestroyQP(s.q))
	require.Empty(t, s.e.McastGroups(), "the destroy detached it")

	require.ErrorIs(t, s.e.AttachMcast(s.q, destroyTestGroup), qp.ErrDestroyed)
	require.Empty(t, s.e.McastGroups(), "the destroyed QP is in no group")
}
