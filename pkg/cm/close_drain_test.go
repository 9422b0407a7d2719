package cm_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestCloseSendsWhatItsStepsQueued: a Destroy's DREQ queued behind
// another goroutine's drain (that goroutine in a handler) still leaves
// when Close follows at once, and Close returns only once it has been
// handed to Send, so the caller may then close the MAD agent. Close used
// to empty the outbox: the DREQ was counted tx_dreq and never sent, and
// the peer's connection stayed up (rdmacm's
// TestPeerDeviceCloseEndsTheConnection, flaky on a loaded machine: the
// device's close destroyed the server's ID while the MAD receive
// goroutine was still delivering the RTU's ESTABLISHED).
func TestCloseSendsWhatItsStepsQueued(t *testing.T) {
	l, a2, release, delivered := closeBehindADrain(t)
	close(release)
	<-delivered

	var dreqs []uint32
	for _, p := range l.sent {
		if d, ok := p.msg.(*mad.DREQ); ok && p.from == l.a {
			dreqs = append(dreqs, d.LocalCommID)
		}
	}
	require.Equal(t, []uint32{a2.LocalCommID()}, dreqs, "the destroyed ID's DREQ left")
}

// closeBehindADrain sets up two connections, has B's DREQ for the first
// delivered to A by a goroutine whose handler (EventDREQ) blocks until
// release is closed (that goroutine drains A), destroys A's second
// connection, whose DREQ joins that drain's queue, and starts A's Close,
// returning once Close has forgotten every ID (what it does under the
// Manager's lock, with the outbox) while the drain still waits.
// delivered is closed when the delivery and that Close have returned.
func closeBehindADrain(t *testing.T) (l *link, a2 *cm.ID, release, delivered chan struct{}) {
	t.Helper()
	l = newLink(t, nil)
	l.listen()
	_, b1 := l.established(0x11, 0x21)
	a2, _ = l.established(0x12, 0x22)
	require.NoError(t, b1.Disconnect(nil))
	require.Len(t, l.queue, 1)
	dreq := l.queue[0]
	l.queue = nil
	entered := make(chan struct{})
	release = make(chan struct{})
	l.a.react = func(ev cm.Event) {
		if ev.Type == cm.EventDREQ {
			close(entered)
			<-release
		}
	}
	handled, closed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(handled)
		l.a.m.HandleMADTraffic(dreq.src, dreq.dst, dreq.traffic.TrafficClass, dreq.b)
	}()
	<-entered
	a2.Destroy()
	go func() {
		defer close(closed)
		l.a.m.Close()
	}()
	require.Eventually(t, func() bool {
		ids, _, _, _, _ := l.a.m.TableSizes()
		return ids == 0
	}, 30*time.Second, 100*time.Microsecond, "Close did not forget the IDs")
	delivered = make(chan struct{})
	go func() {
		<-handled
		<-closed
		close(delivered)
	}()
	return l, a2, release, delivered
}

// TestSecondCloseReturnsWhenTheFirstHas: a Close that finds another one
// running returns only when that one has, so that each caller may close
// what Send writes to once its Close returned. Bug (review of session
// AK's Close change): the second Close returned at once, while the first
// still waited for a handler's drain to send the queued DREQ.
func TestSecondCloseReturnsWhenTheFirstHas(t *testing.T) {
	l, _, release, delivered := closeBehindADrain(t)
	second := make(chan struct{})
	go func() {
		defer close(second)
		l.a.m.Close()
	}()
	// The second Close is runnable: yielding lets it run to its end,
	// which without the wait is a return.
	for range 1000 {
		select {
		case <-second:
			t.Fatal("the second Close returned while the first still waited for the drain")
		case <-delivered:
			t.Fatal("the first Close returned before the drain it waits for")
		default:
		}
		runtime.Gosched()
	}
	close(release)
	<-second
	<-delivered
}
