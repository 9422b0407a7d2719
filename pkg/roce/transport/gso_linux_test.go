//go:build linux

package transport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// repeatLen is n times the length l.
func repeatLen(n, l int) []int {
	lens := make([]int, n)
	for i := range lens {
		lens[i] = l
	}
	return lens
}

// TestGSORun is the packing rule of a UDP_SEGMENT message: which
// datagrams of one destination's batch travel together. The kernel cuts
// a GSO message into segments of the first datagram's size, so only a
// run of that size, ended at most by one shorter datagram, may share a
// message; the kernel's limits (segments, bytes) and the iovecs left cut
// a run short.
func TestGSORun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lens   []int
		first  int
		room   int // datagrams the iovecs left can take
		maxGSO int // 0: maxGSOBytes4
		want   int
	}{
		{name: "one datagram", lens: []int{1000}, want: 1},
		{name: "equal sizes", lens: repeatLen(10, 1000), want: 10},
		{name: "shorter last ends the run", lens: []int{1000, 1000, 500}, want: 3},
		{name: "shorter one ends the run early", lens: []int{1000, 500, 1000}, want: 2},
		{name: "the datagram after a shorter one starts anew", lens: []int{1000, 500, 1000, 1000}, first: 2, want: 2},
		{name: "a longer one is not a segment", lens: []int{500, 1000}, want: 1},
		{name: "a longer one after a run", lens: []int{500, 500, 1000}, want: 2},
		{name: "empty first goes alone", lens: []int{0, 0, 0}, want: 1},
		{name: "empty one never joins", lens: []int{1000, 0, 1000}, want: 1},
		{name: "from the middle", lens: []int{200, 1000, 1000, 1000}, first: 1, want: 3},
		{name: "last datagram of the batch", lens: []int{1000, 1000, 1000}, first: 2, want: 1},
		{name: "segment limit", lens: repeatLen(maxGSOSegments+6, 100), want: maxGSOSegments},
		{name: "segment limit, the rest", lens: repeatLen(maxGSOSegments+6, 100), first: maxGSOSegments, want: 6},
		{name: "iovec room", lens: repeatLen(10, 100), room: 3, want: 3},
		{name: "iovec room for one", lens: repeatLen(10, 100), room: 1, want: 1},
		// 48 x 1365 = 65520 bytes: over IPv4's limit (65507), within IPv6's (65527).
		{name: "byte limit IPv4", lens: repeatLen(50, 1365), want: 47},
		{name: "byte limit IPv6", lens: repeatLen(50, 1365), maxGSO: maxGSOBytes6, want: 48},
		{name: "a shorter last that does not fit", lens: append(repeatLen(47, 1365), 1360), want: 47},
		{name: "a shorter last that fits", lens: append(repeatLen(47, 1365), 20), want: 48},
		{name: "jumbo datagrams", lens: repeatLen(10, MaxDatagramSize), want: maxGSOBytes4 / MaxDatagramSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			room := tc.room
			if room == 0 {
				room = len(tc.lens)
			}
			maxGSO := tc.maxGSO
			if maxGSO == 0 {
				maxGSO = maxGSOBytes4
			}
			bufs := dgramsOfLens(tc.lens...)
			got := gsoRun(&txSource{bufs: bufs}, tc.first, room, maxGSO)
			require.Equal(t, tc.want, got, "whole datagrams")
			// The same lengths as Gather datagrams (header, payload,
			// trailer pieces) pack the same way.
			dgrams := make([]Gather, len(bufs))
			for i, b := range bufs {
				h := min(len(b), 12)
				dgrams[i] = Gather{b[:h], b[h : len(b)-min(len(b)-h, 4)], b[len(b)-min(len(b)-h, 4):]}
				require.Equal(t, len(b), dgrams[i].Len())
			}
			require.Equal(t, tc.want, gsoRun(&txSource{dgrams: dgrams}, tc.first, room, maxGSO), "gathered datagrams")
		})
	}
}

