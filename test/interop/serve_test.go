//go:build linux

package interop

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func serveCell(t *testing.T, name string) Cell {
	for _, c := range Matrix() {
		if c.Name == name {
			require.True(t, c.Serve)
			return c
		}
	}
	t.Fatalf("no cell %s", name)
	return Cell{}
}

func TestPrefillHasNoZeroWordAndNoShortPeriod(t *testing.T) {
	b := Prefill(1 << 17)
	for off := 0; off+8 <= len(b); off += 8 {
		require.NotZero(t, binary.LittleEndian.Uint64(b[off:]), off)
	}
	for _, stride := range []int{64, 128, 4096} {
		same := 0
		for i := 0; i+stride < len(b); i++ {
			if b[i] == b[i+stride] {
				same++
			}
		}
		require.Less(t, same, len(b)/2, "stride %d", stride)
	}
}

func TestCheckServeData(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	write := serveCell(t, "serve/write_bw/65536B")
	read := serveCell(t, "serve/read_bw/65536B")
	cas := serveCell(t, "serve/atomic_bw/CMP_AND_SWAP")
	faa := serveCell(t, "serve/atomic_bw/FETCH_AND_ADD")
	clone := func(b []byte) []byte { return append([]byte(nil), b...) }
	add := func(b []byte, off int, n uint64) {
		binary.LittleEndian.PutUint64(b[off:], binary.LittleEndian.Uint64(b[off:])+n)
	}
	type tc struct {
		name   string
		cell   Cell
		mutate func(b []byte)
		want   string // "" passes
	}
	cases := []tc{
		{"read untouched", read, func([]byte) {}, ""},
		{"read wrote", read, func(b []byte) { b[100] ^= 1 }, "byte 100 changed"},
		{"read wrote at end", read, func(b []byte) { b[len(b)-1] ^= 1 }, "changed"},
		{"write landed", write, func(b []byte) {
			for i := range write.Size {
				b[i] = byte(rng.Uint32())
			}
		}, ""},
		{"write zeros landed", write, func(b []byte) { clear(b[:write.Size]) }, ""},
		{"write missing", write, func([]byte) {}, "still hold the prefill"},
		{"write half", write, func(b []byte) { clear(b[:write.Size/2]) }, "still hold the prefill"},
		{"write past target", write, func(b []byte) { clear(b[:write.Size]); b[write.Size] = 0 }, "outside the region"},
		{"cas untouched", cas, func([]byte) {}, ""},
		{"cas swapped", cas, func(b []byte) { clear(b[64:72]) }, "byte 64 changed"},
		{"faa spread", faa, func(b []byte) {
			for k := range ServeClients * faa.Iters {
				add(b, (k%64)*64, 1)
			}
		}, ""},
		{"faa one word", faa, func(b []byte) { add(b, 0, uint64(ServeClients*faa.Iters)) }, ""},
		{"faa lost one", faa, func(b []byte) { add(b, 0, uint64(ServeClients*faa.Iters-1)) }, "want 400"},
		{"faa ran twice", faa, func(b []byte) { add(b, 0, uint64(ServeClients*faa.Iters)); add(b, 64, 1) }, "want 400"},
		{"faa subtracted", faa, func(b []byte) { add(b, 0, uint64(ServeClients*faa.Iters+1)); add(b, 8, ^uint64(0)) }, "more than"},
		{"faa outside", faa, func(b []byte) { add(b, 0, uint64(ServeClients*faa.Iters)); b[4096] ^= 1 }, "outside"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pre := Prefill(ServeExportSize(c.cell))
			post := clone(pre)
			c.mutate(post)
			got := CheckServeData(c.cell, ServeClients, pre, post)
			if c.want == "" {
				require.Empty(t, got)
				return
			}
			require.NotEmpty(t, got)
			require.Contains(t, strings.Join(got, "; "), c.want)
		})
	}
	require.NotEmpty(t, CheckServeData(read, ServeClients, Prefill(100), Prefill(99)), "length change")
	require.NotEmpty(t, CheckServeData(Cell{Tool: "send_bw"}, 1, nil, nil), "unknown tool")
}

func TestServeCellsRunOnlyAsRxedServer(t *testing.T) {
	n := 0
	for _, c := range Matrix() {
		if c.Mcast != nil {
			continue // TestMcastCellsInTheMatrix
		}
		if !c.Serve {
			require.True(t, c.Runs(SubjectRxe, SubjectClient), c.Name)
			continue
		}
		n++
		require.True(t, c.Runs(SubjectRxed, SubjectServer), c.Name)
		require.False(t, c.Runs(SubjectRxed, SubjectClient), c.Name)
		require.False(t, c.Runs(SubjectRxe, SubjectServer), c.Name)
		cmd := Render(ServeRxed, c, Vars{Rxed: "/x/rxed", Addr: HostIP, Port: 20001, Counters: "/x/c.json", Export: "/x/e.img"})
		require.Equal(t, "/x/rxed serve --addr 10.78.0.1 -p 20001 -m 1024 --export data=file:/x/e.img --grace 5s --counters-out /x/c.json", cmd)
		require.Contains(t, []string{"write_bw", "read_bw", "atomic_bw"}, c.Tool)
		require.LessOrEqual(t, ServeClients*c.Size*c.Iters, 8<<20, c.Name)
	}
	require.Equal(t, 5, n) // 4 over TCP, serve_R/write_bw over rdma_cm
}
