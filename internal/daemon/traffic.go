package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// sessionTraffic is what the daemon knows of one session's RoCE traffic:
// when a datagram last arrived for one of its QPs (the idle timeout), how
// many bytes went each way, and the send budget that bounds what its peer
// address may receive (anti-amplification before the address is
// validated, --session-bytes after). Every field is atomic: the engine's
// receive and send paths update them, the reaper and the session read
// them.
type sessionTraffic struct {
	lastRx  atomic.Int64 // unix nanoseconds of the last datagram for one of its QPs
	rxBytes atomic.Int64 // UDP payload bytes received for its QPs
	txBytes atomic.Int64 // UDP payload bytes sent to its peer's QPs (not those the socket refused: refund)
	// txLimit bounds txBytes (0: no bound): a datagram that would pass it
	// is dropped and counted in drops.
	txLimit atomic.Int64
	drops   atomic.Uint64
	// maxRead refuses (drops) RDMA READ requests longer than it (0: none).
	maxRead int64
}

// txKey names a peer QP as the datagrams we send see it.
type txKey struct {
	addr netip.Addr // unmapped
	qpn  uint32
}

// trafficConn is the transport wrapper through which the daemon watches
// its sessions' RoCE traffic without a hook in the engine. Datagrams of
// QPs no session owns pass untouched. Its receive side is a
// transport.RxFilterConn, which keeps the inner Conn's lent receive and
// polling, with trafficConn as the filter; it sends through the inner
// Conn's gather send when there is one.
type trafficConn struct {
	*transport.RxFilterConn
	gs  transport.GatherSender
	now func() time.Time

	rx sync.Map // our QPN (uint32) -> *sessionTraffic
	tx sync.Map // txKey -> *sessionTraffic

	readCapDrops atomic.Uint64 // READ requests dropped for exceeding maxRead
	budgetDrops  atomic.Uint64 // datagrams dropped by a send budget
}

func newTrafficConn(c transport.Conn, now func() time.Time) *trafficConn {
	t := &trafficConn{now: now}
	t.RxFilterConn = transport.NewRxFilterConn(c, t)
	t.gs, _ = c.(transport.GatherSender)
	return t
}

// errQPTracked refuses a session's QP whose peer QP another session's
// QP already sends to: a peer QP connects to one QP, and sharing the
// entry would let one session's end forget the other's accounting.
var errQPTracked = errors.New("the client's QP is connected to another session's QP")

// track routes the datagrams of one QP of a session to st: those that
// arrive for our QP local, and those we send to the peer's QP remote at
// addr. A peer QP another session tracks is refused (errQPTracked),
// nothing tracked.
func (t *trafficConn) track(st *sessionTraffic, local uint32, addr netip.Addr, remote uint32) error {
	k := txKey{addr.Unmap(), remote}
	if v, loaded := t.tx.LoadOrStore(k, st); loaded && v != st {
		return fmt.Errorf("%w: QP %#x at %s", errQPTracked, remote, k.addr)
	}
	t.rx.Store(local, st)
	return nil
}

// retireQP destroys a session's QP, then forgets its traffic: in that
// order, so that nothing it sends escapes the session's budget. The other
// way round, the requests the client kept retrying after its session
// ended were answered untracked until the QP was gone: TestServeBudgets,
// under -race with a busy CPU, saw 1,308,936 bytes leave for a QP whose
// budget was 1 MiB (2 runs of 20). Once Destroy returns the engine sends
// nothing more for the QP (roce.Engine.DestroyQP), and the packets that
// arrive for it are dropped unanswered.
func (d *Daemon) retireQP(q *ib.QP, st *sessionTraffic, addr netip.Addr, remoteQPN uint32) {
	_ = q.Destroy()
	d.traffic.untrack(st, q.Num(), addr, remoteQPN)
}

// untrack forgets a QP of st (the session is over): only st's entries,
// never another session's (a QP track refused, or never tracked).
func (t *trafficConn) untrack(st *sessionTraffic, local uint32, addr netip.Addr, remote uint32) {
	t.rx.CompareAndDelete(local, st)
	t.tx.CompareAndDelete(txKey{addr.Unmap(), remote}, st)
}

// trackedQPs counts the QPs tracked (our side of each session's QPs).
func (t *trafficConn) trackedQPs() int {
	n := 0
	t.rx.Range(func(any, any) bool { n++; return true })
	return n
}

// observeRx accounts one received datagram and reports whether the
// engine may see it.
func (t *trafficConn) observeRx(b []byte, now int64) bool {
	if len(b) < wire.BTHLen {
		return true
	}
	v, ok := t.rx.Load(wire.BTH(b).DestQP())
	if !ok {
		return true
	}
	st := v.(*sessionTraffic)
	st.lastRx.Store(now)
	st.rxBytes.Add(int64(len(b)))
	if st.maxRead > 0 && wire.BTH(b).Opcode() == wire.RCReadRequest && len(b) >= wire.BTHLen+wire.RETHLen &&
		int64(wire.RETH(b[wire.BTHLen:]).DMALen()) > st.maxRead {
		// The requester retries and gives up (retry exceeded): the READ
		// is refused without a byte of it sent.
		t.readCapDrops.Add(1)
		return false
	}
	return true
}

