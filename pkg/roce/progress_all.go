package roce

import (
	"net/netip"
	"time"
)

// pollables are the engines of this process that can be polled (a Conn
// that is a Poller), for ProgressOthers: pollers read it on every empty
// poll, engines are created and closed rarely (cowList).
var pollables cowList[*Engine]

// ProgressOthers is Progress for every other pollable engine of the
// process; it returns the packets they took.
//
// Why: a goroutine spinning on a CQ yields with runtime.Gosched when it
// finds nothing, and a spinner in the run queue keeps the Go scheduler
// from consulting the netpoller (it does when the run queues are empty,
// or from sysmon, up to 10 ms later). A second device in the same process
// (a client and its server in one program, the benchmarks) then has its
// receive goroutine parked in the netpoller with a datagram already
// queued: measured, a 4 KiB READ round trip in poll mode had a p99 of
// 0.24-3.9 ms against TCP's 18-32 us, in hybrid mode 222-229 us. A
// spinner that also takes the other devices' packets (Progress is safe
// from any goroutine and hands each packet to its engine in arrival
// order) keeps every device of the process moving, as busy polling does
// for every queue it polls: 50-54 us (poll) and 41-58 us (hybrid) in the
// same session (BenchmarkReadLatency4K, load 3-5). Engines with a spinner
// of their own, and engines carrying a stream, are left to themselves
// (forOthersToHelp).
func ProgressOthers(self *Engine) int {
	n := 0
	forOthersToHelp(self, clockForOthers(), func(e *Engine) { n += e.progressCovering() })
	return n
}

// ProgressWithOthers is what a goroutine spinning on e's completions
// does when it finds none: Progress for the other engines of the process
// (ProgressOthers), then for e. It returns the packets taken.
//
// Others first: when the peer of e's QP is an engine of the same process
// (a client and its server in one program, the benchmarks), what the
// application just posted waits in the peer's socket, not in e's, and
// handling it there sends the answer into e's socket during that very
// send (loopback delivers in the sender's system call), where e's poll
// then finds it. Polling e first made an empty poll of e's socket on
// every round trip and left the answer to the next call: an 8-byte WRITE
// round trip in poll mode took 13.7 us at the median instead of 12.9 (TCP
// 12.9; docs/performance.md, session N). A process with one engine
// polls only its own.
func (e *Engine) ProgressWithOthers() int {
	return ProgressOthers(e) + e.Progress()
}

// StopPolling says that the goroutine that spun on Progress (and so on
// ProgressOthers) goes to sleep: the receive goroutines of the engines it
// covered wait on their sockets again at once, instead of when the cover
// of its last poll lapses (transport.Poller.Uncover). Engines whose own
// application spins are left covered.
func (e *Engine) StopPolling() { e.stopPolling(clockForOthers()) }

// stopPolling is StopPolling with the clock read by the caller
// (clockForOthers).
func (e *Engine) stopPolling(now int64) {
	if e.poller == nil {
		return
	}
	if e.polledAt.Load() != 0 {
		e.polledAt.Store(0)
	}
	e.poller.Uncover()
	forOthersWithoutSpinner(e, now, func(o *Engine) { o.poller.Uncover() })
}

// forOthersWithoutSpinner calls f for every pollable engine of the
// process other than self whose own application is not spinning: an
// engine its own application polled within recentSpan has a spinner
// of its own, and polling it from here too only makes two spinners
// contend for its socket (measured: an 8-byte SEND ping-pong, both ends
// spinning, went from 13-19 us to 30 us).
func forOthersWithoutSpinner(self *Engine, now int64, f func(*Engine)) {
	eachOther(self, func(e *Engine) {
		if !recent(now, e.polledAt.Load()) {
			f(e)
		}
	})
}

// forOthersToHelp is forOthersWithoutSpinner without the engines that
// stream (received a batch longer than inlineBatch within
// recentSpan): a stream's receive goroutine carries it on a CPU of its
// own, and a spinner or a goroutine about to sleep that takes the
// stream's packets serialises both ends of it on one CPU.
func forOthersToHelp(self *Engine, now int64, f func(*Engine)) {
	eachOther(self, func(e *Engine) {
		if e.wantsHelp(now) {
			f(e)
		}
	})
}

