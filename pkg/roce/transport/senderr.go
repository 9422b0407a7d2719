package transport

import "errors"

// SendError is the error of a Send (or SendGather) that handed some of
// its datagrams on and not the others: a socket's kernel judges each
// datagram alone (EMSGSIZE for one over the path MTU) and the rest of the
// batch still goes. Refused counts the datagrams of the call that were
// not sent, so that a caller counts each datagram once, sent or refused
// (the engine's send_err), instead of the whole batch as failed. Index
// says which, so that a wrapper can act on exactly the others: the pcap
// recorder records the sent ones, the daemon's accounting refunds the
// budget of the refused ones.
type SendError struct {
	Refused int // datagrams not handed on
	// Index holds the positions in the call's bufs (or dgrams) of the
	// refused datagrams, ascending, each once. Every Conn of this package
	// sets it; it has Refused entries, except from a Faulty that sends,
	// with a call's datagrams, ones it delayed or duplicated: those count
	// in Refused without a position.
	Index []int
	Err   error // the first refusal
}

func (e *SendError) Error() string { return e.Err.Error() }
func (e *SendError) Unwrap() error { return e.Err }

// Refused returns how many of the n datagrams of a Send that returned err
// were not handed on: none for nil, a *SendError's count (at most n: a
// wrapper may pass on more or fewer datagrams than it was given), and all
// n for any other error (the call failed before sending: closed, no
// local address, too large).
func Refused(err error, n int) int {
	if err == nil {
		return 0
	}
	var se *SendError
	if errors.As(err, &se) {
		return min(se.Refused, n)
	}
	return n
}

// RefusedIndex returns the positions of the datagrams a Send that
// returned err did not hand on (ascending; nil for nil) and whether they
// are known: false for an error other than a *SendError, which refused
// the whole call.
func RefusedIndex(err error) (index []int, known bool) {
	if err == nil {
		return nil, true
	}
	var se *SendError
	if errors.As(err, &se) {
		return se.Index, true
	}
	return nil, false
}

// EachRefused calls fn with the position of each of the n datagrams of a
// Send that returned err that was not handed on: those a *SendError
// names (below n), every one for any other error, none for nil.
func EachRefused(err error, n int, fn func(k int)) {
	idx, known := RefusedIndex(err)
	if !known {
		for k := range n {
			fn(k)
		}
		return
	}
	for _, k := range idx {
		if k < n {
			fn(k)
		}
	}
}

// refusals collects, during one Send, the datagrams not handed on and
// the first error that said so. The zero value holds none and allocates
// nothing until a refusal is noted: a send without one costs nothing.
type refusals struct {
	n     int   // datagrams refused
	index []int // positions in the call of those that have one, ascending
	first error
}

// add notes that count datagrams from position pos on were refused with
// err. Positions must come in ascending order.
func (r *refusals) add(pos, count int, err error) {
	for i := range count {
		r.index = append(r.index, pos+i)
	}
	r.n += count
	if r.first == nil {
		r.first = err
	}
}

// addInner notes what an inner Send of count datagrams refused with err
// (a wrapper's): pos maps a position in the inner call to one in the
// wrapper's caller's call, or -1 for a datagram that has none there. An
// error other than a *SendError refused all count.
func (r *refusals) addInner(err error, count int, pos func(int) int) {
	if r.first == nil {
		r.first = err
	}
	named := 0
	EachRefused(err, count, func(k int) { r.note(pos(k), err); named++ })
	// Those of an inner wrapper that named no position.
	if extra := Refused(err, count) - named; extra > 0 {
		r.n += extra
	}
}

// note notes one refused datagram, at position pos of the call (-1: none).
func (r *refusals) note(pos int, err error) {
	if pos >= 0 {
		r.index = append(r.index, pos)
	}
	r.n++
	if r.first == nil {
		r.first = err
	}
}

// err is the call's error: nil when nothing was refused, else a
// *SendError.
func (r *refusals) err() error {
	if r.first == nil {
		return nil
	}
	return &SendError{Refused: r.n, Index: r.index, Err: r.first}
}