// allowTx accounts one datagram to send and reports whether it may go.
func (t *trafficConn) allowTx(hdr []byte, n int, to netip.Addr) bool {
	if len(hdr) < wire.BTHLen {
		return true
	}
	v, ok := t.tx.Load(txKey{to, wire.BTH(hdr).DestQP()})
	if !ok {
		return true
	}
	st := v.(*sessionTraffic)
	total := st.txBytes.Add(int64(n))
	if lim := st.txLimit.Load(); lim > 0 && total > lim {
		st.txBytes.Add(-int64(n))
		st.drops.Add(1)
		t.budgetDrops.Add(1)
		return false
	}
	return true
}

// FilterRx implements transport.RxFilter: one reading of the clock per
// received batch.
func (t *trafficConn) FilterRx(b transport.RxBatch) int {
	now := t.now().UnixNano()
	return b.Partition(func(d []byte) bool { return t.observeRx(d, now) })
}

// Send implements transport.Conn.
func (t *trafficConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	to := ep.Remote.Addr().Unmap()
	for i, b := range bufs {
		if !t.allowTx(b, len(b), to) {
			// Rare (a budget is spent): copy the rest without the refused.
			keep, pos := append([][]byte(nil), bufs[:i]...), upTo(i, len(bufs))
			for j, b := range bufs[i+1:] {
				if t.allowTx(b, len(b), to) {
					keep, pos = append(keep, b), append(pos, i+1+j)
				}
			}
			if len(keep) == 0 {
				return nil
			}
			err := t.Conn.Send(keep, ep)
			if err != nil {
				t.refund(err, len(keep), func(k int) ([]byte, int) { return keep[k], len(keep[k]) }, to)
			}
			return remap(err, pos)
		}
	}
	err := t.Conn.Send(bufs, ep)
	if err != nil {
		t.refund(err, len(bufs), func(k int) ([]byte, int) { return bufs[k], len(bufs[k]) }, to)
	}
	return err
}

// SendGather implements transport.GatherSender.
func (t *trafficConn) SendGather(dgrams []transport.Gather, ep transport.Endpoint) error {
	to := ep.Remote.Addr().Unmap()
	for i := range dgrams {
		if !t.allowTx(dgrams[i][0], dgrams[i].Len(), to) {
			keep, pos := append([]transport.Gather(nil), dgrams[:i]...), upTo(i, len(dgrams))
			for j := i + 1; j < len(dgrams); j++ {
				if t.allowTx(dgrams[j][0], dgrams[j].Len(), to) {
					keep, pos = append(keep, dgrams[j]), append(pos, j)
				}
			}
			if len(keep) == 0 {
				return nil
			}
			return remap(t.sendGather(keep, ep, to), pos)
		}
	}
	return t.sendGather(dgrams, ep, to)
}

// sendGather sends dgrams on and refunds the refused.
func (t *trafficConn) sendGather(dgrams []transport.Gather, ep transport.Endpoint, to netip.Addr) error {
	var err error
	if t.gs != nil {
		err = t.gs.SendGather(dgrams, ep)
	} else {
		bufs := make([][]byte, len(dgrams))
		for i := range dgrams {
			bufs[i] = dgrams[i].AppendTo(nil)
		}
		err = t.Conn.Send(bufs, ep)
	}
	if err != nil {
		t.refund(err, len(dgrams), func(k int) ([]byte, int) { return dgrams[k][0], dgrams[k].Len() }, to)
	}
	return err
}

// refund gives back to their sessions' budgets what allowTx charged for
// the datagrams of a send of n that the inner Conn refused (err): the
// socket's kernel refuses one over the path MTU and sends the rest
// (transport.SendError), and a refused datagram never left the host. A
// budget bounds the bytes a peer address is sent (the anti-amplification
// rule, --session-bytes) and txBytes counts them, so neither may be
// spent on it. dgram(k) is datagram k's first piece (its BTH) and size.
// The session is looked up again rather than kept per datagram (the
// send path allocates nothing): it is the one charged, as a peer QP is
// untracked only once the engine sends nothing more for our QP
// (retireQP) and is tracked for one session at a time (errQPTracked).
func (t *trafficConn) refund(err error, n int, dgram func(k int) ([]byte, int), to netip.Addr) {
	transport.EachRefused(err, n, func(k int) {
		hdr, size := dgram(k)
		t.refundTx(hdr, size, to)
	})
}

// refundTx takes back allowTx's charge for one datagram that did not go.
func (t *trafficConn) refundTx(hdr []byte, n int, to netip.Addr) {
	if len(hdr) < wire.BTHLen {
		return
	}
	if v, ok := t.tx.Load(txKey{to, wire.BTH(hdr).DestQP()}); ok {
		v.(*sessionTraffic).txBytes.Add(-int64(n))
	}
}

// upTo is the positions 0 to i-1, with room for n.
func upTo(i, n int) []int {
	pos := make([]int, i, n)
	for k := range pos {
		pos[k] = k
	}
	return pos
}

// remap returns err of a send of a subset of a call's datagrams (pos[k]
// is the position in the call of the subset's datagram k) with the
// refused datagrams' positions the call's, as transport.SendError's
// Index promises.
func remap(err error, pos []int) error {
	var se *transport.SendError
	if err == nil || !errors.As(err, &se) {
		return err
	}
	idx := make([]int, 0, len(se.Index))
	for _, k := range se.Index {
		if k < len(pos) {
			idx = append(idx, pos[k])
		}
	}
	return &transport.SendError{Refused: se.Refused, Index: idx, Err: se.Err}
}

// Stats implements transport.StatsReporter when the inner Conn does.
func (t *trafficConn) Stats() transport.Stats {
	if sr, ok := t.Conn.(transport.StatsReporter); ok {
		return sr.Stats()
	}
	return transport.Stats{}
}
