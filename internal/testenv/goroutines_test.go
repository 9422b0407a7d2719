package testenv

import (
	"strings"
	"sync"
	"testing"
)

// TestGoroutineCheckSeesANewGoroutine: a goroutine started after the
// snapshot and blocked in the named package is reported; once it exits
// the check passes, and goroutines of other packages are not reported.
func TestGoroutineCheckSeesANewGoroutine(t *testing.T) {
	g := SnapshotGoroutines("sync")
	other := SnapshotGoroutines("net/http")
	var wg sync.WaitGroup
	wg.Add(1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		wg.Wait()
	}()
	// The goroutine is the package's once it blocks in WaitGroup.Wait.
	for len(g.Left()) == 0 {
		select {
		case <-exited:
			t.Fatal("the goroutine exited early")
		default:
		}
	}
	left := g.Left()
	if len(left) != 1 || !strings.Contains(left[0], "sync.(*WaitGroup).Wait") {
		t.Fatalf("left = %q, want the goroutine in sync.(*WaitGroup).Wait", left)
	}
	if l := other.Left(); len(l) != 0 {
		t.Fatalf("a check of net/http reports %q", l)
	}
	wg.Done()
	<-exited
	g.CheckNoneLeft(t)
}

// TestRunsCodeOfSkipsTestFilesAndCreators: a frame in a _test.go file, a
// "created by" line and a subpackage's frame do not make a goroutine the
// package's.
func TestRunsCodeOfSkipsTestFilesAndCreators(t *testing.T) {
	const pkg = "example.com/m/pkg/roce"
	stack := "goroutine 7 [chan receive]:\n" +
		"example.com/m/pkg/roce.TestX.func1()\n\t/src/pkg/roce/x_test.go:10 +0x1\n" +
		"example.com/m/pkg/roce/transport.(*conn).Receive(...)\n\t/src/pkg/roce/transport/conn.go:5 +0x2\n" +
		"created by example.com/m/pkg/roce.(*Engine).start in goroutine 1\n\t/src/pkg/roce/engine.go:3 +0x3"
	if runsCodeOf(stack, pkg) {
		t.Fatal("a test frame, a subpackage frame and a creator line counted as the package's")
	}
	stack += "\n" // a running frame of the package
	stack = strings.Replace(stack, "goroutine 7 [chan receive]:\n",
		"goroutine 7 [chan receive]:\nexample.com/m/pkg/roce.(*Engine).loop()\n\t/src/pkg/roce/engine.go:9 +0x4\n", 1)
	if !runsCodeOf(stack, pkg) {
		t.Fatal("a frame of the package in engine.go not seen")
	}
}
