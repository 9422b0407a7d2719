package conform

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/wire"
)

// requesterScript is what a scripted fake requester does in one
// requester scenario: its first transmissions, and the retransmission a
// conformant requester owes once the scenario's first answer (the
// trigger) arrives.
type requesterScript struct {
	first  []wire.Headers
	resend []wire.Headers
}

const scriptPSN = 0x500

// scriptRead is a READ request to the engine's QP (its buffer at
// 0x200000, rkey 0x2000: acceptPerftest's key).
func scriptRead(psn uint32, va uint64, n int) wire.Headers {
	return wire.Headers{Opcode: wire.RCReadRequest, PKey: DefaultPKey, DestQP: 0x2323, PSN: psn,
		VA: va, RKey: 0x2000, DMALen: uint32(n)}
}

// scriptWrite is one packet of a 3-packet WRITE to the engine's buffer.
func scriptWrite(op wire.Opcode, psn uint32) wire.Headers {
	h := wire.Headers{Opcode: op, PKey: DefaultPKey, DestQP: 0x2323, PSN: psn}
	switch op {
	case wire.RCWriteFirst:
		h.VA, h.RKey, h.DMALen = 0x200000, 0x2000, 3*1024
	case wire.RCWriteLast:
		h.AckReq = true
	}
	return h
}

// requesterScripts: per scenario, what an IBA-conformant requester sends.
var requesterScripts = map[string]requesterScript{
	// Two READs outstanding; the response to the second implies the first
	// was lost (IBA 9.7.6.1): go back to it.
	"Q-IMPLIED-NAK": {
		first:  []wire.Headers{scriptRead(scriptPSN, 0x200000, 64), scriptRead(scriptPSN+1, 0x200040, 64)},
		resend: []wire.Headers{scriptRead(scriptPSN, 0x200000, 64), scriptRead(scriptPSN+1, 0x200040, 64)},
	},
	// A READ of three packets answered by its FIRST only: re-requested
	// from the second, its address and the remaining length.
	"Q-READ-PARTIAL": {
		first:  []wire.Headers{scriptRead(scriptPSN, 0x200000, 3*1024)},
		resend: []wire.Headers{scriptRead(scriptPSN+1, 0x200000+1024, 2*1024)},
	},
	// A WRITE of three packets ACKed at its FIRST: resent from MIDDLE.
	"Q-WRITE-PARTIAL": {
		first: []wire.Headers{scriptWrite(wire.RCWriteFirst, scriptPSN), scriptWrite(wire.RCWriteMiddle, scriptPSN+1),
			scriptWrite(wire.RCWriteLast, scriptPSN+2)},
		resend: []wire.Headers{scriptWrite(wire.RCWriteMiddle, scriptPSN+1), scriptWrite(wire.RCWriteLast, scriptPSN+2)},
	},
}

// runScriptedRequester runs requester scenario id against a fake
// requester that sends the script's first transmissions and, once the
// scenario's first answer has come and the scenario waits for more,
// either retransmits late (late of the link's fake time after that wait
// began) or never does (never). Time is a fakeClock: the scenario's wait
// times out only when the fake moves the clock past it, and the
// retransmission leaves only after a timeout that fired has been taken.
func runScriptedRequester(t *testing.T, id string, late time.Duration, never bool) Outcome {
	t.Helper()
	s, err := Lookup(id)
	require.NoError(t, err)
	script, ok := requesterScripts[id]
	require.True(t, ok, "no script for %s", id)
	clk := newFakeClock()
	c, pc, flow := fakeRequesterConn(t, clk, scriptPSN)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		clk.close()
		_ = pc.Close()
		_ = c.Link.Close()
		wg.Wait()
	})
	// build encodes a request; a WRITE packet carries a PMTU of data.
	build := func(h wire.Headers) []byte {
		var payload []byte
		if h.Opcode != wire.RCReadRequest {
			payload = pattern(1024, byte(h.PSN))
		}
		b := make([]byte, h.Len(len(payload)))
		if _, err := h.Encode(b, payload); err != nil {
			panic(err)
		}
		flow.Seal(b)
		return b
	}
	send := func(hs []wire.Headers) {
		for _, h := range hs {
			_, _ = pc.WriteToUDPAddrPort(build(h), flow.Dst)
		}
	}
	send(script.first)
	// The first transmissions are queued before the scenario starts, so
	// that it reads them without waiting: the first timer it arms after
	// its answer is the wait for the retransmission.
	for deadline := time.Now().Add(5 * time.Second); len(c.Link.rx) < len(script.first); {
		require.True(t, time.Now().Before(deadline), "the first transmissions did not arrive")
		time.Sleep(time.Millisecond)
	}
	trigger := make(chan struct{})
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 65536)
		if _, _, err := pc.ReadFromUDPAddrPort(buf); err == nil {
			close(trigger)
		}
		for { // the scenario's later answers: not read
			if _, _, err := pc.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		select {
		case <-trigger:
		case <-time.After(10 * time.Second):
			return
		}
		if clk.armed() == nil {
			return
		}
		if never {
			clk.Advance(c.patience() + time.Second)
			return
		}
		// A wait that ends before late has timed out: the scenario acts on
		// that before the retransmission can reach it.
		for _, tm := range clk.Advance(late) {
			clk.waitStopped(tm)
		}
		send(script.resend)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.Run(ctx, c)
}

// TestRequesterCasesWaitPatienceForTheRequestTheyNeed: Q-IMPLIED-NAK,
// Q-READ-PARTIAL and Q-WRITE-PARTIAL against a requester that sends the
// request their verdict needs later than quietFor (the window they had)
// PASS, and against one that never sends it FAIL with the case's
// message. Bug (found by the conformance audit, session AF; fixed in
// aa183e2 without a test for these three, only Q-RNR-EXCEEDED had one):
// they waited quietFor (368 ms at timeout 14) and FAILed a requester
// descheduled once.
func TestRequesterCasesWaitPatienceForTheRequestTheyNeed(t *testing.T) {
	never := map[string]string{
		"Q-IMPLIED-NAK":   "never requested again within",
		"Q-READ-PARTIAL":  "not re-requested within",
		"Q-WRITE-PARTIAL": "nothing resent within",
	}
	for id, msg := range never {
		t.Run(id, func(t *testing.T) {
			t.Parallel()
			c := &Conn{Cfg: &Config{}}
			c.Cfg.defaults()
			late := c.quietFor() + 200*time.Millisecond // past the old window, within patience
			require.Less(t, late, c.patience())
			o := runScriptedRequester(t, id, late, false)
			require.Equal(t, Pass, o.Verdict, o.Evidence)
			o = runScriptedRequester(t, id, 0, true)
			require.Equal(t, Fail, o.Verdict, o.Evidence)
			require.Contains(t, o.Evidence, msg)
		})
	}
}