// TestGSOAllowed: IPv4 GSO only towards loopback (the kernel would give
// the segments of a message IPv4 IDs 1, 2, … and break their ICRCs; see
// TestGSOSegmentIPv4IDs), IPv6 everywhere.
func TestGSOAllowed(t *testing.T) {
	for _, tc := range []struct {
		dst  string
		is6  bool
		want bool
	}{
		{"127.0.0.1", false, true},
		{"127.0.0.2", false, true},
		{"10.0.0.1", false, false},
		{"192.0.2.7", false, false},
		{"::1", true, true},
		{"fd00::1", true, true},
		{"2001:db8::7", true, true},
	} {
		require.Equal(t, tc.want, gsoAllowed(tc.is6, netip.MustParseAddr(tc.dst)), tc.dst)
	}
	require.Equal(t, maxGSOBytes4, maxGSOBytes(false))
	require.Equal(t, maxGSOBytes6, maxGSOBytes(true))
}

// packedMsg is what pack put in one mmsghdr, read back from the kernel
// structures themselves.
type packedMsg struct {
	dgrams  int    // datagrams it carries (txSegs)
	data    []byte // its iovecs' bytes, joined
	segSize int    // the UDP_SEGMENT cmsg's value; 0 without one
	src     []byte // the IP(V6)_PKTINFO cmsg's data; nil without one
}

func readPacked(t *testing.T, y *sockSys, msgs int) []packedMsg {
	t.Helper()
	out := make([]packedMsg, msgs)
	for i := range msgs {
		h := &y.txHdrs[i].hdr
		require.Equal(t, (*byte)(unsafe.Pointer(&y.txName)), h.Name)
		require.Equal(t, y.txNameN, h.Namelen)
		iovs := unsafe.Slice(h.Iov, h.Iovlen)
		for _, iov := range iovs {
			if iov.Len > 0 {
				out[i].data = append(out[i].data, unsafe.Slice(iov.Base, iov.Len)...)
			}
		}
		out[i].dgrams = y.txSegs[i]
		if h.Controllen == 0 {
			require.Nil(t, h.Control)
			continue
		}
		oob := unsafe.Slice(h.Control, h.Controllen)
		cms, err := unix.ParseSocketControlMessage(oob)
		require.NoError(t, err)
		for _, cm := range cms {
			switch {
			case cm.Header.Level == unix.SOL_UDP && cm.Header.Type == unix.UDP_SEGMENT:
				require.Len(t, cm.Data, 2)
				out[i].segSize = int(binary.NativeEndian.Uint16(cm.Data))
			case cm.Header.Type == unix.IP_PKTINFO || cm.Header.Type == unix.IPV6_PKTINFO:
				out[i].src = cm.Data
			default:
				t.Fatalf("message %d: unexpected cmsg %+v", i, cm.Header)
			}
		}
	}
	return out
}

