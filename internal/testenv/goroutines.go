package testenv

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Goroutine leak checks, goleak-style without the dependency: a test
// snapshots the goroutines before it starts something, closes it, and
// checks that no goroutine started since runs code of the packages it
// names. An embedder expects Close to return only when what it started
// has stopped; a goroutine still running after Close can close a socket
// or write a capture that the caller thinks is free.
//
// The check compares goroutine ids, so it must not run beside parallel
// tests of the same package (their goroutines would count as new).

// LeakWait bounds how long CheckNoneLeft waits for goroutines to exit.
// A goroutine that Close joined may still be unwinding its last frame
// (after the WaitGroup.Done of its defer) when Close returns, so the check
// polls until the stacks are clean; the bound is for a loaded machine.
const LeakWait = 10 * time.Second

// StackPackages are the packages of rxed's stack below an application:
// the goroutines a device, its connection manager and its connections
// start. A leak check of something built on them names them and its own.
func StackPackages(own ...string) []string {
	return append([]string{
		"github.com/rxed/rxed/pkg/ib",
		"github.com/rxed/rxed/pkg/roce",
		"github.com/rxed/rxed/pkg/roce/transport",
		"github.com/rxed/rxed/pkg/rdmacm",
		"github.com/rxed/rxed/pkg/cm",
	}, own...)
}

// Goroutines is a snapshot of the goroutines that existed before a test
// started what it will close.
type Goroutines struct {
	before map[uint64]bool
	pkgs   []string
}

// SnapshotGoroutines records the goroutines running now. pkgs are import
// paths ("github.com/rxed/rxed/pkg/roce"); a goroutine is the packages'
// if one of its frames is a function of one of them in a non-test file.
func SnapshotGoroutines(pkgs ...string) *Goroutines {
	g := &Goroutines{before: make(map[uint64]bool), pkgs: pkgs}
	for _, s := range goroutineStacks() {
		g.before[s.id] = true
	}
	return g
}

// CheckNoneLeft fails t unless, within LeakWait, no goroutine that was not
// in the snapshot runs code of the snapshot's packages; the failure lists
// their stacks.
func (g *Goroutines) CheckNoneLeft(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(LeakWait)
	for {
		left := g.left()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("testenv: %d goroutine(s) of %v left after %v:\n\n%s",
				len(left), g.pkgs, LeakWait, strings.Join(left, "\n\n"))
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Left returns the stacks of the goroutines CheckNoneLeft would report
// now, without waiting.
func (g *Goroutines) Left() []string { return g.left() }

func (g *Goroutines) left() []string {
	var left []string
	for i, s := range goroutineStacks() {
		if i == 0 || g.before[s.id] {
			continue // the first is the caller's own
		}
		for _, p := range g.pkgs {
			if runsCodeOf(s.text, p) {
				left = append(left, s.text)
				break
			}
		}
	}
	return left
}

type goroutineStack struct {
	id   uint64
	text string
}

// goroutineStacks returns every goroutine's stack, the caller's first
// (runtime.Stack's order).
func goroutineStacks() []goroutineStack {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutineStack
	for _, block := range bytes.Split(buf, []byte("\n\n")) {
		text := string(block)
		// "goroutine 42 [select]:"
		rest, ok := strings.CutPrefix(text, "goroutine ")
		if !ok {
			continue
		}
		idText, _, _ := strings.Cut(rest, " ")
		id, err := strconv.ParseUint(idText, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, goroutineStack{id: id, text: text})
	}
	return out
}

// runsCodeOf reports whether a stack has a frame of a function of package
// pkg (pkg.Func or pkg.(*T).M, not a subpackage) whose file is not a
// test's. A frame is a function line and a tab-indented "file:line" line;
// "created by" lines name the creator, not a running frame, and are
// skipped.
func runsCodeOf(stack, pkg string) bool {
	lines := strings.Split(stack, "\n")
	for i := 1; i+1 < len(lines); i++ {
		fn := lines[i]
		if strings.HasPrefix(fn, "\t") || strings.HasPrefix(fn, "created by ") {
			continue
		}
		rest, ok := strings.CutPrefix(fn, pkg+".")
		if !ok || rest == "" {
			continue
		}
		file := strings.TrimSpace(lines[i+1])
		file, _, _ = strings.Cut(file, ":")
		if !strings.HasSuffix(file, "_test.go") {
			return true
		}
	}
	return false
}
