package mr

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConcurrentRegisterLookupDereg registers, looks up and deregisters
// from many goroutines while readers probe published (possibly already
// stale) keys. A reader must get either the region the key was made for
// (checked by a tag written before registration) or ErrInvalidKey, never
// another region's memory.
func TestConcurrentRegisterLookupDereg(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	const writers, readers, rounds = 8, 4, 1000
	var published [64]atomic.Uint32
	var stop atomic.Bool
	var wg, rwg sync.WaitGroup
	errs := make(chan error, writers+readers)
	type probe struct {
		key  uint32
		done chan error
	}
	probes := make(chan probe)
	var hits atomic.Int64

	for r := range readers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 99))
			for !stop.Load() {
				select {
				case p := <-probes:
					// A writer holds this key live until we answer.
					reg, err := tb.Lookup(p.key, RKey, pd, 0, 16, RemoteRead)
					if err == nil && binary.LittleEndian.Uint32(reg.Bytes()) != p.key {
						err = errors.New("probe saw another region's memory")
					}
					reg.Release()
					p.done <- err
				default:
				}
				// Readers spin; yield so blocked writers are not left
				// waiting for a preemption tick on a small machine.
				runtime.Gosched()
				key := published[rng.IntN(len(published))].Load()
				if key == 0 {
					continue
				}
				reg, err := tb.Lookup(key, RKey, pd, 0, 16, RemoteRead)
				if err != nil {
					if !errors.Is(err, ErrInvalidKey) {
						errs <- err
						return
					}
					continue
				}
				if got := binary.LittleEndian.Uint32(reg.Bytes()); got != key {
					errs <- errors.New("lookup returned another region's memory")
					reg.Release()
					return
				}
				hits.Add(1)
				reg.Release()
			}
		}()
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				buf := make([]byte, 64)
				m, err := tb.RegMR(pd, buf, LocalWrite|RemoteRead|RemoteWrite, WithIOVA(0))
				if err != nil {
					errs <- err
					return
				}
				// The tag is written before the key is published, so
				// readers that find the key see it.
				binary.LittleEndian.PutUint32(buf, m.RKey())
				published[(w*rounds+i)%len(published)].Store(m.RKey())
				reg, err := tb.Lookup(m.LKey(), LKey, pd, 0, 64, LocalWrite)
				if err != nil {
					errs <- err
					return
				}
				if binary.LittleEndian.Uint32(reg.Bytes()) != m.LKey() {
					errs <- errors.New("own lookup saw wrong memory")
				}
				reg.Release()
				if i%10 == 0 {
					p := probe{m.RKey(), make(chan error, 1)}
					probes <- p
					if err := <-p.done; err != nil {
						errs <- err
						return
					}
				}
				key := m.LKey()
				if err := m.Dereg(); err != nil {
					errs <- err
					return
				}
				if _, err := tb.Lookup(key, LKey, pd, 0, 8, 0); !errors.Is(err, ErrInvalidKey) {
					errs <- errors.New("stale key still resolves after Dereg")
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	rwg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("racing reader hits on live keys: %d", hits.Load())
	pds, mrs, _ := tb.Counts()
	require.Equal(t, 1, pds)
	require.Zero(t, mrs)
	require.NoError(t, pd.Dealloc())
}

// TestConcurrentReregLookup re-registers a region (new key, toggled access)
// while others look it up: each lookup either succeeds with the rights of
// a version that had them or fails cleanly.
func TestConcurrentReregLookup(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	buf := alignedBuf(256)
	m, err := tb.RegMR(pd, buf, LocalWrite|RemoteRead)
	require.NoError(t, err)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				runtime.Gosched() // spinning readers must not starve the writer
				reg, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA(), 256, RemoteRead)
				switch {
				case err == nil:
					if !samePtr(reg.Bytes(), buf) {
						t.Error("wrong memory")
					}
					reg.Release()
					ok.Add(1)
				case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrAccess):
					failed.Add(1)
				default:
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := range 2000 {
		access := LocalWrite | RemoteRead
		if i%2 == 0 {
			access = LocalWrite
		}
		require.NoError(t, m.Rereg(ReregAccess, nil, nil, access))
		reg, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA(), 256, RemoteRead)
		if access&RemoteRead != 0 {
			require.NoError(t, err)
			require.True(t, samePtr(reg.Bytes(), buf))
			reg.Release()
		} else {
			require.ErrorIs(t, err, ErrAccess)
		}
	}
	stop.Store(true)
	wg.Wait()
	require.NoError(t, m.Dereg())
	t.Logf("lookups ok=%d failed=%d", ok.Load(), failed.Load())
}

// TestFetchAddExactSum adds from many goroutines to one address, directly
// and through remote-atomic lookups; the sum must be exact.
func TestFetchAddExactSum(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	buf := alignedBuf(64)
	m, err := tb.RegMR(pd, buf, LocalWrite|RemoteAtomic)
	require.NoError(t, err)
	const goroutines, perG = 16, 2000
	var wg sync.WaitGroup
	var seenSum atomic.Uint64
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local uint64
			for i := range perG {
				var orig uint64
				if (g+i)%2 == 0 {
					orig = FetchAdd(buf[8:16], 3)
				} else {
					reg, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA()+8, 8, RemoteAtomic)
					if err != nil {
						t.Error(err)
						return
					}
					orig = FetchAdd(reg.Bytes(), 3)
					reg.Release()
				}
				local += orig
			}
			seenSum.Add(local)
		}()
	}
	wg.Wait()
	const total = goroutines * perG
	require.Equal(t, uint64(3*total), AtomicLoad(buf[8:16]))
	// Every original value 0,3,6,... was returned exactly once.
	require.Equal(t, uint64(3*total*(total-1)/2), seenSum.Load())
	require.Zero(t, AtomicLoad(buf[0:8]), "neighbours untouched")
	require.Zero(t, AtomicLoad(buf[16:24]), "neighbours untouched")
	require.NoError(t, m.Dereg())
}

