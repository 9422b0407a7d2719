package kv

import (
	"encoding/binary"
	"runtime"
	"sync/atomic"
)

// App is the server application: the table and what its request handlers
// did. The RDMA and TCP servers of one App serve the same table; their
// handlers count separately so a benchmark can say how much server code
// a GET ran on each path (over RDMA: none, the engine answers the READs).
type App struct {
	table      *Table
	rdma       handlerStats
	tcp        handlerStats
	measureCPU bool // set before serving (MeasureHandlerCPU), read only after
}

// NewApp returns the application serving t.
func NewApp(t *Table) *App { return &App{table: t} }

// MeasureHandlerCPU makes the servers' handler goroutines measure their
// CPU time (HandlerStats.CPUNanos), which locks each to its OS thread so
// that the thread's CPU clock is the handler's alone. Call it before
// ServeRDMA and ServeTCP. Off by default because the lock is not free:
// every time a locked goroutine is woken, the scheduler hands its P to
// that one thread, a thread switch per request on a busy server. On the
// 2-core VM, with the handlers locked, 16 TCP clients got 24,000-40,000
// GETs/s instead of 83,000-118,000, and one RDMA client's GET p99 among
// 10% PUTs was 281-317 us instead of 45-63 (docs/performance.md,
// session X).
func (a *App) MeasureHandlerCPU() { a.measureCPU = true }

// handlerThread locks the calling handler goroutine to its thread when
// the handlers' CPU is measured, and returns the matching unlock.
func (a *App) handlerThread() (unlock func()) {
	if !a.measureCPU {
		return func() {}
	}
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}

// handlerCPU is the calling thread's CPU time when the handlers' CPU is
// measured, else 0 (so every difference is 0).
func (a *App) handlerCPU() uint64 {
	if !a.measureCPU {
		return 0
	}
	return threadCPU()
}

// Table returns the application's table.
func (a *App) Table() *Table { return a.table }

// handlerStats are one transport's handler counters, updated atomically.
type handlerStats struct {
	gets, puts, deletes, bad atomic.Uint64
	cpuNanos                 atomic.Uint64
	copied                   atomic.Uint64
}

// HandlerStats is a snapshot of one transport's request handlers: how
// many requests of each kind they ran, the CPU time of the goroutines
// running them (with App.MeasureHandlerCPU, else 0: thread CPU time of
// handler goroutines locked to their OS threads, so this is the server
// application's work including its socket system calls, and excludes
// the engine's), and the value bytes the handlers copied.
type HandlerStats struct {
	Gets, Puts, Deletes, Bad uint64
	CPUNanos                 uint64
	BytesCopied              uint64
}

// Calls is the number of requests handled.
func (s HandlerStats) Calls() uint64 { return s.Gets + s.Puts + s.Deletes + s.Bad }

// Sub returns s minus an earlier snapshot.
func (s HandlerStats) Sub(o HandlerStats) HandlerStats {
	return HandlerStats{s.Gets - o.Gets, s.Puts - o.Puts, s.Deletes - o.Deletes, s.Bad - o.Bad,
		s.CPUNanos - o.CPUNanos, s.BytesCopied - o.BytesCopied}
}

func (h *handlerStats) snapshot() HandlerStats {
	return HandlerStats{h.gets.Load(), h.puts.Load(), h.deletes.Load(), h.bad.Load(), h.cpuNanos.Load(), h.copied.Load()}
}

// Stats returns the RDMA and the TCP handlers' counters.
func (a *App) Stats() (rdma, tcp HandlerStats) { return a.rdma.snapshot(), a.tcp.snapshot() }

// handle applies one request and appends the response to out.
func (a *App) handle(st *handlerStats, msg []byte, out []byte) []byte {
	req, err := parseRequest(msg)
	if err != nil {
		st.bad.Add(1)
		return appendResponse(out, statusBadRequest, 0, nil)
	}
	switch req.op {
	case opGet:
		st.gets.Add(1)
		n := len(out) + respHdrLen
		out = appendResponse(out, statusOK, req.id, nil)
		out, err = a.table.appendGet(out, req.key)
		if err != nil {
			return appendResponse(out[:n-respHdrLen], statusOf(err), req.id, nil)
		}
		st.copied.Add(uint64(len(out) - n))
		putU32(out[n-respHdrLen+4:], uint32(len(out)-n))
		return out
	case opPut:
		st.puts.Add(1)
		st.copied.Add(uint64(len(req.val)))
		return appendResponse(out, statusOf(a.table.Put(req.key, req.val)), req.id, nil)
	case opDelete:
		st.deletes.Add(1)
		return appendResponse(out, statusOf(a.table.Delete(req.key)), req.id, nil)
	case opStats:
		return appendResponse(out, statusOK, req.id, a.encodeStats())
	}
	st.bad.Add(1)
	return appendResponse(out, statusBadRequest, req.id, nil)
}

const statsFields = 6

func (a *App) encodeStats() []byte {
	r, t := a.Stats()
	b := make([]byte, 0, 2*statsFields*8)
	for _, s := range []HandlerStats{r, t} {
		for _, v := range []uint64{s.Gets, s.Puts, s.Deletes, s.Bad, s.CPUNanos, s.BytesCopied} {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	}
	return b
}

func decodeStats(b []byte) (rdma, tcp HandlerStats, ok bool) {
	if len(b) != 2*statsFields*8 {
		return rdma, tcp, false
	}
	var v [2 * statsFields]uint64
	for i := range v {
		v[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	rdma = HandlerStats{v[0], v[1], v[2], v[3], v[4], v[5]}
	tcp = HandlerStats{v[6], v[7], v[8], v[9], v[10], v[11]}
	return rdma, tcp, true
}
