package rdmacm

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// MemDevice opens a device with one worker on net at addr, closed at the
// end of the test: for the package's own tests and its external ones.
func MemDevice(t *testing.T, net *transport.MemNetwork, addr string) *ib.Device {
	t.Helper()
	c, err := net.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.RoCEv2Port))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: c, Workers: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	return dev
}

// Rounds is how many rounds a race test runs: full, or short with -short.
func Rounds(full, short int) int {
	if testing.Short() {
		return short
	}
	return full
}

// DialHeader sends the REQ that Dial would send for q to raddr, from the
// same GID and through the same CM agent, but with rdma_cm's header as
// edit leaves it: Dial always names the GID it sends from, and a test of
// the listener's source check needs a header that names another. It
// returns the peer's answer, a REJ or a REP; a REP is refused at once
// (REJ), so that the listener's Accept fails instead of waiting for an
// RTU. q only lends its number (no QP is moved).
func DialHeader(ctx context.Context, q *ib.QP, raddr netip.AddrPort, edit func(*mad.CMAHeader)) (cm.Event, error) {
	return DialREQ(ctx, q, raddr, edit, nil)
}

// DialREQ is DialHeader with the REQ's CM parameters as editREQ leaves
// them (nil: Dial's): a forger's timeouts and retries, say. editHdr may
// be nil too.
func DialREQ(ctx context.Context, q *ib.QP, raddr netip.AddrPort, editHdr func(*mad.CMAHeader), editREQ func(*cm.ConnectParams)) (cm.Event, error) {
	dev := q.PD().Device()
	local, hdr, err := activeEnd(dev, &ConnParam{}, raddr)
	if err != nil {
		return cm.Event{}, err
	}
	if editHdr != nil {
		editHdr(&hdr)
	}
	a, err := acquire(dev)
	if err != nil {
		return cm.Event{}, err
	}
	answers := make(chan cm.Event, 1)
	p := cm.ConnectParams{
		Src: local, Dst: raddr.Addr().Unmap(), ServiceID: serviceID(0, raddr.Port()),
		QPN: q.Num(), StartingPSN: a.cm.NewPSN(), PathMTU: uint8(ib.MTU1024),
		PacketLifeTime: packetLifeTime, HopLimit: hopLimit, PrivateData: hdr.Append(nil),
	}
	if editREQ != nil {
		editREQ(&p)
	}
	id, err := a.cm.Connect(p, func(ev cm.Event) {
		switch ev.Type {
		case cm.EventREP:
			_ = ev.ID.Reject(mad.REJConsumerDefined, nil, nil)
		case cm.EventREJ, cm.EventTimeout:
		default:
			return
		}
		select {
		case answers <- ev:
		default:
		}
	})
	if err != nil {
		return cm.Event{}, err
	}
	select {
	case ev := <-answers:
		return ev, nil
	case <-ctx.Done():
		id.Destroy()
		return cm.Event{}, fmt.Errorf("no answer to the REQ: %w", ctx.Err())
	}
}

// DialUDHeader is DialHeader for the SIDR_REQ DialUD would send to raddr
// from dev: it returns the SIDR_REP's outcome.
func DialUDHeader(ctx context.Context, dev *ib.Device, raddr netip.AddrPort, edit func(*mad.CMAHeader)) (cm.SIDRResult, error) {
	local, hdr, err := activeEnd(dev, &ConnParam{}, raddr)
	if err != nil {
		return cm.SIDRResult{}, err
	}
	edit(&hdr)
	a, err := acquire(dev)
	if err != nil {
		return cm.SIDRResult{}, err
	}
	res := make(chan cm.SIDRResult, 1)
	id, err := a.cm.SIDRQuery(cm.SIDRParams{Src: local, Dst: raddr.Addr().Unmap(),
		ServiceID: serviceID(mad.PortSpaceUDP, raddr.Port()), PrivateData: hdr.Append(nil)},
		func(r cm.SIDRResult) { res <- r })
	if err != nil {
		return cm.SIDRResult{}, err
	}
	select {
	case r := <-res:
		return r, nil
	case <-ctx.Done():
		id.Destroy()
		return cm.SIDRResult{}, fmt.Errorf("no answer to the SIDR_REQ: %w", ctx.Err())
	}
}

// Queued is how many requests wait in l's backlog for Accept.
func Queued(l *Listener) int { return l.reqs.queued() }

// ExpiredCount is l's device's req_expired, readable after the device
// closed (Counters is nil then).
func ExpiredCount(l *Listener) uint64 { return l.a.reqExpired.Load() }
