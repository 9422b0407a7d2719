package oob

import (
	"errors"
	"fmt"
)

// Sentinel causes; every error this package returns wraps exactly one of
// them (test with errors.Is) inside a one-line message naming the peer and
// the step.
var (
	// ErrClosed: the peer closed the connection before the message was
	// complete (or reset it), or stopped answering TCP keepalive
	// probes (Options.KeepAlive).
	ErrClosed = errors.New("connection closed")
	// ErrTimeout: the step's deadline passed while waiting for the peer.
	ErrTimeout = errors.New("timed out")
	// ErrCanceled: the caller's context was canceled.
	ErrCanceled = errors.New("canceled")
	// ErrMalformed: a message arrived complete but does not parse.
	ErrMalformed = errors.New("malformed message")
	// ErrVersion: the peer speaks a perftest protocol version this
	// implementation (like perftest 4.5) refuses.
	ErrVersion = errors.New("incompatible protocol version")
	// ErrConnect: the caller's QP connect callback failed.
	ErrConnect = errors.New("connect callback failed")
)

// stepError is the one-line error of a failed step.
type stepError struct {
	peer string
	msg  string
	err  error
	got  int // bytes of the message that did arrive, for I/O errors
}

func (e *stepError) Error() string {
	if e.peer == "" {
		return "oob: " + e.msg
	}
	return "oob: peer " + e.peer + " " + e.msg
}

func (e *stepError) Unwrap() error { return e.err }

func errorf(peer string, cause error, format string, args ...any) error {
	return &stepError{peer: peer, msg: fmt.Sprintf(format, args...), err: cause}
}
