package main

import (
	"fmt"
	"slices"
)

// atomicCheck validates the original values that the atomics on one
// target returned, as they complete, keeping only what the final check
// needs: a -D run did its atomics for as long as it ran and kept every
// result until the end (8 bytes an atomic, hundreds of MB in minutes).
//
// FETCH_AND_ADD (add 1): the values must be consecutive, each returned
// once. The values seen are kept as disjoint runs [lo, hi): a value inside
// a run is a repeat (a lost add), and the runs must have merged into one
// when the run ends (a gap is an add done twice). A gap while the run goes
// on is an atomic that was executed and whose completion has not come yet
// (a later value was returned), so there are at most as many runs as
// atomics outstanding on the target's QPs, plus one: a QP's own results
// arrive in order, and QPs sharing a target (a perftest server's buffer)
// interleave only by what is in flight.
//
// CMP_AND_SWAP (0 for perfSwapValue): the first swap finds the target 0,
// the rest find the swap value; or, against memory that did not start at
// 0 (a peer that is not rxed), every one finds that same value. Counts
// and the one other value are enough.
type atomicCheck struct {
	vaddr uint64
	cas   bool

	runs []valueRun // FETCH_AND_ADD: sorted, disjoint, not adjacent

	zeros, swaps, others uint64 // CMP_AND_SWAP
	other                uint64 // the first value that was neither
	otherKinds           int    // distinct others seen: 0, 1, or 2 for more
}

// valueRun is [lo, hi): every value in it was returned once.
type valueRun struct{ lo, hi uint64 }

// add takes the value one atomic returned.
func (c *atomicCheck) add(v uint64) error {
	if c.cas {
		switch v {
		case 0:
			c.zeros++
		case perfSwapValue:
			c.swaps++
		default:
			c.others++
			switch {
			case c.otherKinds == 0:
				c.other, c.otherKinds = v, 1
			case v != c.other:
				c.otherKinds = 2
			}
		}
		return nil
	}
	// The first run ending above v: v is in it, or just before it.
	i, _ := slices.BinarySearchFunc(c.runs, v, func(r valueRun, v uint64) int {
		if r.hi <= v {
			return -1
		}
		return 1
	})
	if i < len(c.runs) && c.runs[i].lo <= v {
		return fmt.Errorf("validation: FETCH_AND_ADD on %#x returned %d twice (lost add)", c.vaddr, v)
	}
	joinsPrev := i > 0 && c.runs[i-1].hi == v
	joinsNext := i < len(c.runs) && c.runs[i].lo == v+1
	switch {
	case joinsPrev && joinsNext:
		c.runs[i-1].hi = c.runs[i].hi
		c.runs = slices.Delete(c.runs, i, i+1)
	case joinsPrev:
		c.runs[i-1].hi = v + 1
	case joinsNext:
		c.runs[i].lo = v
	default:
		c.runs = slices.Insert(c.runs, i, valueRun{v, v + 1})
	}
	return nil
}

// finish is the check once every atomic has completed; peer (the peer is
// rxed) also requires FETCH_AND_ADD to have started at 0 and CMP_AND_SWAP
// at 0.
func (c *atomicCheck) finish(peer bool) error {
	if !c.cas {
		if len(c.runs) > 1 {
			return fmt.Errorf("validation: FETCH_AND_ADD on %#x returned %d after %d (lost or repeated add)", c.vaddr, c.runs[1].lo, c.runs[0].hi-1)
		}
		if peer && len(c.runs) == 1 && c.runs[0].lo != 0 {
			return fmt.Errorf("validation: FETCH_AND_ADD on %#x started at %d, want 0", c.vaddr, c.runs[0].lo)
		}
		return nil
	}
	n := c.zeros + c.swaps + c.others
	switch {
	case n == 0:
	case c.zeros == 1 && c.swaps == n-1:
	case c.zeros == 0 && c.swaps == 0 && c.otherKinds == 1 && !peer:
	default:
		return fmt.Errorf("validation: CMP_AND_SWAP on %#x returned %d zeros, %d swapped values and %d others of %d", c.vaddr, c.zeros, c.swaps, c.others, n)
	}
	return nil
}
