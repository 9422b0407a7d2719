//go:build linux

package transport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rawSocket is a UDP socket that the Go netpoller does not watch itself.
// It implements syscall.RawConn for sockSys, as the net package's socket
// did, with two differences, both about whom the kernel wakes up.
//
// Why: the netpoller registers a socket for EPOLLIN and EPOLLOUT, edge
// triggered, for as long as it is open, and the runtime parks a thread in
// epoll_wait whenever a P has nothing to run and any goroutine waits on a
// descriptor or a timer is pending. Every datagram received then wakes
// that thread for the engine's receive goroutine, although an application
// spinning on its CQ takes the packet itself a microsecond later
// (PollLent), and on loopback every datagram sent wakes it too (the
// receiving side frees it at once: sock_wfree -> write space) for an
// EPOLLOUT nobody waits for. A wake-up costs 18-19 us of the idle CPU's
// time on this 2-core VM, and while the woken goroutine runs it contends
// with the spinner for the socket: an 8-byte WRITE round trip in poll
// mode had 0.25 context switches per round trip and a p99 of 2.8-3.3x
// TCP's (BenchmarkWriteLatency8/poll; 0.07 and 1.7-1.9x with this type,
// docs/performance.md, session H).
//
// So the socket sits in two epoll instances of its own, and only they are
// in the netpoller:
//
//   - rd watches EPOLLIN, level triggered, and the receiver waits for rd
//     to become readable; while a poller covers the socket (Cover within
//     coverSpan) the receiver switches the watch off and sleeps until the
//     cover lapses, Uncover is called or the socket closes, so arrivals
//     wake nobody and the poller takes them;
//   - wr watches EPOLLOUT only while a writer waits for buffer space
//     (EPOLLONESHOT, armed by the writer), so the write-space wake-ups of
//     an ordinary send reach no one.
//
// A watch that is off takes the socket out of its set altogether
// (waitSet.watch), so that the kernel's wake-up path has nobody to call.
//
// The price, measured: an application that sleeps (WaitPoll) no longer
// profits from the spurious EPOLLOUT wake-up that kept a thread warm
// just before its answer arrived; on a busy machine its round trip's
// median was 1.6-3.5 us longer, on a quiet one the same. Watching
// EPOLLOUT on rd too (a send wakes the receive goroutine once) gave that
// back for WRITE and READ and cost SEND 5 us: not worth keeping an
// accidental wake-up.
//
// Goroutines: one reader at a time (Read), one writer at a time (Write,
// under sockSys.txMu), any number of Control calls (pollers, options).
// Close may run concurrently with all of them and never waits for them
// (a receiver's f takes the engine's locks, which Close's caller may
// hold): refs counts the uses of fd in progress, and whoever ends the
// last use after Close, or Close itself when there is none, closes fd, so
// a descriptor number is never reused under a system call of ours.
// WaitClosed waits for that: until then the socket keeps its address.
type rawSocket struct {
	fd int

	refs atomic.Int64  // uses of fd in progress, | fdClosing once Close ran
	gone chan struct{} // closed once fd is (closeFD)

	done chan struct{} // closed by Close: wakes a covered reader
	once sync.Once

	rd, wr waitSet

	// coverAt is when a poller last took (or tried to take) datagrams,
	// nanotime; 0: never, or Uncover since. Written by pollers, read by
	// the reader.
	coverAt atomic.Int64
	uncover chan struct{} // capacity 1: Uncover's nudge to a covered reader

	rdState attempt // the reader's (one at a time)
	wrState attempt // the writer's (one at a time)

	// The reader's own (rd.on too: its watch on fd is on).
	timer *time.Timer // a covered reader's sleep

	onCoveredSleep func() // tests: called as a covered reader goes to sleep
}

// coverSpan is how long one PollLent call covers the socket: a spinner
// polls again within microseconds, and an application that stops
// polling without saying so (Uncover) delays the next datagram by at
// most this much. The same span as the engine's "its own application is
// spinning" (roce.recentSpan).
var coverSpan = 200 * time.Microsecond // a variable for tests

// waitSet is an epoll instance of the socket's, registered in the
// netpoller: waiting for it to become readable is waiting for what it
// watches.
type waitSet struct {
	ep int
	f  *os.File
	rc syscall.RawConn
	// on: the socket is in the set (added and not deleted since). Only
	// the set's one waiter changes it (the reader for rd, the writer for
	// wr).
	on bool
}

func newWaitSet() (waitSet, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return waitSet{}, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return waitSet{}, os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(ep), "epoll") // non-blocking: the netpoller watches it
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return waitSet{}, err
	}
	return waitSet{ep: ep, f: f, rc: rc}, nil
}

