//go:build unix

package mr

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func writeFile(t *testing.T, size int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "export.bin")
	require.NoError(t, os.WriteFile(path, make([]byte, size), 0o600))
	return path
}

// TestMappedFileRegion writes through a region over a file mapping, syncs,
// unmaps and reads the file back.
func TestMappedFileRegion(t *testing.T) {
	size := 3 * pageSize
	path := writeFile(t, size)
	mp, err := MapFile(path, size, true)
	require.NoError(t, err)
	require.Equal(t, size, mp.Len())
	require.Equal(t, path, mp.Path())

	tb := newTestTable(t)
	pd := mustPD(t, tb)
	// Register the middle of the mapping, zero based, persistable.
	buf := mp.Bytes()[100 : 100+2*pageSize]
	m, err := tb.RegMR(pd, buf, LocalWrite|RemoteWrite|RemoteRead|FlushPersistent, WithIOVA(0), WithMapping(mp))
	require.NoError(t, err)

	payload := bytes.Repeat([]byte("rxed!"), 1000)
	reg, err := tb.Lookup(m.RKey(), RKey, pd, 1000, uint64(len(payload)), RemoteWrite)
	require.NoError(t, err)
	copy(reg.Bytes(), payload)
	require.NoError(t, reg.Persist())

	// The mapping cannot go while the region exists or the Region is held.
	require.ErrorIs(t, mp.Close(), ErrMappingBusy)
	require.NoError(t, m.Dereg())
	require.ErrorIs(t, mp.Close(), ErrMappingBusy, "a Region of the deregistered region is still held")
	require.Equal(t, payload[:5], reg.Bytes()[:5], "memory stays mapped while held")
	reg.Release()
	require.NoError(t, mp.Sync())
	require.NoError(t, mp.Close())
	require.ErrorIs(t, mp.Close(), ErrMappingClosed)
	require.ErrorIs(t, mp.Sync(), ErrMappingClosed)
	require.Nil(t, mp.Bytes())

	got, err := os.ReadFile(path)
	require.NoError(t, err)
	want := make([]byte, size)
	copy(want[100+1000:], payload)
	require.Equal(t, want, got)

	// Re-open and read back through a region too.
	mp2, err := MapFile(path, 0, false)
	require.NoError(t, err)
	m2, err := tb.RegMR(pd, mp2.Bytes(), 0, WithMapping(mp2))
	require.NoError(t, err)
	reg, err = tb.Lookup(m2.LKey(), LKey, pd, m2.IOVA()+1100, uint64(len(payload)), 0)
	require.NoError(t, err)
	require.Equal(t, payload, reg.Bytes())
	reg.Release()
	require.NoError(t, m2.Dereg())
	require.NoError(t, mp2.Close())
}

func TestMapFileErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := MapFile(filepath.Join(dir, "missing"), 4096, true)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorContains(t, err, "missing")

	small := writeFile(t, 100)
	_, err = MapFile(small, 4096, true)
	require.ErrorIs(t, err, ErrFileTooSmall)
	require.ErrorContains(t, err, "100 bytes")

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, err = MapFile(empty, 0, false)
	require.ErrorIs(t, err, ErrEmptyBuffer)

	_, err = MapFile(dir, 10, false)
	require.ErrorIs(t, err, ErrInvalidArgument, "a directory")

	_, err = MapAnonymous(0)
	require.ErrorIs(t, err, ErrEmptyBuffer)
}

