package transport

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The portable path (portable_batch.go) is what every system but Linux
// runs, and nothing else in this package exercises it on Linux: these
// tests drive it against real loopback sockets.

// tooLongForUDP4 is one byte over the largest UDP payload of an IPv4
// packet (65535 - 20 - 8): every system refuses to send it (EMSGSIZE
// on Linux and the BSDs; macOS and FreeBSD refuse from 9217 bytes on).
const tooLongForUDP4 = 65508

// openPortable opens a socket of the portable path on a's loopback
// address, as OpenUDP does elsewhere, closed when the test ends.
func openPortable(t *testing.T, a netip.Addr) *udpSocket {
	t.Helper()
	c := &udpConn{log: slog.New(slog.DiscardHandler), closed: make(chan struct{})}
	s, err := openPortableSocket(c, netip.AddrPortFrom(a, 0), &UDPConfig{SocketBufferBytes: DefaultSocketBufferBytes})
	require.NoError(t, err)
	s.addr = GIDAddr(s.local.Addr())
	t.Cleanup(func() { _ = s.closePortable() })
	// A datagram that never comes fails the read instead of hanging it.
	require.NoError(t, s.pc.SetReadDeadline(time.Now().Add(receiveTimeout)))
	return s
}

// closingWriter is the socket closed after its first writes sends: the
// next one finds it closed, as a send racing the Conn's Close does.
type closingWriter struct {
	pc     *net.UDPConn
	writes int
}

func (w *closingWriter) WriteToUDPAddrPort(b []byte, to netip.AddrPort) (int, error) {
	if w.writes == 0 {
		_ = w.pc.Close()
	}
	w.writes--
	return w.pc.WriteToUDPAddrPort(b, to)
}

// readOne reads the next datagram s receives, copied.
func readOne(t *testing.T, s *udpSocket) rxMsg {
	t.Helper()
	b := &rxBatch{sock: s, msgs: make([]rxMsg, 1)}
	n, err := s.readPortable(b, make([]byte, s.slotSz+1))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	m := b.msgs[0]
	m.data = bytes.Clone(m.data)
	return m
}

// TestPortableSendCountsEachDatagramOnce is TestSendCountsEachDatagramOnce
// for the portable path, with the kernel's own refusals: every datagram
// counts once, in sent and sentBytes when it went, in the error's
// Refused and Index (what transport.EachRefused walks: the pcap
// recorder's and the daemon's reading) when it did not; a refusal does
// not stop the rest of the batch, and a socket closed mid-batch refuses
// the rest. The receiver gets exactly the datagrams counted sent, in
// order, and then the marker sent after the batch.
//
// Bug reference (portability task, item 1b): the portable path was
// never compiled or run here, so its accounting had no test.
func TestPortableSendCountsEachDatagramOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lens      []int
		writes    int // sends before the socket closes; -1: it stays open
		wantSent  []int
		wantIndex []int // the refused datagrams' positions (SendError.Index)
		closed    bool  // the refusal is the closed socket's
	}{
		{name: "all fit", lens: []int{100, 1400, 7}, writes: -1, wantSent: []int{100, 1400, 7}},
		{name: "one refused in the middle", lens: []int{100, tooLongForUDP4, 101, 102}, writes: -1,
			wantSent: []int{100, 101, 102}, wantIndex: []int{1}},
		{name: "refused at both ends", lens: []int{tooLongForUDP4, 5, 6, tooLongForUDP4 + 1000}, writes: -1,
			wantSent: []int{5, 6}, wantIndex: []int{0, 3}},
		{name: "every one refused", lens: []int{tooLongForUDP4, tooLongForUDP4, tooLongForUDP4 + 1}, writes: -1,
			wantIndex: []int{0, 1, 2}},
		{name: "closed after two sends", lens: []int{1, 2, 3, 4, 5}, writes: 2,
			wantSent: []int{1, 2}, wantIndex: []int{2, 3, 4}, closed: true},
		{name: "closed before the first", lens: []int{1, 2}, writes: 0, wantIndex: []int{0, 1}, closed: true},
		{name: "refused, then closed", lens: []int{1, tooLongForUDP4, 3, 4}, writes: 3,
			wantSent: []int{1, 3}, wantIndex: []int{1, 3}, closed: true},
	} {
		for _, gather := range []bool{false, true} {
			t.Run(fmt.Sprint(tc.name, "/gather ", gather), func(t *testing.T) {
				snd, rcv := openPortable(t, lo1), openPortable(t, lo2)
				to := rcv.local
				var tx portableTx
				if tc.writes >= 0 {
					tx.w = &closingWriter{pc: snd.pc, writes: tc.writes}
				}
				bufs := dgramsOfLens(tc.lens...)
				var sent int
				var sentBytes uint64
				var err error
				if gather {
					g := make([]Gather, len(bufs))
					for i, b := range bufs { // three pieces each, as the engine's
						g[i] = Gather{b[:len(b)/3], b[len(b)/3 : len(b)/2], b[len(b)/2:]}
					}
					sent, sentBytes, err = snd.writePortable(&tx, nil, g, to)
				} else {
					sent, sentBytes, err = snd.writePortable(&tx, bufs, nil, to)
				}

				var wantBytes uint64
				for _, l := range tc.wantSent {
					wantBytes += uint64(l)
				}
				require.Equal(t, len(tc.wantSent), sent, "sent")
				require.Equal(t, wantBytes, sentBytes, "sentBytes")
				require.Equal(t, len(tc.lens), sent+Refused(err, len(tc.lens)), "each datagram counted once")
				var each []int
				EachRefused(err, len(tc.lens), func(k int) { each = append(each, k) })
				require.Equal(t, tc.wantIndex, each, "EachRefused")
				if tc.wantIndex == nil {
					require.NoError(t, err)
				} else {
					var se *SendError
					require.ErrorAs(t, err, &se)
					require.Equal(t, tc.wantIndex, se.Index, "SendError.Index")
					require.Equal(t, len(tc.wantIndex), se.Refused, "SendError.Refused")
					switch {
					case tc.closed:
						require.ErrorIs(t, err, net.ErrClosed, "a closed socket's refusal is the one reported")
					case runtime.GOOS == "linux":
						require.ErrorIs(t, err, syscall.EMSGSIZE)
					}
				}

				// What went arrives, in order, and nothing else before the
				// marker (sent from another socket when this one closed).
				marker := []byte("marker")
				from := snd
				if tc.closed {
					from = openPortable(t, lo1)
				}
				_, _, err = from.writePortable(&portableTx{}, [][]byte{marker}, nil, to)
				require.NoError(t, err)
				for i, l := range tc.wantSent {
					m := readOne(t, rcv)
					require.Len(t, m.data, l, "datagram %d of those sent", i)
					require.Equal(t, bytes.Repeat(m.data[:1], l), m.data, "datagram %d of those sent", i)
					require.Equal(t, snd.local, m.remote, "datagram %d's source", i)
					require.Equal(t, lo2, m.local, "datagram %d's destination", i)
				}
				require.Equal(t, marker, readOne(t, rcv).data, "the marker follows the datagrams sent")
			})
		}
	}
}

