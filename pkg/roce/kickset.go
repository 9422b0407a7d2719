package roce

// kickedSet is the set of a shard's kicked QPs, by number (under the
// worker's kickMu). The usual set holds one QP, the one an application
// posted to while another goroutine owned the shard (an answer posted in
// the answer window); that one lives in one, without the map, whose
// inserts, iteration and deletes were 1% of an 8-byte SEND round trip in
// event mode (docs/performance.md, session R). Any more go to the map.
type kickedSet struct {
	one    uint32
	hasOne bool
	more   map[uint32]bool // made on first use
}

func (s *kickedSet) has(qpn uint32) bool { return s.hasOne && s.one == qpn || s.more[qpn] }

// add puts qpn, which is not in the set, in it.
func (s *kickedSet) add(qpn uint32) {
	if !s.hasOne {
		s.one, s.hasOne = qpn, true
		return
	}
	if s.more == nil {
		s.more = make(map[uint32]bool)
	}
	s.more[qpn] = true
}

func (s *kickedSet) remove(qpn uint32) {
	if s.hasOne && s.one == qpn {
		s.hasOne = false
		return
	}
	delete(s.more, qpn)
}

func (s *kickedSet) empty() bool { return !s.hasOne && len(s.more) == 0 }

// take moves up to len(dst) QPs out of the set into dst and returns how
// many it moved.
func (s *kickedSet) take(dst []uint32) int {
	n := 0
	if s.hasOne && len(dst) > 0 {
		dst[0], s.hasOne = s.one, false
		n = 1
	}
	if len(s.more) == 0 { // the usual case: no map iterator to set up
		return n
	}
	for qpn := range s.more {
		if n == len(dst) {
			break
		}
		dst[n] = qpn
		n++
		delete(s.more, qpn)
	}
	return n
}