// TestPackFillsMessages runs pack, the step of writeBatch that turns a
// batch into sendmmsg's mmsghdrs (no system call), and reads the messages
// back: which datagrams each carries, in order, with its UDP_SEGMENT size
// and the source-address cmsg, and where the arrays' size cuts the batch
// (writeBatch sends the rest in the next round).
func TestPackFillsMessages(t *testing.T) {
	type want struct{ dgrams, segSize int }
	for _, tc := range []struct {
		name     string
		batch    int // allocTx's n
		lens     []int
		gso      bool
		gather   bool
		src      string
		wantMsgs []want
	}{
		{name: "gso off: one message per datagram", batch: 4, lens: []int{100, 100, 100},
			wantMsgs: []want{{1, 0}, {1, 0}, {1, 0}}},
		{name: "gso: one run", batch: 4, lens: []int{100, 100, 100}, gso: true,
			wantMsgs: []want{{3, 100}}},
		{name: "gso: runs split by size", batch: 8, lens: []int{100, 100, 60, 100, 200, 200, 0}, gso: true,
			wantMsgs: []want{{3, 100}, {1, 0}, {2, 200}, {1, 0}}},
		{name: "gso, gathered: runs split by size", batch: 8, lens: []int{100, 100, 60, 100, 200, 200, 0}, gso: true, gather: true,
			wantMsgs: []want{{3, 100}, {1, 0}, {2, 200}, {1, 0}}},
		{name: "more messages than mmsghdrs", batch: 2, lens: []int{10, 20, 30, 40}, gso: true,
			wantMsgs: []want{{1, 0}, {1, 0}}},
		{name: "source address cmsg on every message", batch: 4, lens: []int{50, 50, 10, 70}, gso: true, src: "127.0.0.9",
			wantMsgs: []want{{3, 50}, {1, 0}}},
		{name: "source address without gso", batch: 4, lens: []int{50, 50}, src: "127.0.0.9",
			wantMsgs: []want{{1, 0}, {1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var y sockSys
			y.allocTx(tc.batch)
			y.setName(netip.MustParseAddrPort("127.0.0.2:4791"), false)
			var from netip.Addr
			if tc.src != "" {
				from = netip.MustParseAddr(tc.src)
			}
			y.setSource(from, false, 0)
			bufs := dgramsOfLens(tc.lens...)
			src := txSource{bufs: bufs}
			if tc.gather {
				dgrams := make([]Gather, len(bufs))
				for i, b := range bufs {
					h := min(len(b), 8)
					dgrams[i] = Gather{b[:h], nil, b[h:]} // an empty piece takes no iovec
				}
				src = txSource{dgrams: dgrams}
			}
			msgs, used := y.pack(&src, tc.gso, maxGSOBytes4)
			got := readPacked(t, &y, msgs)
			require.Len(t, got, len(tc.wantMsgs))
			next := 0 // the datagram the next message must start with
			for i, w := range tc.wantMsgs {
				require.Equal(t, w.dgrams, got[i].dgrams, "message %d: datagrams", i)
				require.Equal(t, w.segSize, got[i].segSize, "message %d: UDP_SEGMENT", i)
				require.Equal(t, bytes.Join(bufs[next:next+w.dgrams], nil), got[i].data, "message %d: bytes", i)
				if tc.src != "" {
					var pi unix.Inet4Pktinfo
					require.Len(t, got[i].src, unix.SizeofInet4Pktinfo, "message %d: pktinfo", i)
					copy(unsafe.Slice((*byte)(unsafe.Pointer(&pi)), unix.SizeofInet4Pktinfo), got[i].src)
					require.Equal(t, netip.MustParseAddr(tc.src).As4(), pi.Spec_dst, "message %d: source", i)
				} else {
					require.Nil(t, got[i].src, "message %d", i)
				}
				next += w.dgrams
			}
			require.Equal(t, next, used, "datagrams packed")
		})
	}
}

// TestPackUsesEveryIovec fills a batch whose datagrams use all three
// pieces: the iovec array (three per datagram) must not overflow, and
// the datagrams must come back whole.
func TestPackUsesEveryIovec(t *testing.T) {
	const n = 6
	var y sockSys
	y.allocTx(n)
	y.setName(netip.MustParseAddrPort("[::1]:4791"), true)
	y.setSource(netip.Addr{}, true, 0)
	bufs := dgramsOfLens(repeatLen(n, 90)...)
	dgrams := make([]Gather, n)
	for i, b := range bufs {
		dgrams[i] = Gather{b[:30], b[30:60], b[60:]}
	}
	for _, gso := range []bool{false, true} {
		t.Run(fmt.Sprint("gso=", gso), func(t *testing.T) {
			src := txSource{dgrams: dgrams}
			msgs, used := y.pack(&src, gso, maxGSOBytes6)
			require.Equal(t, n, used)
			got := readPacked(t, &y, msgs)
			var all []byte
			for _, m := range got {
				all = append(all, m.data...)
			}
			require.Equal(t, bytes.Join(bufs, nil), all)
			if gso {
				require.Equal(t, []packedMsg{{dgrams: n, data: all, segSize: 90}}, got)
			} else {
				require.Len(t, got, n)
			}
		})
	}
}
