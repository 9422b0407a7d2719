package ib

import (
	"fmt"
	"slices"
	"strings"
)

// pdUsers remembers what was created in a PD so that a refused Dealloc
// can say what still uses it. QPs and SRQs leave the sets when destroyed;
// regions and windows are destroyed through pkg/mr, so they stay in the
// lists and are judged by their state (a deregistered region has no PD,
// a deallocated window no rkey), and dead entries are pruned as the
// lists grow. Guarded by PD.mu.
type pdUsers struct {
	qps     map[*QP]struct{}
	srqs    map[*SRQ]struct{}
	mrs     []*MR
	mws     []*MW
	pruneAt int // prune mrs and mws when one gets this long
}

func (u *pdUsers) addQP(q *QP) {
	if u.qps == nil {
		u.qps = make(map[*QP]struct{})
	}
	u.qps[q] = struct{}{}
}

func (u *pdUsers) addSRQ(s *SRQ) {
	if u.srqs == nil {
		u.srqs = make(map[*SRQ]struct{})
	}
	u.srqs[s] = struct{}{}
}

func (pd *PD) addMR(m *MR) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	u := &pd.users
	u.mrs = append(u.mrs, m)
	u.maybePrune(pd)
}

func (pd *PD) addMW(w *MW) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	u := &pd.users
	u.mws = append(u.mws, w)
	u.maybePrune(pd)
}

// maybePrune drops dead regions and windows once a list doubled since
// the last pruning, so a PD that registers and deregisters forever
// holds O(live) entries at amortised O(1) cost.
func (u *pdUsers) maybePrune(pd *PD) {
	if max(len(u.mrs), len(u.mws)) < max(u.pruneAt, 64) {
		return
	}
	u.mrs = slices.DeleteFunc(u.mrs, func(m *MR) bool { return !pd.owns(m) })
	u.mws = slices.DeleteFunc(u.mws, func(w *MW) bool { return w.RKey() == 0 })
	u.pruneAt = 2 * max(len(u.mrs), len(u.mws))
}

// owns reports whether m is a live region of the PD (Rereg may have
// moved it to another).
func (pd *PD) owns(m *MR) bool { return m.mr().PD() == pd.pd }

// usersString names what uses the PD: "QP 0x2a3b4c, SRQ, MR lkey 0x1234,
// MW rkey 0x5678", in that order, QPs by number.
func (pd *PD) usersString() string {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	var parts []string
	var qpns []uint32
	for q := range pd.users.qps {
		qpns = append(qpns, q.Num())
	}
	slices.Sort(qpns)
	for _, n := range qpns {
		parts = append(parts, fmt.Sprintf("QP %#x", n))
	}
	if n := len(pd.users.srqs); n == 1 {
		parts = append(parts, "an SRQ")
	} else if n > 1 {
		parts = append(parts, fmt.Sprintf("%d SRQs", n))
	}
	for _, m := range pd.users.mrs {
		if pd.owns(m) {
			parts = append(parts, fmt.Sprintf("MR lkey %#x", m.LKey()))
		}
	}
	for _, w := range pd.users.mws {
		if k := w.RKey(); k != 0 {
			parts = append(parts, fmt.Sprintf("MW rkey %#x", k))
		}
	}
	return strings.Join(parts, ", ")
}
