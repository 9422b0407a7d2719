package main

import (
	"fmt"
	"strconv"
)

// tosFlag is a flag holding an IP TOS byte (IPv6 traffic class: DSCP and
// ECN): ucmatose's and udaddy's -t, perftest's -T/--tos and --tclass.
// The C tools read it with strtoul(optarg, NULL, 0), so 104, 0x68 and
// 0150 are one value here too; they truncate to a byte where rxed
// refuses what does not fit, so that -t 360 does not quietly mean 104.
type tosFlag struct {
	v uint8
	// set: the flag was given (perftest's -T is DEF_TOS, off, until it
	// is, and only -R takes it).
	set bool
}

func (f *tosFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.Itoa(int(f.v))
}

func (f *tosFlag) Set(s string) error {
	n, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		return fmt.Errorf("not a number (want 0..255, e.g. 104 or 0x68)")
	}
	if n > 255 {
		return fmt.Errorf("%d out of range 0..255 (the IP TOS byte)", n)
	}
	f.v, f.set = uint8(n), true
	return nil
}
