package hostile

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// maxRatio bounds the bytes a device sends in answer to one hostile
// datagram, over the datagram's own bytes (UDP payloads), for every
// datagram but a READ (or atomic) from the RC QP's connected peer, whose
// answer goes to that peer and is as long as the READ asks: the
// reflection docs/security.md names. A CM REQ answered by an MRA or a
// REJ, a request by an ACK or a NAK, are near 1.
const maxRatio = 2.0

// FuzzEngineReceive feeds a device (RC, UC and UD QPs, a multicast group,
// QP 1 with an rdma_cm listener, regions with every remote access) with
// fuzzer-chosen datagrams from its RC peer's address and from other
// hosts, with a correct ICRC (mostly) over IPv4 and IPv6, and checks after
// each datagram that:
//   - the device judged it (accepted or dropped under a reason) and
//     nothing hung;
//   - what the device sent in answer is at most maxRatio of it, but for a
//     READ or atomic from the peer's address to the RC QP;
//   - another host got nothing but QP 1's answers, to itself, and the
//     peer nothing at all, for a datagram that host sent;
//
// and after the input that the regions no hostile RETH or AtomicETH had
// a key and range for are unchanged, the peer's memory too, and that the
// peer's WRITE and READ still work unless the input hit the RC QP at its
// ePSN from the peer's address (then the hostile packet is the peer's
// next request, as far as any RoCE responder can tell).
func FuzzEngineReceive(f *testing.F) {
	for _, s := range seedInputs(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v6, pkts := decodeInput(data)
		if len(pkts) == 0 {
			return
		}
		runHostile(t, v6, pkts)
	})
}

// runHostile runs one input against a fresh world.
func runHostile(t *testing.T, v6 bool, pkts []hostilePkt) *world {
	t.Helper()
	w := newWorld(t, v6)
	w.settle(false) // whatever the setup sent (nothing, with fake clocks)
	var wAllowed []span
	targeted := false
	for i := range pkts {
		p := &pkts[i]
		src := w.srcAddr(p.src)
		dst := netip.AddrPortFrom(w.tgtAddr, transport.RoCEv2Port)
		epsn := w.rqPSN()
		pkt, destQP := w.build(p)
		if destQP == 0xFFFFFF {
			dst = netip.AddrPortFrom(w.group, transport.RoCEv2Port)
		}
		if len(pkt) >= wire.BTHLen+wire.ICRCLen {
			seal(wire.Flow{Src: src, Dst: dst}, pkt, p.ipv4ID)
		}
		if p.badICRC {
			pkt[len(pkt)-1] ^= 0x40
		}
		valid := !p.badICRC && len(pkt) >= wire.BTHLen+wire.ICRCLen
		var parsed wire.Packet
		parseErr := parsed.Parse(pkt)
		fromPeer := src.Addr() == w.peerAddr
		toRC := destQP == w.rc.Num()
		var flags wire.OpFlags
		if parsed.Info != nil {
			flags = parsed.Info.Flags
		}
		if valid && parseErr == nil {
			if r := parsed.RETH; r != nil && r.RKey() == w.w.RKey() {
				wAllowed = append(wAllowed, span{r.VA(), uint64(r.DMALen())})
			}
			if a := parsed.AtomicETH; a != nil && a.RKey() == w.w.RKey() {
				wAllowed = append(wAllowed, span{a.VA(), 8})
			}
			if fromPeer && toRC && flags.Has(wire.FlagRequest) && parsed.BTH.PSN() == epsn {
				targeted = true // the responder's next request
			}
			if fromPeer && toRC && !flags.Has(wire.FlagRequest) && inReqWindow(parsed.BTH.PSN()) {
				targeted = true // an answer to a request the requester sent
			}
		}
		exempt := valid && fromPeer && toRC && (flags.Has(wire.FlagRead) || flags.Has(wire.FlagAtomic)) && flags.Has(wire.FlagRequest)

		before := w.tgt.Counters()
		out := w.inject(p.src, pkt, dst)
		if valid && parseErr == nil && fromPeer {
			w.took(&parsed, before, w.tgt.Counters(), out)
		}
		outBytes := bytesOf(out)
		for _, s := range out {
			if !fromPeer && (s.to.Addr() != src.Addr() || s.destQP != 1) {
				t.Fatalf("packet %d from %v (%s) made the device send %d bytes to %v (QP %#x, %v): a host that is not the peer gets nothing but QP 1's answers",
					i, src, hex.EncodeToString(pkt), s.n, s.to, s.destQP, s.op)
			}
		}
		ratio := float64(outBytes) / float64(max(len(pkt), 1))
		noteRatio(ratio, exempt, pkt)
		if !exempt && ratio > maxRatio {
			t.Fatalf("packet %d from %v made the device send %d bytes for %d (%.1fx): %s", i, src, outBytes, len(pkt), ratio, hex.EncodeToString(pkt))
		}
	}
	w.checkMemory(t, wAllowed)
	if !targeted {
		if err := w.legit(0x40); err != nil {
			t.Fatalf("the device no longer serves its peer: %v", err)
		}
		if err := w.requesterLegit(); err != nil {
			t.Fatalf("the device's own requests fail: %v", err)
		}
	}
	return w
}

// span is a range of w's addresses a hostile header had the key for.
type span struct{ va, n uint64 }

// checkMemory fails if ro, loc, the peer's buffer (but for the target's
// own WRITE), or w outside allowed changed.
func (w *world) checkMemory(t *testing.T, allowed []span) {
	t.Helper()
	if i := bytes.IndexFunc(w.roBuf, func(r rune) bool { return r != rune(roFill) }); i >= 0 {
		t.Fatalf("the remote-read-only region changed at %d", i)
	}
	if !bytes.Equal(w.roBuf, bytes.Repeat([]byte{roFill}, smallLen)) {
		t.Fatal("the remote-read-only region changed")
	}
	if !bytes.Equal(w.locBuf, bytes.Repeat([]byte{locFill}, smallLen)) {
		t.Fatal("the local-only region changed")
	}
	for i, b := range w.peerBuf {
		if b != byte(i*7) && (i < reqOff || i >= reqOff+reqLen || b != locFill) {
			t.Fatalf("the peer's memory changed at %d", i)
		}
	}
	base := w.w.IOVA()
	for i, b := range w.wBuf {
		if b == wFill {
			continue
		}
		va := base + uint64(i)
		ok := false
		for _, s := range allowed {
			if va >= s.va && va-s.va < s.n {
				ok = true
				break
			}
		}
		if !ok {
			t.Fatalf("w changed at offset %d (%#x), which no hostile RETH or AtomicETH with its rkey covered (%v)", i, b, allowed)
		}
	}
}

// The worst ratio this process has seen, for the report; with
// RXED_HOSTILE_RATIO_LOG set, each new worst is appended to that file.
var (
	ratioMu                 sync.Mutex
	worstRatio, worstExempt float64
)

func noteRatio(r float64, exempt bool, pkt []byte) {
	ratioMu.Lock()
	defer ratioMu.Unlock()
	worst := &worstRatio
	if exempt {
		worst = &worstExempt
	}
	if r <= *worst {
		return
	}
	*worst = r
	if path := os.Getenv("RXED_HOSTILE_RATIO_LOG"); path != "" {
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintf(f, "ratio %.2f exempt=%v len=%d %s\n", r, exempt, len(pkt), hex.EncodeToString(pkt))
			f.Close()
		}
	}
}
