// Package qp holds queue-pair resources and protocol logic without any I/O:
// the QP state machine and attribute rules, work requests and completions
// with libibverbs values, completion and receive queues, and the
// requester, responder and completer as pure functions of state, input
// and time.
package qp

import (
	"fmt"
	"strconv"
)

// Type is a QP transport type, numbered like the kernel's enum ib_qp_type
// (and libibverbs' enum ibv_qp_type for RC, UC and UD).
type Type int

// QP types.
const (
	GSI Type = 1 // IB_QPT_GSI: QP1, general services (connection management)
	RC  Type = 2 // IBV_QPT_RC: reliable connected
	UC  Type = 3 // IBV_QPT_UC: unreliable connected
	UD  Type = 4 // IBV_QPT_UD: unreliable datagram
)

// Valid reports whether t is one of RC, UC, UD or GSI.
func (t Type) Valid() bool { return t >= GSI && t <= UD }

// Connected reports whether t is RC or UC, the types with one fixed peer.
func (t Type) Connected() bool { return t == RC || t == UC }

// Datagram reports whether t is UD or GSI, the types addressed per WR.
func (t Type) Datagram() bool { return t == UD || t == GSI }

// String returns "RC", "UC", "UD" or "GSI".
func (t Type) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	case GSI:
		return "GSI"
	}
	return "Type(" + strconv.Itoa(int(t)) + ")"
}

// MTU is a path MTU in the enum ibv_mtu encoding: 1 means 256 bytes and
// each step doubles it, up to 5 for 4096 bytes.
type MTU int

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Valid reports whether m is one of MTU256 to MTU4096.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// Bytes returns the payload size m stands for, or 0 if m is not valid.
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << m
}

// String returns the size in bytes, e.g. "1024", like ibv_devinfo prints.
func (m MTU) String() string {
	if !m.Valid() {
		return "MTU(" + strconv.Itoa(int(m)) + ")"
	}
	return strconv.Itoa(m.Bytes())
}

// MTUFromBytes returns the MTU for exactly n bytes (256, 512, 1024, 2048 or
// 4096).
func MTUFromBytes(n int) (MTU, error) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, nil
		}
	}
	return 0, fmt.Errorf("qp: %d is not a path MTU (256, 512, 1024, 2048 or 4096)", n)
}

// MTUFloor returns the largest MTU whose size is at most n bytes, for
// deriving a path MTU from a link MTU. It returns 0 (not valid) if n < 256.
func MTUFloor(n int) MTU {
	m := MTU(0)
	for c := MTU256; c <= MTU4096 && c.Bytes() <= n; c++ {
		m = c
	}
	return m
}
