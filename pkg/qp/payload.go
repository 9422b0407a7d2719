package qp

import (
	"github.com/rxed/rxed/pkg/mr"
)

// PayloadEnv is an Env that can send a packet whose payload stays where it
// lies in registered memory (scatter/gather I/O), saving the copy next to
// the headers. The RC requester uses it when a packet's payload lies in
// one SGE, and the responder for READ responses; otherwise, and for
// inline data, they copy as for a plain Env.
type PayloadEnv interface {
	Env
	// TransmitPayload sends the packet whose headers were built in the
	// last TxBuffer, buf[:hdrLen], followed by payload, then the pad and
	// the ICRC (n is the whole packet's length, as for Transmit; the
	// Env may use buf[hdrLen:n-len(payload)] for the trailer). reg holds
	// the memory payload lies in: the Env takes that reference over and
	// releases it once the packet has left (or on error), so a
	// deregistration meanwhile cannot pull the memory away.
	TransmitPayload(hdrLen int, payload []byte, reg mr.Region, n int, av *AddrVector) error
}

// transmitPayload sends the packet built in buf (headers up to off, n bytes
// in all) with payload bytes [from, from+payload) of w's message; resent
// says that the packet's PSN went out before. It reports false when the
// local key check fails (nothing sent), else the Env's verdict.
func (q *QP) transmitPayload(env Env, w *wqe, buf []byte, off, from, payload, n int, resent bool, av *AddrVector) (bool, error) {
	// Only RC: its WRs complete once the peer acknowledged the data, so
	// the memory is not the application's again before a first
	// transmission has left. UC and UD complete a WR as soon as its last
	// packet is handed over, possibly before the batch holding it is
	// sent, and the application may then reuse the buffer: their payloads
	// are copied. So is a resent packet's: the ACK of its first
	// transmission may come in while its batch still waits, complete the
	// WR and give the buffer back before the resend has left.
	if pe, ok := env.(PayloadEnv); ok && q.typ == RC && !resent && w.wr.Flags&Inline == 0 {
		if s, at, ok := w.sgeFor(from, payload); ok {
			reg, err := q.mem.Lookup(s.LKey, mr.LKey, q.pd, s.Addr+uint64(at), uint64(payload), 0)
			if err != nil {
				return false, nil
			}
			return true, pe.TransmitPayload(off, reg.Bytes(), reg, n, av)
		}
	}
	if !q.gather(w, buf[off:off+payload], from) {
		return false, nil
	}
	return true, env.Transmit(n, av)
}

// sgeFor finds the SGE that holds message bytes [off, off+n) whole, and
// the offset inside it.
func (w *wqe) sgeFor(off, n int) (*SGE, int, bool) {
	for i := range w.sgl {
		s := &w.sgl[i]
		l := int(s.Length)
		if off >= l {
			off -= l
			continue
		}
		if off+n <= l {
			return s, off, true
		}
		return nil, 0, false
	}
	return nil, 0, false
}
