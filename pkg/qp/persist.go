package qp

import (
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/wire"
)

// A FLUSH to persistence is acknowledged only once its bytes are durable,
// and making a file mapping durable is an msync: about 24 ms per 64 MiB
// dirty, too long for the goroutine that runs every QP of a shard. So the
// responder accepts the FLUSH (its PSN, MSN and duplicate resource, as
// rxe's process_flush) and hands the msync to the Env (PersistEnv), which
// runs it elsewhere and calls PersistDone on the QP's goroutine when it
// returned; only then does the FLUSH's ACK leave.
//
// Every later response of the QP would imply that ACK (an ACK, a NAK, a
// READ response or an atomic ACK acknowledges every PSN before it), so
// the requests behind a pending FLUSH wait in the queue READ replies use
// (readreply.go) and are handled, in order, after the ACK. A request that
// does not fit there (longer than heldRequestLen, e.g. a full-MTU WRITE,
// or past heldRequests) is dropped with every one after it; once the
// FLUSH is acknowledged the responder forgets the held ones too and sends
// a PSN sequence NAK for the PSN after the FLUSH, so the requester resends
// from there at once (as after a lost packet) instead of waiting for its
// retransmit timer.
//
// The QP's requester and every other QP keep running meanwhile. A FLUSH
// to global visibility, or of zero bytes, is answered at once: this
// process's stores are already visible to everyone who can see the
// memory.
//
// A QP that is reset (or destroyed) while its msync runs forgets the
// FLUSH; the completion that arrives later carries a token of an older
// generation and is ignored. In ERR the completion only ends the wait.

// PersistEnv is an Env that can make memory durable away from the QP's
// goroutine. An Env without it has Persist run inline (the FLUSH is
// acknowledged before Receive returns).
type PersistEnv interface {
	Env
	// StartPersist takes over reg (the bytes a FLUSH to persistence
	// covers), runs reg.Persist off the calling goroutine, releases reg,
	// and then calls q.PersistDone(env, t, err) on q's goroutine. It must
	// not call back into q before it returns.
	StartPersist(q *QP, reg mr.Region, t PersistToken)
}

// PersistToken names one pending FLUSH to PersistDone.
type PersistToken uint64

// persistWait is the responder's pending FLUSH to persistence.
type persistWait struct {
	active bool
	token  PersistToken
	psn    PSN // the FLUSH's PSN, which the ACK names
	// overflowed: a request behind the FLUSH could not be held and was
	// dropped (with every one after it).
	overflowed bool
}

// persisting reports whether a FLUSH waits for its msync.
func (r *responder) persisting() bool { return r.persist.active }

// flushPersist makes reg durable for the FLUSH at psn, which was just
// accepted: inline with a plain Env (and the ACK is sent now), through
// the Env's StartPersist otherwise. It takes over reg.
func (q *QP) flushPersist(env Env, reg mr.Region, psn PSN) {
	r := &q.resp
	r.persistGen++
	t := PersistToken(r.persistGen)
	r.persist = persistWait{active: true, token: t, psn: psn}
	pe, ok := env.(PersistEnv)
	if !ok {
		err := reg.Persist()
		reg.Release()
		q.PersistDone(env, t, err)
		return
	}
	pe.StartPersist(q, reg, t)
}

// PersistDone ends the wait for the FLUSH named by t: with err nil its ACK
// leaves and the requests held behind it are handled by the next Run; an
// msync that failed is rxe's RESPST_ERR_RKEY_VIOLATION for the FLUSH
// (remote access NAK, QP to ERR), as a failed rxe_flush_pmem_iova is. A
// token that is not the pending FLUSH's (the QP was reset since) is
// ignored. Owner goroutine only; the caller then runs the QP.
func (q *QP) PersistDone(env Env, t PersistToken, err error) {
	r := &q.resp
	if !r.persist.active || r.persist.token != t {
		return
	}
	w := r.persist
	r.persist = persistWait{}
	if !q.responding() {
		r.dropReplies()
		return
	}
	if err != nil {
		r.dropReplies()
		q.nakError(env, w.psn, wire.NAKRemoteAccess, WCRemAccessErr)
		return
	}
	q.sendAck(env, ackUnlimited, w.psn)
	if w.overflowed {
		// Ask for everything after the FLUSH again; what was held is
		// resent with it.
		r.dropReplies()
		r.sentNAK = true
		q.sendAck(env, wire.NAKSyndrome(wire.NAKPSNSeqErr), r.psn)
	}
}

// holdBehindPersist keeps a request that arrived while a FLUSH waits for
// its msync, or drops it (and every later one) when it does not fit.
func (q *QP) holdBehindPersist(p *wire.Packet, ri *RecvInfo) {
	r := &q.resp
	if !r.persist.overflowed && r.hold(p.Raw, ri) {
		return
	}
	r.persist.overflowed = true
}