// wantsHelp reports whether another engine's spinner or waiter may take
// e's packets at now: e has no spinner of its own (polledAt) and carries
// no stream (streamingAt) within recentSpan.
func (e *Engine) wantsHelp(now int64) bool {
	return !recent(now, e.polledAt.Load()) && !recent(now, e.streamingAt.Load())
}

// forOthersUnattended is forOthersToHelp without the engines that have
// an application goroutine asleep until their completions (BeginSleep).
func forOthersUnattended(self *Engine, now int64, f func(*Engine)) {
	forOthersToHelp(self, now, func(e *Engine) {
		if e.sleepers.Load() == 0 {
			f(e)
		}
	})
}

// helpSleepingPeers is what a receive goroutine does after a short batch
// (the latency path) that came from another engine of the process (from,
// the batch's source): if that engine's application sleeps on its
// completions (sleepers) and the engine wants help (wantsHelp: no
// spinner, no stream of its own), it takes what that engine has queued,
// as the engine's own receive goroutine would, answer window included
// (the poll is not a poller's: dispatch with polled false).
//
// Why: the batch just handled usually made this engine answer into an
// in-process peer's socket (a client and its server in one program, the
// benchmarks). Left alone, this goroutine's next receive call finds its
// socket empty and parks it in the netpoller, whose next poll wakes the
// peer's receive goroutine for the answer: a system call that finds
// nothing, a park, an epoll_pwait and a wake per half round trip. Taken
// here, the peer's answer comes back into this engine's socket during
// the peer's send and the next receive call finds it, so one goroutine
// carries the ping-pong and the applications take turns in its answer
// windows. Measured (8-byte SEND ping-pong, both applications asleep in
// WaitPoll, 100,000 round trips, 3 runs alternating,
// docs/performance.md session P): 9.6 -> 8.1 us at the median, a p99 of
// 58 -> 42 us, context switches per round trip 0.11 -> 0.07; WRITE,
// READ, poll and hybrid modes and the 64 KiB streams unchanged. A
// process with one engine (the rxed tools and daemon) polls nothing
// more.
//
// Only the engine the batch came from is helped, and only while an
// application sleeps on it: that engine's receive goroutine is what the
// round trip would otherwise wait for, while a spinner takes its own
// packets and a waiter about to sleep polls its peers itself
// (ProgressBeforeSleep). Each engine helped costs a receive call, which
// finds nothing when our answer did not go there: in a process of many
// engines whose applications sleep (the ranks of an in-process
// allreduce) polling them all after every batch would cost one such
// call per engine.
func (e *Engine) helpSleepingPeers(from netip.AddrPort) {
	p := pollables.load()
	if len(p) < 2 {
		return
	}
	for _, o := range p {
		if o != e && o.hasSocket(from) {
			// The clock is read only for an in-process source.
			if o.sleepers.Load() > 0 && o.wantsHelp(nanotime()) {
				o.tryPoll(false)
			}
			return
		}
	}
}

// eachOther calls f for every pollable engine of the process other than
// self.
func eachOther(self *Engine, f func(e *Engine)) {
	p := pollables.load()
	if len(p) < 2 {
		return
	}
	for _, e := range p {
		if e != self {
			f(e)
		}
	}
}

// clockForOthers is the clock reading the forOthers functions judge the
// other engines' marks by (recent): nanotime when the process has
// another pollable engine, else 0 (they call nothing then). A caller that
// makes several passes reads it once: ProgressBeforeSleep made three
// readings per wait that goes to sleep, six per round trip of an 8-byte
// SEND ping-pong in event mode (docs/performance.md, session R), where
// one serves (recentSpan is 200 us; the passes take microseconds).
func clockForOthers() int64 {
	if len(pollables.load()) < 2 {
		return 0
	}
	return nanotime()
}

// recent reports whether a mark at (nanotime; 0: never) still counts at
// now: an engine's own Progress call (polledAt: its application is
// spinning) or its last long batch (streamingAt: it carries a stream).
func recent(now, at int64) bool {
	return at != 0 && now-at <= int64(recentSpan)
}

// recentSpan is how long a polledAt or streamingAt mark counts.
const recentSpan = 200 * time.Microsecond

// nanotime is a monotonic clock reading in nanoseconds.
func nanotime() int64 { return int64(time.Since(processStart)) + 1 } // never 0

var processStart = time.Now()