// TestPortableReceivesSeveralDatagrams: datagrams of several sizes from
// two senders, read one per call (readPortable: no recvmmsg) and handed
// out by the Conn's own drain, arrive whole with their source and the
// bound address as destination; one over MaxDatagramSize is marked
// truncated and dropped (DropOversize), as on Linux. Bug reference: as
// TestPortableSendCountsEachDatagramOnce.
func TestPortableReceivesSeveralDatagrams(t *testing.T) {
	a, b, rcv := openPortable(t, lo1), openPortable(t, lo1), openPortable(t, lo2)
	c := rcv.conn
	type dgram struct {
		from *udpSocket
		data []byte
		over bool // longer than MaxDatagramSize: dropped
	}
	var want []dgram
	for i, l := range []int{60, 1000, MaxDatagramSize, 7, 0} {
		want = append(want, dgram{from: []*udpSocket{a, b}[i%2], data: bytes.Repeat([]byte{byte(i + 1)}, l)})
	}
	if runtime.GOOS == "linux" { // macOS and FreeBSD refuse to send it (net.inet.udp.maxdgram)
		want = append(want[:2], append([]dgram{{from: b, data: bytes.Repeat([]byte{9}, MaxDatagramSize+1), over: true}}, want[2:]...)...)
	}
	for _, d := range want {
		_, _, err := d.from.writePortable(&portableTx{}, [][]byte{d.data}, nil, rcv.local)
		require.NoError(t, err)
	}
	buf := make([]byte, rcv.slotSz+1)
	out := [][]byte{make([]byte, MaxDatagramSize)}
	sizes, eps := make([]int, 1), make([]Endpoint, 1)
	for i, d := range want {
		bt := &rxBatch{sock: rcv, msgs: make([]rxMsg, 1)}
		bt.lease.home = bt
		n, err := rcv.readPortable(bt, buf)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, d.over, bt.msgs[0].trunc, "datagram %d marked oversize", i)
		c.open(bt, n)
		got := c.drain(out, sizes, eps)
		if d.over {
			require.Zero(t, got, "datagram %d of %d bytes handed out", i, len(d.data))
			continue
		}
		require.Equal(t, 1, got, "datagram %d", i)
		require.Equal(t, d.data, out[0][:sizes[0]], "datagram %d", i)
		require.Equal(t, Endpoint{Local: rcv.local, Remote: d.from.local}, eps[0], "datagram %d", i)
	}
	st := c.stats.snapshot()
	wantOver := 0
	for _, d := range want {
		if d.over {
			wantOver++
		}
	}
	require.Equal(t, uint64(wantOver), st.DropOversize)
	require.Equal(t, uint64(len(want)-wantOver), st.ReceivedPackets)
}

// TestPortableReadHooked: readBatchHooked's portable form reads only
// once it holds the receiver's locks, and lets them go when the read
// fails (a closed socket), reporting that it no longer holds them.
func TestPortableReadHooked(t *testing.T) {
	snd, rcv := openPortable(t, lo1), openPortable(t, lo2)
	buf := make([]byte, rcv.slotSz+1)
	b := &rxBatch{sock: rcv, msgs: make([]rxMsg, 1)}
	var holds, releases int
	hold := func(ok bool) func() bool { return func() bool { holds++; return ok } }
	release := func() { releases++ }

	n, held, err := rcv.readHookedPortable(b, buf, hold(false), release)
	require.NoError(t, err)
	require.True(t, held, "a hold refused is no failure of the socket")
	require.Zero(t, n, "read without the locks")

	_, _, err = snd.writePortable(&portableTx{}, [][]byte{[]byte("one")}, nil, rcv.local)
	require.NoError(t, err)
	n, held, err = rcv.readHookedPortable(b, buf, hold(true), release)
	require.NoError(t, err)
	require.True(t, held)
	require.Equal(t, 1, n)
	require.Equal(t, []byte("one"), b.msgs[0].data)
	require.Zero(t, releases, "returns holding the locks")

	require.NoError(t, rcv.closePortable())
	n, held, err = rcv.readHookedPortable(b, buf, hold(true), release)
	require.True(t, errors.Is(err, net.ErrClosed), "%v", err)
	require.False(t, held)
	require.Zero(t, n)
	require.Equal(t, 1, releases, "a failed read lets the locks go")
	require.Equal(t, 3, holds)
}
