package roce

// The doorbell batch (Config.DoorbellBatch).
//
// A NIC's doorbell is a write to device memory: a post costs the
// application almost nothing, and the NIC batches what it finds. rxed's
// doorbell is a system call: a post that finds its shard idle sends its
// packets at once (Engine.kick), one sendmsg per post, as rxe's
// ibv_post_send is one write to the kernel. Where many goroutines post
// and spin on one device (a key-value client of 16 connections on one
// CPU), those calls are most of the device's work: `rxed kv bench` at 16
// clients spent 30% of the client's CPU in one sendto per GET, and the
// server answered each READ alone, one recvmmsg and one sendmsg per GET
// (docs/performance.md, session X).
//
// With a DoorbellBatch, while at least doorbellSpinners goroutines spin
// on the engine's completions (SpinWhileBusy: ib.HybridWaiter), a post
// leaves its packets in the shard's batch, kept (keptUntil) for up to
// DoorbellBatch; later posts join it. The batch leaves in one send (one
// GSO message on Linux, which the peer's UDP GRO socket takes as one
// chunk, its answers then leaving together too) when it holds
// doorbellBatchMax packets, when a poll finds it kept that long
// (release, Engine.sendKept) or, if no goroutine polls, when the
// worker's timer (armed for keptUntil) goes off. Fewer spinners, and a
// post finds the batch sent at once as before: a lone ping-pong's round
// trip does not wait for company that cannot come.
//
// Measured (`rxed kv bench -s 64 -get 100`, 16 clients, the server in
// its own process, each with one CPU): 89,500-91,500 GETs/s without,
// 172,000-191,000 with 20 us; p50 135-139 -> 73-78 us.

// doorbellSpinners is how many goroutines must spin on the engine's
// completions for a post to wait for others: with fewer, the posts that
// could join are too few to pay for the wait (4 clients: 97,000 GETs/s
// either way; 8: 96,000 at a threshold of 8, 170,000 at 4).
const doorbellSpinners = 4

// doorbellBatchMax is the most packets a kept batch of posts gathers
// before it is sent.
const doorbellBatchMax = 16

// batchDoorbells reports whether a post now waits for others to join it.
func (e *Engine) batchDoorbells() bool {
	return e.doorbell > 0 && e.spinners.Load() >= doorbellSpinners
}

// releasePosted ends an inline ownership taken to run a posting QP
// (Engine.kick with batchDoorbells): as releaseInline, but what the post
// built stays kept for later posts to join (release keeps a batch while
// holdsPosts), unless the batch is full or already late. A batch kept
// for an answer (keep) is sent with the post, as releaseInline sends it.
func (w *worker) releasePosted() {
	if w.txN > 0 && w.keptUntil.IsZero() {
		w.keepFor(w.e.doorbell)
		w.keptPosts = true
		w.e.doorbellBatches.Add(1)
	}
	w.release(false, false)
}

// holdsPosts reports whether the shard's batch is posts still waiting
// for others: kept for them (never empty then: every flush unkeeps), not
// yet full, and not yet late.
func (w *worker) holdsPosts() bool {
	return w.keptPosts && w.txN < min(doorbellBatchMax, w.txSize) && w.clockNow().Before(w.keptUntil)
}