// TestUnalignedAtomicsExactSum exercises the striped-lock path.
func TestUnalignedAtomicsExactSum(t *testing.T) {
	buf := alignedBuf(32)
	mem := buf[3:11]
	const goroutines, perG = 8, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				if (g+i)%3 == 0 {
					for {
						v := AtomicLoad(mem)
						if CompareSwap(mem, v, v+1) == v {
							break
						}
					}
				} else {
					FetchAdd(mem, 1)
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, uint64(goroutines*perG), AtomicLoad(mem))
	require.Equal(t, []byte{0, 0, 0}, buf[:3])
}

// TestCompareSwapExactlyOnce: when many goroutines race to swap the same
// expected value, exactly one wins each round.
func TestCompareSwapExactlyOnce(t *testing.T) {
	for _, misalign := range []int{0, 5} {
		buf := alignedBuf(32)
		mem := buf[misalign : misalign+8]
		const goroutines, rounds = 8, 300
		for round := range uint64(rounds) {
			var wg sync.WaitGroup
			var winners atomic.Int32
			var winner atomic.Uint64
			start := make(chan struct{})
			for g := range uint64(goroutines) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					want := round*100 + g + 1
					if CompareSwap(mem, round*100, want) == round*100 {
						winners.Add(1)
						winner.Store(want)
					}
				}()
			}
			close(start)
			wg.Wait()
			require.Equal(t, int32(1), winners.Load(), "round %d misalign %d", round, misalign)
			require.Equal(t, winner.Load(), AtomicLoad(mem))
			AtomicStore(mem, (round+1)*100)
		}
	}
}

// TestCompareSwapCounter: a CAS-retry counter from many goroutines loses no
// increment.
func TestCompareSwapCounter(t *testing.T) {
	buf := alignedBuf(8)
	const goroutines, perG = 8, 2000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perG {
				for {
					v := AtomicLoad(buf)
					if CompareSwap(buf, v, v+1) == v {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, uint64(goroutines*perG), AtomicLoad(buf))
}

// TestConcurrentWindowBindInvalidate binds and invalidates a type 2 window
// while other goroutines access it and try to deregister the region under
// it (kept pinned by a bound type 1 window): accesses see the window's
// memory or fail cleanly, and the region is never deregistered while a
// window is bound.
func TestConcurrentWindowBindInvalidate(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	buf := alignedBuf(128)
	m, err := tb.RegMR(pd, buf, LocalWrite|MWBind)
	require.NoError(t, err)
	pin, err := tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	_, err = pin.Bind(m, m.IOVA(), 8, RemoteRead)
	require.NoError(t, err)
	w, err := tb.AllocMW(pd, MWType2)
	require.NoError(t, err)
	const qpn, rounds = 5, 1000
	var rkey atomic.Uint32
	var stop atomic.Bool
	var wg sync.WaitGroup
	var hits atomic.Int64
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				runtime.Gosched()
				reg, err := tb.LookupQP(rkey.Load(), RKey, pd, qpn, 0, 8, RemoteAtomic)
				switch {
				case err == nil:
					if !samePtr(reg.Bytes(), buf[64:]) {
						t.Error("window resolved to wrong memory")
					}
					FetchAdd(reg.Bytes(), 1)
					hits.Add(1)
					reg.Release()
				case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidated):
				default:
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			runtime.Gosched()
			if err := m.Dereg(); !errors.Is(err, ErrMWBound) {
				t.Errorf("dereg under bound windows: %v", err)
				return
			}
		}
	}()
	cur := w.RKey()
	own := 0
	for range rounds {
		k, err := tb.BindMW(pd, qpn, Bind{MWKey: cur, NewKey: IncKey(cur), MRKey: m.LKey(), Addr: m.IOVA() + 64, Length: 8, Access: RemoteAtomic | ZeroBased})
		require.NoError(t, err)
		require.NotEqual(t, cur, k)
		rkey.Store(k)
		cur = k
		reg, err := tb.LookupQP(k, RKey, pd, qpn, 0, 8, RemoteAtomic)
		require.NoError(t, err)
		FetchAdd(reg.Bytes(), 1)
		own++
		reg.Release()
		require.NoError(t, tb.Invalidate(pd, qpn, k))
	}
	stop.Store(true)
	wg.Wait()
	require.Equal(t, uint64(own)+uint64(hits.Load()), AtomicLoad(buf[64:]), "every successful access landed in the window")
	require.ErrorIs(t, m.Dereg(), ErrMWBound)
	require.NoError(t, pin.Dealloc())
	require.NoError(t, m.Dereg(), "no window bound: region can go")
	t.Logf("racing window accesses: %d", hits.Load())
}
