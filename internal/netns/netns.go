//go:build linux

// Package netns creates network namespaces for tests and runs code inside
// them: Do runs a function on an OS thread that has entered the namespace
// (sockets opened there stay in it, whichever thread reads them later),
// Exec runs a command in it (ip netns exec). It needs root (CAP_SYS_ADMIN)
// and the ip command; Available says whether both are there.
package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// NS is a named network namespace (ip netns add).
type NS struct {
	Name string
}

// Available reports why namespaces cannot be created here ("" when they
// can): not root, or no ip command.
func Available() string {
	if os.Geteuid() != 0 {
		return "needs root to create network namespaces"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "needs the ip command (iproute2)"
	}
	return ""
}

// Create adds a namespace with loopback up. A stale namespace of the same
// name (a crashed earlier run) is deleted first.
func Create(name string) (*NS, error) {
	_ = exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	ns := &NS{Name: name}
	if err := ns.IP("link", "set", "lo", "up"); err != nil {
		ns.Delete()
		return nil, err
	}
	return ns, nil
}

// Delete removes the namespace; sockets still open in it keep it alive
// until they close.
func (ns *NS) Delete() error {
	out, err := exec.Command("ip", "netns", "del", ns.Name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", ns.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// IP runs `ip args...` inside the namespace.
func (ns *NS) IP(args ...string) error {
	return ns.Exec("ip", args...)
}

// LoopbackMulticast turns multicast on for the namespace's loopback and
// routes 224.0.0.0/4 through it, so UDP multicast between sockets of the
// namespace works (joins on 127.0.0.x, IP_MULTICAST_LOOP).
func (ns *NS) LoopbackMulticast() error {
	if err := ns.IP("link", "set", "lo", "multicast", "on"); err != nil {
		return err
	}
	return ns.IP("route", "add", "224.0.0.0/4", "dev", "lo")
}

// Exec runs a command inside the namespace and returns its error with its
// output.
func (ns *NS) Exec(name string, args ...string) error {
	full := append([]string{"netns", "exec", ns.Name, name}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(full, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Command is the command name args... run inside the namespace (ip netns
// exec), not yet started: for long-running processes such as one host's
// rank of a job, whose output and exit the caller handles.
func (ns *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, name}, args...)...)
}

// Do runs f on an OS thread inside the namespace and returns its error.
// The thread is discarded afterwards (its goroutine exits still locked),
// so no other goroutine ever runs in the namespace by accident.
func (ns *NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := unix.Open("/run/netns/"+ns.Name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", ns.Name, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns.Name, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// ErrUnavailable wraps Available's reason.
var ErrUnavailable = errors.New("netns: network namespaces unavailable")
