package cm_test

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// FuzzHandleMAD feeds arbitrary MADs (and the sequences the fuzzer builds
// by splitting its input into 256-byte MADs) to a listening Manager whose
// handler accepts everything, and which has one active connection of its
// own (a REP is answered with an RTU): no panic, and the tables stay within
// MaxHalfOpen plus what the accepted connections hold. Every MAD the
// Manager sends is one mad.Parse accepts (the builder agrees with the
// parser a peer runs), and each ID's events follow its life: it starts
// with EventREQ or EventSIDRREQ, is established and disconnected at most
// once, and says nothing after EventTimeout or EventTimewaitExit (the ID
// is gone).
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
		// The same aimed at the active connection (see below).
		h := mad.CMHeader(1, m)
		h.AttrMod = 1
		f.Add(append(h.Append(nil), m.AppendData(nil)...))
	}
	const maxHalfOpen = 8
	f.Fuzz(func(t *testing.T, in []byte) {
		clock := cmtest.NewFakeClock(time.Unix(0, 0))
		var m *cm.Manager
		sent := 0
		m = cm.New(cm.Config{
			NodeGUID: guidB, Clock: clock, Rand: rand.New(rand.NewPCG(1, 2)), MaxHalfOpen: maxHalfOpen,
			Send: func(dst, src netip.Addr, _ cm.Traffic, b []byte) error {
				sent++
				if len(b) != mad.MADLen {
					t.Fatalf("sent a MAD of %d bytes", len(b))
				}
				if _, _, err := mad.Parse(b); err != nil {
					t.Fatalf("sent a MAD that does not parse: %v: % x", err, b)
				}
				return nil
			},
		})
		accepted := 0
		life := map[*cm.ID][]cm.EventType{}
		_, err := m.Listen(serviceID, 0, func(ev cm.Event) {
			checkEventLife(t, life[ev.ID], ev.Type)
			life[ev.ID] = append(life[ev.ID], ev.Type)
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
		// An active connection too, so that REP, REJ, MRA, DREQ and DREP
		// reach the active side's steps: a MAD whose attribute modifier
		// (which the CM ignores) has bit 0 set is aimed at it, its remote
		// comm ID made the active ID's local one.
		active, err := m.Connect(cm.ConnectParams{Src: gidB, Dst: gidA, ServiceID: serviceID + 1, QPN: 0x33, MaxCMRetries: 3},
			func(ev cm.Event) {
				checkActiveEventLife(t, life[ev.ID], ev.Type)
				life[ev.ID] = append(life[ev.ID], ev.Type)
				if ev.Type == cm.EventREP {
					_ = ev.ID.SendRTU(nil)
				}
			})
		if err != nil {
			t.Fatal(err)
		}
		var buf [mad.MADLen]byte
		for len(in) > 0 {
			n := min(len(in), mad.MADLen)
			// Whole MADs carry the CM header fields; the fuzzer mutates them.
			b := buf[:n]
			copy(b, in)
			if n >= mad.HeaderLen+8 && b[mad.HeaderLen-1]&1 != 0 {
				binary.BigEndian.PutUint32(b[mad.HeaderLen+4:], active.LocalCommID())
			}
			m.HandleMAD(gidA, gidB, b)
			in = in[n:]
			clock.Advance(time.Second)
		}
		ids, rids, rqps, sidr, out := m.TableSizes()
		// Half-open connections are capped; established ones were
		// accepted, or are the active one.
		accepted++
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

// checkEventLife fails when an ID that already had the events seen gets
// next: the first event of a passive ID is the request that created it,
// REP, ESTABLISHED, DREQ, DISCONNECTED and CROSSED_DREP come at most once
// (CROSSED_DREP only after DREQ, never with DISCONNECTED), and an ID is
// silent once it is gone.
func checkEventLife(t *testing.T, seen []cm.EventType, next cm.EventType) {
	t.Helper()
	if len(seen) == 0 {
		if next != cm.EventREQ && next != cm.EventSIDRREQ {
			t.Fatalf("first event of a passive ID is %v", next)
		}
		return
	}
	checkLaterEvent(t, seen, next)
}

// checkActiveEventLife is checkEventLife for the ID of Connect: it never
// sees a request.
func checkActiveEventLife(t *testing.T, seen []cm.EventType, next cm.EventType) {
	t.Helper()
	if len(seen) == 0 {
		if next == cm.EventREQ || next == cm.EventSIDRREQ {
			t.Fatalf("an active ID got %v", next)
		}
		return
	}
	checkLaterEvent(t, seen, next)
}

func checkLaterEvent(t *testing.T, seen []cm.EventType, next cm.EventType) {
	t.Helper()
	switch next {
	case cm.EventREQ, cm.EventSIDRREQ:
		t.Fatalf("%v again after %v", next, seen)
	case cm.EventREP, cm.EventEstablished, cm.EventDREQ, cm.EventDisconnected, cm.EventTimewaitExit, cm.EventTimeout, cm.EventCrossedDREP:
		if slices.Contains(seen, next) {
			t.Fatalf("%v twice: %v", next, seen)
		}
	}
	if next == cm.EventCrossedDREP && (!slices.Contains(seen, cm.EventDREQ) || slices.Contains(seen, cm.EventDisconnected)) {
		t.Fatalf("%v without a crossed disconnect: %v", next, seen)
	}
	if last := seen[len(seen)-1]; last == cm.EventTimeout || last == cm.EventTimewaitExit {
		t.Fatalf("%v after the ID was gone: %v", next, seen)
	}
}