func TestMappingRegistrationRules(t *testing.T) {
	path := writeFile(t, pageSize)
	ro, err := MapFile(path, pageSize, false)
	require.NoError(t, err)
	defer ro.Close()
	require.False(t, ro.Writable())
	tb := newTestTable(t)
	pd := mustPD(t, tb)

	_, err = tb.RegMR(pd, ro.Bytes(), RemoteRead|FlushPersistent, WithMapping(ro))
	require.ErrorIs(t, err, ErrUnsupportedAccess, "read-only mapping cannot be persisted to")
	_, err = tb.RegMR(pd, make([]byte, 8), 0, WithMapping(ro))
	require.ErrorIs(t, err, ErrNotInMapping)

	anon, err := MapAnonymous(2 * pageSize)
	require.NoError(t, err)
	require.NoError(t, anon.Sync(), "no-op for anonymous memory")
	_, err = tb.RegMR(pd, anon.Bytes(), LocalWrite|FlushPersistent, WithMapping(anon))
	require.ErrorIs(t, err, ErrUnsupportedAccess, "anonymous memory is not persistent")
	m, err := tb.RegMR(pd, anon.Bytes()[8:], LocalWrite|RemoteAtomic, WithMapping(anon))
	require.NoError(t, err)
	reg, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA(), 8, RemoteAtomic)
	require.NoError(t, err)
	require.Zero(t, FetchAdd(reg.Bytes(), 5))
	require.NoError(t, reg.Persist())
	reg.Release()
	// Rereg onto plain memory drops the pin once the old version is gone.
	require.NoError(t, m.Rereg(ReregTranslation, nil, make([]byte, 16), 0))
	require.NoError(t, anon.Close())
	_, err = tb.RegMR(pd, make([]byte, 8), 0, WithMapping(anon))
	require.ErrorIs(t, err, ErrMappingClosed)
	require.NoError(t, m.Dereg())
	_, mrs, _ := tb.Counts()
	require.Zero(t, mrs)
}

// TestMappingPinnedWithoutOption: a region over mapped memory pins the
// mapping even when WithMapping was not given.
func TestMappingPinnedWithoutOption(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shm")
	mp, err := CreateMapFile(path, 100)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, int64(100), fi.Size(), "created and grown")
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	m, err := tb.RegMR(pd, mp.Bytes()[10:20], LocalWrite|FlushPersistent)
	require.NoError(t, err, "persistable: the mapping was found")
	require.ErrorIs(t, mp.Close(), ErrMappingBusy)
	require.NoError(t, m.Dereg())
	require.NoError(t, mp.Close())

	// Re-creating never shrinks an existing file.
	mp, err = CreateMapFile(path, 50)
	require.NoError(t, err)
	require.NoError(t, mp.Close())
	fi, err = os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, int64(100), fi.Size())
	_, err = CreateMapFile(path, 0)
	require.ErrorIs(t, err, ErrEmptyBuffer)
	_, err = CreateMapFile(filepath.Join(path, "sub"), 10)
	require.Error(t, err, "parent is a file")
}

// TestMappingCloseWhileLookingUp closes mappings while other goroutines
// look up which mapping a buffer lies in, as RegMR does for every region.
// Bug (found by a -race -count=2 hunt, session AE): Close held the
// mapping's lock while it took the list of open mappings, and the lookup
// held the list while it took each mapping's lock, so `rxed serve`
// shutting down (closing its exports) while another goroutine of the
// process registered memory could deadlock both for good.
func TestMappingCloseWhileLookingUp(t *testing.T) {
	const lookers, closers, rounds = 4, 4, 2000
	buf := make([]byte, 64) // in no mapping: every lookup walks the whole list
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range lookers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if m := mappingOf(buf); m != nil {
					t.Errorf("a Go buffer found in mapping %p", m)
					return
				}
			}
		}()
	}
	var closing sync.WaitGroup
	for range closers {
		closing.Add(1)
		go func() {
			defer closing.Done()
			for range rounds {
				m, err := MapAnonymous(pageSize)
				if err != nil {
					t.Error(err)
					return
				}
				if got := mappingOf(m.Bytes()); got != m {
					t.Errorf("mapping %p not found over its own bytes (got %p)", m, got)
				}
				if err := m.Close(); err != nil {
					t.Error(err)
					return
				}
				if got := mappingOf(m.Bytes()); got != nil {
					t.Errorf("closed mapping %p still found", got)
				}
			}
		}()
	}
	closed := make(chan struct{})
	go func() { closing.Wait(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		// Only a deadlock takes this long: 8,000 map-and-close rounds
		// take well under a second.
		close(done)
		t.Fatal("Close and mappingOf deadlocked (lock order: openMappings before Mapping.mu)")
	}
	close(done)
	wg.Wait()
}