// watch makes w watch events on fd, and takes fd out of w when events is
// 0 rather than leave it in with nothing watched.
//
// Why out: a socket in an epoll set is on the socket's wait queue, and
// while it is there every datagram it receives (sock_def_readable) and
// every one it sends, whose buffer the receiving side frees at once on
// loopback (sock_wfree -> write space), takes the queue's lock and calls
// epoll's callback, which then finds nothing watched. Measured on the
// 2-core VM of docs/performance.md (session P): a sendto and recvmmsg
// pair between two sockets took 1229 ns at the median of 5 runs, and
// 1334 ns with each socket in two sets watching nothing, as rd and wr
// were while a poller covered the socket and while no writer waited.
func (w *waitSet) watch(fd int, events uint32) error {
	var op int
	switch {
	case events == 0 && !w.on:
		return nil
	case events == 0:
		op = unix.EPOLL_CTL_DEL
	case w.on:
		op = unix.EPOLL_CTL_MOD
	default:
		op = unix.EPOLL_CTL_ADD
	}
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	if err := unix.EpollCtl(w.ep, op, fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	w.on = events != 0
	return nil
}

// newRawSocket takes pc's socket out of the netpoller: it duplicates the
// descriptor and closes pc (which unregisters pc's own descriptor), so
// the socket keeps its binding and options.
func newRawSocket(pc *net.UDPConn) (*rawSocket, error) {
	rc, err := pc.SyscallConn()
	if err != nil {
		pc.Close()
		return nil, err
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(f uintptr) { fd, dupErr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		dupErr = err
	}
	pc.Close()
	if dupErr != nil {
		return nil, fmt.Errorf("transport: dup socket: %w", dupErr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	r := &rawSocket{fd: fd, done: make(chan struct{}), gone: make(chan struct{}), uncover: make(chan struct{}, 1)}
	if r.rd, err = newWaitSet(); err == nil {
		if err = r.rd.watch(fd, unix.EPOLLIN); err != nil {
			r.rd.f.Close()
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if r.wr, err = newWaitSet(); err != nil {
		r.rd.f.Close()
		unix.Close(fd)
		return nil, err
	}
	r.rdState = attempt{r: r}
	r.rdState.tryFn = r.rdState.readTry
	r.wrState = attempt{r: r}
	r.wrState.tryFn = r.wrState.writeTry
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	return r, nil
}

// fdClosing is refs' bit for "Close ran".
const fdClosing = 1 << 62

// acquire starts a use of fd; false when the socket is closed.
func (r *rawSocket) acquire() bool {
	for {
		n := r.refs.Load()
		if n&fdClosing != 0 {
			return false
		}
		if r.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release ends a use of fd, closing it if it was the last after Close.
func (r *rawSocket) release() {
	if r.refs.Add(-1) == fdClosing {
		r.closeFD()
	}
}

// closeFD closes fd, once its last use has ended after Close.
func (r *rawSocket) closeFD() error {
	err := unix.Close(r.fd)
	close(r.gone)
	return err
}

// WaitClosed returns once Close ran and fd is closed: the socket's
// address is free to bind again. A use in progress when Close ran (a
// poller's receive, a send) delays that by its system call; after its
// own goroutines are done, the engine waits for the others'
// (Engine.Close).
func (r *rawSocket) WaitClosed() { <-r.gone }

// use runs f on the descriptor unless the socket is closed.
func (r *rawSocket) use(f func(uintptr) bool) (bool, error) {
	if !r.acquire() {
		return false, net.ErrClosed
	}
	defer r.release()
	return f(uintptr(r.fd)), nil
}

// Control implements syscall.RawConn.
func (r *rawSocket) Control(f func(uintptr)) error {
	if !r.acquire() {
		return net.ErrClosed
	}
	defer r.release()
	f(uintptr(r.fd))
	return nil
}

// Read implements syscall.RawConn: f is retried until it reports done,
// waiting between attempts (see the type's comment for how).
//
// A reader whose watch is on makes its first attempt inside the
// netpoller's wait (rd.rc.Read tries f once before it waits, after
// resetting rd's readiness, which it must: an arrival between an earlier
// attempt and that reset would be forgotten). An attempt of its own
// before that one would be a second recvmmsg that finds nothing whenever
// the reader has to wait, which on loopback is every round trip of a
// ping-pong: 0.7-0.8 us of system time each (docs/performance.md,
// session I).
//
// A reader whose cover just ended (its watch is off) tries before it
// arms the watch, and again in the wait: arming with a datagram queued
// makes rd readable, which wakes a thread parked in the netpoller for a
// datagram this goroutine takes at once, and the spinner that covered
// the socket was busy a moment ago, so the next datagram is often a
// microsecond away; without these attempts an 8-byte WRITE round trip in
// poll and hybrid mode had 0.11-0.15 context switches instead of 0.06
// (session I).
func (r *rawSocket) Read(f func(uintptr) bool) error {
	rs := &r.rdState
	rs.f = f
	defer func() { rs.f = nil }()
	for {
		covered := r.covered() // one clock reading for the whole step
		if covered || !r.rd.on {
			if rs.tryFn(0); rs.done || rs.err != nil {
				return rs.err
			}
		}
		if covered {
			// A poller takes what comes: sleep until the cover ends.
			if err := r.sleepCovered(); err != nil {
				return err
			}
			continue
		}
		if !r.rd.on {
			// Arm, then wait: a datagram that came after the attempt
			// above makes rd readable at once (the wait's first attempt
			// finds it), and one that comes later is watched.
			if err := r.armRead(true); err != nil {
				return err
			}
			continue
		}
		if err := r.rd.rc.Read(rs.tryFn); err != nil {
			return r.closedOr(err)
		}
		if rs.done || rs.err != nil {
			return rs.err
		}
	}
}

// Write implements syscall.RawConn: f is retried until it reports done;
// between attempts the writer arms wr for one EPOLLOUT and waits for it.
func (r *rawSocket) Write(f func(uintptr) bool) error {
	ws := &r.wrState
	ws.f = f
	defer func() { ws.f = nil }()
	if ws.tryFn(0) { // the usual case, without the netpoller's wait set-up
		return ws.err
	}
	err := r.wr.rc.Read(ws.tryFn)
	// Out of wr until the next wait (waitSet.watch says why). If that
	// fails (the socket closing), wr.on stays set and the next wait
	// modifies the entry instead of adding it.
	_ = r.watch(&r.wr, 0)
	if err != nil {
		return r.closedOr(err)
	}
	return ws.err
}

// attempt is the state of a Read or Write in progress: the caller's f
// and what its last attempt came to. The attempt functions are bound
// once (tryFn), so a wait allocates nothing.
type attempt struct {
	r     *rawSocket
	f     func(uintptr) bool
	done  bool
	err   error
	tryFn func(uintptr) bool
}

// readTry is a Read's attempt: it ends the wait in the netpoller when f
// is done, failed, or a poller covers the socket now.
func (a *attempt) readTry(uintptr) bool {
	a.done, a.err = a.r.use(a.f)
	return a.done || a.err != nil || a.r.covered()
}

// writeTry is a Write's attempt; one that must wait re-arms wr first,
// since the one-shot watch may have fired for buffer space another send
// has taken since.
func (a *attempt) writeTry(uintptr) bool {
	if a.done, a.err = a.r.use(a.f); a.done || a.err != nil {
		return true
	}
	if err := a.r.watch(&a.r.wr, unix.EPOLLOUT|unix.EPOLLONESHOT); err != nil {
		a.err = a.r.closedOr(err)
		return true
	}
	return false
}

// cover records that a poller is taking datagrams.
func (r *rawSocket) cover() { r.coverAt.Store(nanotime()) }

// Uncover ends the cover at once: the poller will not poll again soon.
func (r *rawSocket) Uncover() {
	if r.coverAt.Swap(0) == 0 {
		return
	}
	select {
	case r.uncover <- struct{}{}:
	default:
	}
}

func (r *rawSocket) covered() bool {
	at := r.coverAt.Load()
	return at != 0 && nanotime()-at < int64(coverSpan)
}

// sleepCovered switches rd's watch off and waits until the cover lapses,
// Uncover is called or the socket closes.
func (r *rawSocket) sleepCovered() error {
	if r.rd.on {
		if err := r.armRead(false); err != nil {
			return err
		}
	}
	if r.onCoveredSleep != nil {
		r.onCoveredSleep()
	}
	for {
		at := r.coverAt.Load()
		left := time.Duration(at + int64(coverSpan) - nanotime())
		if at == 0 || left <= 0 {
			return nil
		}
		r.timer.Reset(left)
		select {
		case <-r.timer.C:
		case <-r.uncover:
			r.timer.Stop()
			return nil
		case <-r.done:
			r.timer.Stop()
			return net.ErrClosed
		}
	}
}

func (r *rawSocket) armRead(on bool) error {
	var ev uint32
	if on {
		ev = unix.EPOLLIN
	}
	return r.watch(&r.rd, ev)
}

// watch sets what w watches on the socket, unless it is closed.
func (r *rawSocket) watch(w *waitSet, events uint32) error {
	if !r.acquire() {
		return net.ErrClosed
	}
	defer r.release()
	return w.watch(r.fd, events)
}

// closedOr reports a wait that failed because the socket closed as
// net.ErrClosed.
func (r *rawSocket) closedOr(err error) error {
	select {
	case <-r.done:
		return net.ErrClosed
	default:
	}
	if errors.Is(err, os.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

// Close closes the socket; waiting readers and writers return
// net.ErrClosed.
func (r *rawSocket) Close() error {
	err := net.ErrClosed
	r.once.Do(func() {
		close(r.done)
		// Closing the wait sets wakes whoever waits in the netpoller.
		r.rd.f.Close()
		r.wr.f.Close()
		err = nil
		if r.refs.Or(fdClosing) == 0 {
			err = r.closeFD()
		}
	})
	return err
}

// nanotime is a monotonic clock reading in nanoseconds, never 0.
func nanotime() int64 { return int64(time.Since(processStart)) + 1 }

var processStart = time.Now()
