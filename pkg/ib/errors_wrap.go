package ib

import "fmt"

// libError is an error of this package with a message of its own that
// matches a sentinel with errors.Is. Wrapping with fmt.Errorf("...: %w")
// would repeat the sentinel's own "ib: " prefix inside the message
// ("ib: Destroy: QP 0x11: ib: resource destroyed").
type libError struct {
	msg string
	err error
}

func (e *libError) Error() string { return e.msg }
func (e *libError) Unwrap() error { return e.err }

// errorf returns an error reading format (it starts with "ib: ") that
// matches sentinel.
func errorf(sentinel error, format string, args ...any) error {
	return &libError{msg: fmt.Sprintf(format, args...), err: sentinel}
}
