package allreduce

import "sync/atomic"

// hookPoint names a point of the package's short-lived goroutines, or of
// the call that joins them, where a test may hold things up (testHook).
type hookPoint int

const (
	watcherExits      hookPoint = iota // ring.allReduce's watcher is about to return
	watcherJoined                      // allReduce waits for it
	reqReaderExits                     // listenRequests' reader is about to return
	reqReaderJoined                    // acceptPrev waits for it
	writerExits                        // a tcpLink send's writer is about to return
	writersJoined                      // tcpLink.close waits for them
	acceptorsExit                      // one of tcpLink.acceptPrev's goroutines is about to return
	acceptorsJoined                    // tcpLink.acceptPrev waits for them as it returns
	chunkSent                          // ring.allReduce posted (started sending) a step's chunk
	closeWaitsForCall                  // Ring.Close stopped the running AllReduce or Leave and waits for it
	callBegun                          // an AllReduce or Leave was registered as the ring's running call
)

// testHook, when a test sets it, is called at each hookPoint: holding a
// goroutine at its exit point until its owner reaches the join shows
// whether the owner returns before that goroutine has ended. nil (no-op)
// outside tests. Atomic: a goroutine of one test may still read it as the
// next test sets it.
var testHook atomic.Pointer[func(hookPoint)]

func hook(p hookPoint) {
	if h := testHook.Load(); h != nil {
		(*h)(p)
	}
}
