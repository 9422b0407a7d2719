package allreduce

import (
	"errors"
	"fmt"
)

// ErrRingFailed is what an AllReduce on a ring whose earlier AllReduce
// failed returns (errors.Is): the ring is done, and the error wraps the
// first failure, which names the rank that left.
var ErrRingFailed = errors.New("the ring already failed")

// ringFailedError is the sticky error of a failed ring. Without it, a
// second AllReduce ran on the connections the failed one had hung up,
// and blamed whichever neighbour's connection its own hang-up ended
// first (TestAllReduceAfterAFailureReturnsTheFirstFailure).
type ringFailedError struct {
	rank  int
	first error
}

func (e *ringFailedError) Error() string {
	return fmt.Sprintf("allreduce: rank %d: %v in an earlier AllReduce: %v", e.rank, ErrRingFailed, e.first)
}

func (e *ringFailedError) Unwrap() []error { return []error{ErrRingFailed, e.first} }

// ErrClosed is what AllReduce and Leave return (errors.Is) on a ring
// that Close or Leave ended: its QPs, MRs and CQ are destroyed (its
// streams closed), and running on them failed with "resource destroyed"
// or blamed a neighbour ("rank 2 left the ring") that had done nothing
// (TestRingMisuseAfterItEnded).
var ErrClosed = errors.New("the ring is closed")

// closedError is ErrClosed naming the rank and the call.
type closedError struct {
	rank int
	call string
}

func (e *closedError) Error() string {
	return fmt.Sprintf("allreduce: rank %d: %s after Close or Leave: %v", e.rank, e.call, ErrClosed)
}

func (e *closedError) Unwrap() error { return ErrClosed }
