package rdmacm_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// Many goroutines share one rdma_cm connection's QP, as pkg/ib's QP doc
// allows ("PostSend calls from several goroutines each queue their list
// in one piece"), while one goroutine polls its CQ. What is checked:
// each goroutine's messages arrive intact, exactly once and in its order;
// every accepted WR completes exactly once, in each goroutine's order; a
// list of two WRs stays in one piece at the receiver; Disconnect racing
// the posts flushes what it caught; Destroy racing the posts refuses
// later ones with ErrDestroyed.

const (
	postersN    = 8
	postsEach   = 150
	posterMsg   = 64
	posterDepth = 32 // send queue and receive queue depth
)

// posterImm is what a poster's message carries: poster, then sequence.
func posterImm(g, seq int) uint32 { return uint32(g)<<16 | uint32(seq) }

func runPosters(t *testing.T, fault *transport.FaultConfig) {
	hs := memHosts(t, fault, "10.53.0.1", "10.53.0.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.53.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()

	mk := func(h *host) (*ib.QP, *ib.CQ) {
		cq, err := h.dev.CreateCQ(4 * posterDepth)
		require.NoError(t, err)
		q, err := h.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
			Cap: ib.QPCap{MaxSendWR: posterDepth, MaxRecvWR: posterDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		require.NoError(t, ib.InitQP(q, ib.ConnectAttr{}))
		return q, cq
	}
	sq, scq := mk(srv)
	for i := range posterDepth {
		require.NoError(t, sq.PostRecv(ib.RecvWR{ID: uint64(i), SGL: []ib.SGE{srv.sge(i*posterMsg, posterMsg)}}))
	}
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			_, err = req.Accept(ctx, sq, nil)
		}
		accepted <- err
	}()
	cqp, ccq := mk(cli)
	conn, err := rdmacm.Dial(ctx, cqp, ap("10.53.0.1:7471"), &rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7})
	require.NoError(t, err)
	require.NoError(t, <-accepted)

	// The server checks every message and reposts its buffer.
	const total = postersN * postsEach
	srvDone := make(chan error, 1)
	go func() {
		next := make([]int, postersN)
		wcs := make([]ib.WC, posterDepth)
		for got := 0; got < total; {
			n, err := scq.WaitPoll(ctx, wcs)
			if err != nil {
				srvDone <- fmt.Errorf("server after %d: %w", got, err)
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Status != ib.WCSuccess {
					srvDone <- fmt.Errorf("server completion %v", wc.Status)
					return
				}
				b := srv.buf[int(wc.ID)*posterMsg:][:posterMsg]
				g, seq := int(wc.Imm>>16), int(wc.Imm&0xffff)
				if g >= postersN || seq != next[g] {
					srvDone <- fmt.Errorf("poster %d's message %d arrived where %d was due", g, seq, next[g])
					return
				}
				if binary.BigEndian.Uint32(b) != wc.Imm || binary.BigEndian.Uint32(b[posterMsg-4:]) != crc32.ChecksumIEEE(b[:posterMsg-4]) {
					srvDone <- fmt.Errorf("poster %d's message %d damaged", g, seq)
					return
				}
				next[g]++
				got++
				if err := sq.PostRecv(ib.RecvWR{ID: wc.ID, SGL: []ib.SGE{srv.sge(int(wc.ID)*posterMsg, posterMsg)}}); err != nil {
					srvDone <- err
					return
				}
			}
		}
		srvDone <- nil
	}()

	// Client: each poster owns 2 send slots per queue entry it may have
	// in flight; a slot is reused only after its completion, which the
	// poller reports per poster.
	type posterState struct {
		free chan int // slot indexes whose sends completed
	}
	states := make([]posterState, postersN)
	slotsEach := posterDepth / postersN
	for g := range states {
		states[g].free = make(chan int, slotsEach)
		for s := range slotsEach {
			states[g].free <- g*slotsEach + s
		}
	}
	pollErr := make(chan error, 1)
	pollStop := make(chan struct{})
	go func() {
		next := make([]int, postersN)
		wcs := make([]ib.WC, posterDepth)
		for done := 0; done < total; {
			n, err := ccq.WaitPoll(ctx, wcs)
			if err != nil {
				pollErr <- fmt.Errorf("client after %d: %w", done, err)
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Status != ib.WCSuccess {
					pollErr <- fmt.Errorf("client completion %v", wc.Status)
					return
				}
				g, seq, slot := int(wc.ID>>32), int(wc.ID>>16&0xffff), int(wc.ID&0xffff)
				if seq != next[g] {
					pollErr <- fmt.Errorf("poster %d's send %d completed where %d was due", g, seq, next[g])
					return
				}
				next[g]++
				done++
				states[g].free <- slot
			}
		}
		close(pollStop)
		pollErr <- nil
	}()
	var wg sync.WaitGroup
	postErr := make(chan error, postersN)
	for g := range postersN {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wr := func(seq, slot int) ib.SendWR {
				b := cli.buf[slot*posterMsg:][:posterMsg]
				binary.BigEndian.PutUint32(b, posterImm(g, seq))
				for i := 4; i < posterMsg-4; i++ {
					b[i] = byte(g*31 + seq*7 + i)
				}
				binary.BigEndian.PutUint32(b[posterMsg-4:], crc32.ChecksumIEEE(b[:posterMsg-4]))
				return ib.SendWR{ID: uint64(g)<<32 | uint64(seq)<<16 | uint64(slot), Opcode: ib.WRSendWithImm,
					Flags: ib.SendSignaled, Imm: posterImm(g, seq), SGL: []ib.SGE{cli.sge(slot*posterMsg, posterMsg)}}
			}
			for seq := 0; seq < postsEach; {
				// Odd posters post pairs: one list, in one piece.
				k := 1 + g%2
				if seq+k > postsEach {
					k = 1
				}
				var wrs []ib.SendWR
				for j := range k {
					select {
					case slot := <-states[g].free:
						wrs = append(wrs, wr(seq+j, slot))
					case <-ctx.Done():
						postErr <- ctx.Err()
						return
					}
				}
				for {
					err := cqp.PostSend(wrs...)
					var pe *ib.PostError
					if errors.As(err, &pe) && errors.Is(err, ib.ErrSendFull) && pe.Index == 0 {
						runtime.Gosched() // another poster filled the queue: its completions free it
						continue
					}
					if err != nil {
						postErr <- fmt.Errorf("poster %d: %w", g, err)
						return
					}
					break
				}
				seq += k
			}
		}()
	}
	wg.Wait()
	close(postErr)
	require.NoError(t, <-pollErr)
	for err := range postErr {
		require.NoError(t, err)
	}
	require.NoError(t, <-srvDone)

	// Disconnect racing posters, then Destroy racing them: every
	// accepted WR completes at most once (SUCCESS, or WR_FLUSH_ERR once
	// the QP is in ERR, where posts are still accepted and flushed, as
	// libibverbs providers do), none completes that was not accepted,
	// and a post begun after Destroy returned is refused with
	// ErrDestroyed. The CQ holds every completion the posters can cause
	// (phase2Posts each), so none is lost to an overflow.
	const phase2Posts = 256
	require.NoError(t, ccq.Resize(postersN*phase2Posts+posterDepth))
	var amu sync.Mutex
	acceptedWRs := map[uint64]bool{}
	start, destroyed := make(chan struct{}), make(chan struct{})
	var pg sync.WaitGroup
	for g := range postersN {
		pg.Add(1)
		go func() {
			defer pg.Done()
			<-start
			for seq := 0; ; seq++ {
				if seq == phase2Posts {
					<-destroyed
				}
				id := uint64(1)<<48 | uint64(g)<<32 | uint64(seq)
				err := cqp.PostSend(ib.SendWR{ID: id, Opcode: ib.WRSend, Flags: ib.SendSignaled,
					SGL: []ib.SGE{cli.sge(g*posterMsg, posterMsg)}})
				switch {
				case err == nil:
					amu.Lock()
					acceptedWRs[id] = true
					amu.Unlock()
				case errors.Is(err, ib.ErrDestroyed):
					select {
					case <-destroyed:
					default:
						t.Errorf("poster %d: ErrDestroyed before Destroy", g)
					}
					return
				case errors.Is(err, ib.ErrSendFull):
					seq-- // the queue is full: the same budget again
				default:
					t.Errorf("poster %d: %v", g, err)
					return
				}
				runtime.Gosched()
			}
		}()
	}
	close(start)
	require.NoError(t, conn.Disconnect(ctx))
	require.Equal(t, ib.QPSErr, cqp.State())
	close(destroyed)
	require.NoError(t, cqp.Destroy())
	pg.Wait()
	require.ErrorIs(t, cqp.PostSend(ib.SendWR{Opcode: ib.WRSend}), ib.ErrDestroyed)

	seen := map[uint64]int{}
	wcs := make([]ib.WC, posterDepth)
	for {
		n, err := ccq.PollCQ(wcs)
		require.NoError(t, err, "no completion was lost")
		if n == 0 {
			break
		}
		for _, wc := range wcs[:n] {
			if wc.Status != ib.WCSuccess && wc.Status != ib.WCWRFlushErr {
				t.Errorf("wr %#x: %v", wc.ID, wc.Status)
			}
			seen[wc.ID]++
		}
	}
	amu.Lock()
	defer amu.Unlock()
	for id, n := range seen {
		require.Equal(t, 1, n, "wr %#x completed %d times", id, n)
		require.True(t, acceptedWRs[id], "wr %#x completed but was never accepted", id)
	}
	require.NoError(t, ccq.Destroy(), "the destroyed QP released its CQ")
}

func TestConnSharedByManyPosters(t *testing.T) { runPosters(t, nil) }

func TestConnSharedByManyPostersLossy(t *testing.T) {
	runPosters(t, &transport.FaultConfig{Loss: 0.03, Reorder: 0.03, Dup: 0.01, Seed: 5})
}
