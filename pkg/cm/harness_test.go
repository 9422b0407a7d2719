package cm_test

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// Two Managers wired back to back in memory: every MAD either sends goes
// into one queue that the test delivers explicitly (pump), after passing a
// drop filter, so loss, duplication and ordering are the test's. Time is a
// FakeClock shared by both sides and moves only with advance. A packet
// arrives with the IP traffic class it was sent with, as a transport that
// reports received traffic (QP 1's does) hands it on.

type side struct {
	name   string
	gid    netip.Addr
	guid   uint64
	m      *cm.Manager
	events []cm.Event
	sidr   []cm.SIDRResult
	// react, when set, is called from the handler for each event.
	react func(cm.Event)
}

type packet struct {
	from, to *side
	src, dst netip.Addr
	traffic  cm.Traffic // the IP TOS and TTL it was sent with
	b        []byte
	hdr      mad.Header
	msg      mad.Message // nil if it does not parse
}

type link struct {
	t     *testing.T
	clock *cmtest.FakeClock
	a, b  *side
	queue []packet
	// drop, when set, decides whether a packet is lost.
	drop    func(p packet) bool
	sent    []packet // everything sent, in order
	dropped []packet
}

var (
	gidA = netip.MustParseAddr("::ffff:10.0.0.1")
	gidB = netip.MustParseAddr("::ffff:10.0.0.2")
)

const (
	guidA = 0x0200_00ff_fe00_0001
	guidB = 0x0200_00ff_fe00_0002
)

func newLink(t *testing.T, cfgB func(*cm.Config)) *link {
	t.Helper()
	return newLinkGIDs(t, gidA, gidB, cfgB)
}

// newLinkGIDs is newLink between the GIDs a and b (IPv6 ones, say).
func newLinkGIDs(t *testing.T, a, b netip.Addr, cfgB func(*cm.Config)) *link {
	t.Helper()
	l := &link{t: t, clock: cmtest.NewFakeClock(time.Unix(1_000_000, 0))}
	l.a = l.newSide("A", a, guidA, 1, nil)
	l.b = l.newSide("B", b, guidB, 2, cfgB)
	return l
}

