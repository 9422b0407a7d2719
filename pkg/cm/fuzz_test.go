package cm_test

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// FuzzHandleMAD feeds arbitrary MADs (and the sequences the fuzzer builds
// by splitting its input into 256-byte MADs) to a listening Manager whose
// handler accepts everything: no panic, and the tables stay within
// MaxHalfOpen plus what the accepted connections hold.
func FuzzHandleMAD(f *testing.F) {
	gp := mad.Path{LocalGID: gidA, RemoteGID: gidB, LocalACKTimeout: 17}
	for _, m := range []mad.Message{
		&mad.REQ{LocalCommID: 1, ServiceID: serviceID, LocalCAGUID: 5, LocalQPN: 9, MaxCMRetries: 3, Primary: gp},
		&mad.REP{LocalCommID: 2, RemoteCommID: 1},
		&mad.RTU{LocalCommID: 1, RemoteCommID: 2},
		&mad.MRA{LocalCommID: 1, RemoteCommID: 2, ServiceTimeout: 24},
		&mad.REJ{LocalCommID: 1, RemoteCommID: 2, Reason: mad.REJTimeout, ARI: []byte{0, 0, 0, 0, 0, 0, 0, 5}},
		&mad.DREQ{LocalCommID: 1, RemoteCommID: 2, RemoteQPN: 0x22},
		&mad.DREP{LocalCommID: 1, RemoteCommID: 2},
		&mad.SIDRREQ{RequestID: 1, ServiceID: serviceID},
		&mad.SIDRREP{RequestID: 1},
	} {
		b, err := mad.Marshal(1, m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	const maxHalfOpen = 8
	f.Fuzz(func(t *testing.T, in []byte) {
		clock := cmtest.NewFakeClock(time.Unix(0, 0))
		var m *cm.Manager
		sent := 0
		m = cm.New(cm.Config{
			NodeGUID: guidB, Clock: clock, Rand: rand.New(rand.NewPCG(1, 2)), MaxHalfOpen: maxHalfOpen,
			Send: func(dst, src netip.Addr, b []byte) error {
				sent++
				if len(b) != mad.MADLen {
					t.Fatalf("sent a MAD of %d bytes", len(b))
				}
				return nil
			},
		})
		accepted := 0
		_, err := m.Listen(serviceID, 0, func(ev cm.Event) {
			switch ev.Type {
			case cm.EventREQ:
				if ev.ID.Accept(cm.AcceptParams{QPN: 0x22}) == nil {
					accepted++
				}
			case cm.EventSIDRREQ:
				_ = ev.ID.SIDRReply(cm.SIDRReplyParams{QPN: 0x23})
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		for len(in) > 0 {
			n := min(len(in), mad.MADLen)
			// Whole MADs carry the CM header fields; the fuzzer mutates them.
			m.HandleMAD(gidA, gidB, in[:n])
			in = in[n:]
			clock.Advance(time.Second)
		}
		ids, rids, rqps, sidr, out := m.TableSizes()
		// Half-open connections are capped; established ones were accepted.
		limit := maxHalfOpen + accepted
		if ids > limit || rids > limit || rqps > limit || sidr > maxHalfOpen {
			t.Fatalf("tables grew past MaxHalfOpen: %d %d %d %d", ids, rids, rqps, sidr)
		}
		if out != 0 {
			t.Fatalf("outbox left with %d entries", out)
		}
		// Every timer ends: retries and timewait are finite.
		clock.Advance(24 * time.Hour)
		if ids, _, _, _, _ := m.TableSizes(); ids != 0 {
			// Established connections stay; they cannot exceed what was accepted.
			if ids > accepted {
				t.Fatalf("%d IDs left, %d accepted", ids, accepted)
			}
		}
		m.Close()
	})
}
