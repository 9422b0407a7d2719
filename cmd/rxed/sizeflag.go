package main

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/rxed/rxed/internal/daemon"
)

// sizeFlag is a byte-count flag: a number with an optional K, M, G or T
// suffix in powers of 1024 (4K, 64K, 1M, 1G; "KiB" and "KB" too), as
// serve's export sizes (daemon.ParseBytes). perftest takes K and M on -s;
// every rxed command that takes a size takes this one type, so one
// spelling works everywhere. A value is at most 2^50 (ParseBytes's bound),
// so it converts to int and int64 safely.
type sizeFlag uint64

// sizeVar registers a size flag with default def.
func sizeVar(fs *flag.FlagSet, p *sizeFlag, name string, def uint64, usage string) {
	*p = sizeFlag(def)
	fs.Var(p, name, usage)
}

func (s *sizeFlag) Set(v string) error {
	n, err := daemon.ParseBytes(v)
	if err != nil {
		return fmt.Errorf("%q: want a byte count such as 4096, 4K, 64K, 1M or 1G", v)
	}
	*s = sizeFlag(n)
	return nil
}

func (s *sizeFlag) String() string {
	if s == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*s), 10)
}

// flagSet reports whether fs's command line (or config file) set name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// explicitZero is the first of names that fs's command line set to 0. rxed
// refuses an explicit 0 of a count or size rather than running the default
// in its place (perftest refuses -s 0; issue 15).
func explicitZero(fs *flag.FlagSet, names ...string) (string, bool) {
	for _, name := range names {
		if f := fs.Lookup(name); flagSet(fs, name) && f.Value.String() == "0" {
			return name, true
		}
	}
	return "", false
}

// errExplicitZero is explicitZero's usage error.
func errExplicitZero(name string) error {
	return fmt.Errorf("-%s 0: must be positive (omit -%s for the default)", name, name)
}