func (l *link) newSide(name string, gid netip.Addr, guid uint64, seed uint64, tweak func(*cm.Config)) *side {
	s := &side{name: name, gid: gid, guid: guid}
	cfg := cm.Config{
		NodeGUID: guid,
		Clock:    l.clock,
		Rand:     rand.New(rand.NewPCG(seed, seed*7+1)),
		Send: func(dst, src netip.Addr, tr cm.Traffic, b []byte) error {
			p := packet{from: s, src: src, dst: dst, traffic: tr, b: append([]byte(nil), b...)}
			p.to = l.byGID(dst)
			p.hdr, p.msg, _ = mad.Parse(p.b)
			l.queue = append(l.queue, p)
			l.sent = append(l.sent, p)
			return nil
		},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	s.m = cm.New(cfg)
	return s
}

func (l *link) byGID(g netip.Addr) *side {
	switch g {
	case l.a.gid:
		return l.a
	case l.b.gid:
		return l.b
	}
	return nil
}

// handler records s's events (and runs s.react).
func (s *side) handler() cm.Handler {
	return func(ev cm.Event) {
		s.events = append(s.events, ev)
		if s.react != nil {
			s.react(ev)
		}
	}
}

func (s *side) sidrHandler() cm.SIDRHandler {
	return func(r cm.SIDRResult) { s.sidr = append(s.sidr, r) }
}

// take returns and forgets s's events.
func (s *side) take() []cm.Event {
	e := s.events
	s.events = nil
	return e
}

// types lists the event types of evs.
func types(evs []cm.Event) []cm.EventType {
	out := make([]cm.EventType, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// pump delivers queued packets (and those they cause) until the wire is
// quiet; it returns the packets delivered.
func (l *link) pump() []packet {
	var done []packet
	for len(l.queue) > 0 {
		p := l.queue[0]
		l.queue = l.queue[1:]
		if l.drop != nil && l.drop(p) {
			l.dropped = append(l.dropped, p)
			continue
		}
		if p.to == nil {
			continue
		}
		done = append(done, p)
		p.to.m.HandleMADTraffic(p.src, p.dst, p.traffic.TrafficClass, p.b)
	}
	return done
}

// advance moves the clock and delivers what the timers sent.
func (l *link) advance(d time.Duration) []packet {
	l.clock.Advance(d)
	return l.pump()
}

// attrs lists the attribute names of ps, prefixed by the sender.
func attrs(ps []packet) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.from.name + ":" + attrName(p.hdr.AttrID)
	}
	return out
}

func attrName(a uint16) string {
	switch a {
	case mad.AttrREQ:
		return "REQ"
	case mad.AttrMRA:
		return "MRA"
	case mad.AttrREJ:
		return "REJ"
	case mad.AttrREP:
		return "REP"
	case mad.AttrRTU:
		return "RTU"
	case mad.AttrDREQ:
		return "DREQ"
	case mad.AttrDREP:
		return "DREP"
	case mad.AttrSIDRREQ:
		return "SIDR_REQ"
	case mad.AttrSIDRREP:
		return "SIDR_REP"
	}
	return "?"
}

// dropFirst drops the first n packets with attribute attr.
func dropFirst(attr uint16, n int) func(packet) bool {
	return func(p packet) bool {
		if p.hdr.AttrID == attr && n > 0 {
			n--
			return true
		}
		return false
	}
}

// lossy drops each packet with probability rate, from a seeded source.
func lossy(seed uint64, rate float64) func(packet) bool {
	r := rand.New(rand.NewPCG(seed, seed))
	return func(packet) bool { return r.Float64() < rate }
}

const serviceID = 0x0000_0000_0106_1C06 // RDMA_PS_TCP, port 7174

func (l *link) connectParams(qpn uint32) cm.ConnectParams {
	return cm.ConnectParams{
		Src: l.a.gid, Dst: l.b.gid, ServiceID: serviceID,
		QPN: qpn, StartingPSN: 0x123456, ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: 7, RNRRetryCount: 7,
		PrivateData: []byte("hello from A"),
	}
}

func acceptParams(qpn uint32) cm.AcceptParams {
	return cm.AcceptParams{QPN: qpn, StartingPSN: 0x654321, ResponderResources: 1, InitiatorDepth: 1,
		RNRRetryCount: 7, PrivateData: []byte("welcome")}
}

// listen makes B listen on serviceID with its recording handler.
func (l *link) listen() *cm.Listener {
	l.t.Helper()
	ln, err := l.b.m.Listen(serviceID, 0, l.b.handler())
	require.NoError(l.t, err)
	return ln
}

// established connects A (QPN qa) to B (QPN qb) through REQ, REP, RTU and
// returns both IDs, events consumed.
func (l *link) established(qa, qb uint32) (*cm.ID, *cm.ID) {
	t := l.t
	t.Helper()
	ida, err := l.a.m.Connect(l.connectParams(qa), l.a.handler())
	require.NoError(t, err)
	l.pump()
	evs := l.b.take()
	require.Len(t, evs, 1)
	require.Equal(t, cm.EventREQ, evs[0].Type)
	idb := evs[0].ID
	require.NoError(t, idb.Accept(acceptParams(qb)))
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventREP}, types(l.a.take()))
	require.NoError(t, ida.SendRTU(nil))
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.a.take()))
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.b.take()))
	require.Equal(t, cm.StateEstablished, ida.State())
	require.Equal(t, cm.StateEstablished, idb.State())
	return ida, idb
}

// The timers of the default parameters, as cm.c computes them.
const (
	// REQ: 2 x CMTimeout(16) + CMTimeout(20) = 2 x 256 + 4096 ms.
	reqTimeout = 4608 * time.Millisecond
	// REP and passive DREQ: CMTimeout(REQ local CM response timeout 20).
	repTimeout = 4096 * time.Millisecond
	// Timewait: CMTimeout(av.timeout 17) on both sides (packet life time
	// 16, rxe's CA ACK delay 15).
	timewait = 512 * time.Millisecond
)
