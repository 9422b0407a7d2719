package ib

import (
	"fmt"
	"strings"
)

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

// wrap returns err as the failure of the verb op ("ib: op: ..."),
// matching err with errors.Is and errors.As. A package prefix leading
// err's message (ib's, or one of the packages below it) is dropped: the
// message names the verb once and then says what went wrong.
func wrap(op string, err error) error {
	return &libError{msg: "ib: " + op + ": " + trimPkgPrefix(err.Error()), err: err}
}

// trimPkgPrefix drops one leading "pkg: " of rxed's packages from msg.
func trimPkgPrefix(msg string) string {
	for _, p := range [...]string{"ib: ", "qp: ", "mr: ", "roce: ", "transport: ", "wire: "} {
		if strings.HasPrefix(msg, p) {
			return msg[len(p):]
		}
	}
	return msg
}
