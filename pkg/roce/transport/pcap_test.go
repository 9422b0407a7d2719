package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/wire"
)

// rocePacket builds a UDP payload that looks like an RC SEND_ONLY (BTH,
// payload, ICRC slot); the caller seals it.
func rocePacket(psn uint32, payloadLen int) []byte {
	p := make([]byte, wire.BTHLen+payloadLen+wire.ICRCLen)
	p[0] = byte(wire.RCSendOnly)
	p[1] = 0x40 // M, pad 0, TVer 0
	binary.BigEndian.PutUint16(p[2:], 0xffff)
	binary.BigEndian.PutUint32(p[4:], 0x000011) // dest QP 0x11
	binary.BigEndian.PutUint32(p[8:], 0x80000000|psn)
	for i := range payloadLen {
		p[wire.BTHLen+i] = byte(i)
	}
	return p
}

type frame struct {
	ip4  *layers.IPv4
	ip6  *layers.IPv6
	udp  *layers.UDP
	eth  *layers.Ethernet
	ts   time.Time
	data []byte
}

func readPcap(t *testing.T, b []byte) []frame {
	t.Helper()
	r, err := pcapgo.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	require.Equal(t, layers.LinkTypeEthernet, r.LinkType())
	var out []frame
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		pkt := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		require.Nil(t, pkt.ErrorLayer(), "decode error")
		f := frame{ts: ci.Timestamp, data: data}
		f.eth, _ = pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		f.ip4, _ = pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		f.ip6, _ = pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		f.udp, _ = pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		require.NotNil(t, f.udp)
		out = append(out, f)
	}
	return out
}

// icrcOK checks a frame's ICRC against the IP and UDP headers in the frame.
func icrcOK(f frame) wire.Verdict {
	var ip []byte
	if f.ip4 != nil {
		ip = f.ip4.Contents
	} else {
		ip = f.ip6.Contents
	}
	return wire.VerifyICRC(ip, f.udp.Contents, f.udp.Payload)
}

type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fixedClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

func TestPcapRecorderFrames(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst netip.AddrPort
	}{
		{"ipv4", ap("10.0.0.1:49152"), ap("10.0.0.2:4791")},
		{"ipv6", ap("[fd77::12]:49152"), ap("[fd77::11]:4791")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mn := NewMemNetwork()
			a, err := mn.Listen(tc.src)
			require.NoError(t, err)
			b, err := mn.Listen(tc.dst)
			require.NoError(t, err)
			clk := &fixedClock{t: time.Unix(1700000000, 0)}
			var wa, wb bytes.Buffer
			ra, err := NewPcapRecorder(a, &wa, PcapOptions{Clock: clk.now})
			require.NoError(t, err)
			rb, err := NewPcapRecorder(b, &wb, PcapOptions{Clock: clk.now})
			require.NoError(t, err)
			defer ra.Close()
			defer rb.Close()

			fl := wire.Flow{Src: tc.src, Dst: tc.dst}
			var sent [][]byte
			for i, n := range []int{0, 64, 1024, 4096} {
				p := rocePacket(uint32(i), n)
				fl.Seal(p)
				sent = append(sent, p)
			}
			// No explicit local address: the recorder must find it.
			require.NoError(t, ra.Send(sent, Endpoint{Remote: tc.dst}))
			got := receiveN(t, rb, len(sent), MaxDatagramSize)
			require.Len(t, got, len(sent))
			require.NoError(t, ra.Err())
			require.NoError(t, rb.Err())

			for _, side := range [][]byte{wa.Bytes(), wb.Bytes()} {
				frames := readPcap(t, side)
				require.Len(t, frames, len(sent))
				for i, f := range frames {
					require.Equal(t, sent[i], []byte(f.udp.Payload))
					require.Equal(t, layers.UDPPort(tc.src.Port()), f.udp.SrcPort)
					require.Equal(t, layers.UDPPort(tc.dst.Port()), f.udp.DstPort)
					require.Equal(t, uint16(0), f.udp.Checksum)
					require.Equal(t, uint16(8+len(sent[i])), f.udp.Length)
					if f.ip4 != nil {
						require.Equal(t, tc.src.Addr().AsSlice(), []byte(f.ip4.SrcIP))
						require.Equal(t, tc.dst.Addr().AsSlice(), []byte(f.ip4.DstIP))
						require.Equal(t, uint16(0), f.ip4.Id)
						require.Equal(t, layers.IPv4DontFragment, f.ip4.Flags)
						require.Equal(t, uint8(64), f.ip4.TTL)
						require.Equal(t, wire.IPv4Checksum(f.ip4.Contents), uint16(0), "header checksum verifies")
					} else {
						require.NotNil(t, f.ip6)
						require.Equal(t, tc.src.Addr().AsSlice(), []byte(f.ip6.SrcIP))
						require.Equal(t, uint8(64), f.ip6.HopLimit)
						require.Equal(t, uint16(8+len(sent[i])), f.ip6.Length)
					}
					require.Equal(t, wire.ICRCOK, icrcOK(f), "frame %d ICRC", i)
				}
			}
			require.True(t, readPcap(t, wa.Bytes())[1].ts.After(readPcap(t, wa.Bytes())[0].ts))
		})
	}
}

// answeringConn is a Conn whose peer answers a datagram before the Send
// of it returns, as a spinning peer can over loopback, where the kernel
// delivers the datagram inside the sender's system call: Send waits until
// this Conn's Receive has returned the answer.
type answeringConn struct {
	Conn
	peer   Conn
	answer []byte
	taken  chan struct{} // closed when Receive returned the answer
	once   sync.Once
}

func (c *answeringConn) Send(bufs [][]byte, ep Endpoint) error {
	if err := c.Conn.Send(bufs, ep); err != nil {
		return err
	}
	if err := c.peer.Send([][]byte{c.answer}, Endpoint{Remote: c.LocalAddrs()[0]}); err != nil {
		return err
	}
	select {
	case <-c.taken:
		return nil
	case <-time.After(receiveTimeout):
		return errors.New("the answer was not received")
	}
}

func (c *answeringConn) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	n, err := c.Conn.Receive(bufs, sizes, eps)
	if n > 0 {
		c.once.Do(func() { close(c.taken) })
	}
	return n, err
}

// TestPcapRecorderAnswerFollowsItsCause: an answer received while the
// datagram it answers is still being sent is recorded after it. The
// recorder wrote a sent datagram after the inner Send returned, and under
// load a capture of an RC SEND began with its ACK (internal/decode's
// TestDecodePortFlag took the ACK for the SEND).
func TestPcapRecorderAnswerFollowsItsCause(t *testing.T) {
	src, dst := ap("10.0.0.1:4791"), ap("10.0.0.2:4791")
	mn := NewMemNetwork()
	a, err := mn.Listen(src)
	require.NoError(t, err)
	b, err := mn.Listen(dst)
	require.NoError(t, err)
	req, ans := rocePacket(1, 16), rocePacket(2, 0)
	wire.Flow{Src: src, Dst: dst}.Seal(req)
	wire.Flow{Src: dst, Dst: src}.Seal(ans)
	inner := &answeringConn{Conn: a, peer: b, answer: ans, taken: make(chan struct{})}
	var w bytes.Buffer
	r, err := NewPcapRecorder(inner, &w, PcapOptions{})
	require.NoError(t, err)
	defer r.Close()

	type got struct {
		data []byte
		err  error
	}
	received := make(chan got, 1)
	go func() { // the engine's receive loop
		rx := newRxSet(1, MaxDatagramSize)
		for {
			n, err := r.Receive(rx.bufs, rx.sizes, rx.eps)
			if n > 0 || err != nil {
				received <- got{append([]byte(nil), rx.bufs[0][:rx.sizes[0]]...), err}
				return
			}
		}
	}()
	require.NoError(t, r.Send([][]byte{req}, Endpoint{Remote: dst}))
	g := <-received
	require.NoError(t, g.err)
	require.Equal(t, ans, g.data)
	require.NoError(t, r.Err())

	frames := readPcap(t, w.Bytes())
	require.Len(t, frames, 2)
	require.Equal(t, req, []byte(frames[0].udp.Payload), "the datagram sent comes first")
	require.Equal(t, ans, []byte(frames[1].udp.Payload), "its answer second")
	require.Equal(t, src.Addr().AsSlice(), []byte(frames[0].ip4.SrcIP))
	require.Equal(t, dst.Addr().AsSlice(), []byte(frames[1].ip4.SrcIP))
	require.False(t, frames[1].ts.Before(frames[0].ts))
}

// TestPcapRecorderSolvesRxeIPv4ID: rdma_rxe sends IPv4 IDs a UDP receiver
// cannot see; the recorder solves them from the ICRC so the frame verifies.
func TestPcapRecorderSolvesRxeIPv4ID(t *testing.T) {
	src, dst := ap("10.77.0.12:52001"), ap("10.77.0.11:4791")
	mn := NewMemNetwork()
	a, _ := mn.Listen(src)
	b, _ := mn.Listen(dst)
	var w, w0 bytes.Buffer
	rb, err := NewPcapRecorder(b, &w, PcapOptions{})
	require.NoError(t, err)

	p := rocePacket(7, 100)
	var hdrs [28]byte
	wire.Flow{Src: src, Dst: dst}.PutHeaders(hdrs[:], len(p))
	wire.SetIPv4ID(hdrs[:20], 0x2f1c)
	binary.LittleEndian.PutUint32(p[len(p)-4:], wire.ICRC(hdrs[:20], hdrs[20:], p[:len(p)-4]))
	bad := append([]byte(nil), p...)
	bad[20] ^= 1 // corrupt: the ID cannot be solved, frame keeps ID 0

	require.NoError(t, a.Send([][]byte{p, bad}, Endpoint{Remote: dst}))
	receiveN(t, rb, 2, 4096)
	frames := readPcap(t, w.Bytes())
	require.Len(t, frames, 2)
	require.Equal(t, uint16(0x2f1c), frames[0].ip4.Id)
	require.Equal(t, wire.ICRCOK, icrcOK(frames[0]))
	require.Equal(t, uint16(0), wire.IPv4Checksum(frames[0].ip4.Contents))
	require.Equal(t, uint16(0), frames[1].ip4.Id)
	require.Equal(t, wire.ICRCBad, icrcOK(frames[1]))

	// KeepIPv4ID0 writes what the socket saw.
	r0, err := NewPcapRecorder(b, &w0, PcapOptions{KeepIPv4ID0: true})
	require.NoError(t, err)
	require.NoError(t, a.Send([][]byte{p}, Endpoint{Remote: dst}))
	receiveN(t, r0, 1, 4096)
	require.Equal(t, uint16(0), readPcap(t, w0.Bytes())[0].ip4.Id)
}

type failWriter struct{ after int }

func (f *failWriter) Write(b []byte) (int, error) {
	if f.after <= 0 {
		return 0, errors.New("disk full")
	}
	f.after--
	return len(b), nil
}

func TestPcapRecorderWriteErrors(t *testing.T) {
	mn := NewMemNetwork()
	a, _ := mn.Listen(ap("10.0.0.1:1"))
	b, _ := mn.Listen(ap("10.0.0.2:1"))
	_, err := NewPcapRecorder(a, &failWriter{}, PcapOptions{})
	require.Error(t, err)
	r, err := NewPcapRecorder(a, &failWriter{after: 1}, PcapOptions{})
	require.NoError(t, err)
	// Recording fails, the traffic does not.
	require.NoError(t, r.Send([][]byte{{1, 2, 3}, {4}}, Endpoint{Remote: ap("10.0.0.2:1")}))
	require.ErrorContains(t, r.Err(), "disk full")
	got := receiveN(t, b, 2, 16)
	require.Equal(t, []byte{4}, got[1].data)
	require.Equal(t, a.LocalAddrs(), r.LocalAddrs())
	require.Equal(t, a.BatchSize(), r.BatchSize())
	require.Equal(t, uint64(2), r.Stats().SentPackets)
	// A failed Send is not recorded and returns the inner error.
	require.ErrorIs(t, r.Send([][]byte{{1}}, Endpoint{Local: ap("10.9.9.9:0"), Remote: ap("10.0.0.2:1")}), ErrNoLocalAddr)
	require.NoError(t, r.Close())
}

func TestPcapRecorderZeroAllocs(t *testing.T) {
	mn := NewMemNetwork()
	mn.QueueLen = 16
	a, _ := mn.Listen(ap("10.0.0.1:1"))
	b, _ := mn.Listen(ap("10.0.0.2:1"))
	var w bytes.Buffer
	ra, _ := NewPcapRecorder(a, &w, PcapOptions{Clock: func() time.Time { return time.Unix(1, 0) }})
	rb, _ := NewPcapRecorder(b, &w, PcapOptions{Clock: func() time.Time { return time.Unix(1, 0) }})
	fl := wire.Flow{Src: ap("10.0.0.1:1"), Dst: ap("10.0.0.2:1")}
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = rocePacket(uint32(i), 512)
		fl.Seal(bufs[i])
	}
	r := newRxSet(8, 1024)
	g := guardReceives(t, rb)
	round := func() {
		w.Reset()
		if err := ra.Send(bufs, Endpoint{Remote: fl.Dst}); err != nil {
			t.Fatal(err)
		}
		// A non-default TOS and TTL are written into the frames in place.
		if err := ra.Send(bufs, Endpoint{Remote: fl.Dst, TrafficClass: 0x68, HopLimit: 7}); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 2*len(bufs); {
			n, err := rb.Receive(r.bufs, r.sizes, r.eps)
			g.noError(t, err, "zero-allocation round")
			got += n
			g.progress()
		}
	}
	round()
	round()
	require.Zero(t, testing.AllocsPerRun(50, round))
}

func TestSourceFor(t *testing.T) {
	locals := []netip.AddrPort{ap("10.0.0.1:7"), ap("[fd00::1]:8"), ap("0.0.0.0:9")}
	require.Equal(t, ap("10.0.0.1:7"), sourceFor(locals, Endpoint{Remote: ap("10.0.0.2:1")}))
	require.Equal(t, ap("[fd00::1]:8"), sourceFor(locals, Endpoint{Remote: ap("[fd00::2]:1")}))
	require.Equal(t, ap("10.0.0.1:7"), sourceFor(locals, Endpoint{Local: ap("[::ffff:10.0.0.1]:0"), Remote: ap("10.0.0.2:1")}))
	require.Equal(t, ap("10.0.0.5:9"), sourceFor(locals, Endpoint{Local: ap("10.0.0.5:0"), Remote: ap("10.0.0.2:1")}))
}

// TestPcapRecorderSendGather: a datagram sent in pieces is recorded whole,
// whether the inner Conn gathers (it gets the pieces) or not (it gets
// them joined, in buffers the recorder reuses: no allocation once warm);
// a send that fails records nothing. The recorder gathers because
// ib.OpenDevice puts the daemon's traffic accounting, which sends in
// pieces, outside it: without SendGather the accounting joined every
// datagram in a new buffer.
func TestPcapRecorderSendGather(t *testing.T) {
	src, dst := ap("10.0.0.1:49152"), ap("10.0.0.2:4791")
	fl := wire.Flow{Src: src, Dst: dst}
	var whole [][]byte
	var dgrams []Gather
	for i, n := range []int{0, 100, 4096} {
		p := rocePacket(uint32(i), n)
		fl.Seal(p)
		whole = append(whole, p)
		end := len(p) - wire.ICRCLen
		dgrams = append(dgrams, Gather{p[:wire.BTHLen], p[wire.BTHLen:end], p[end:]})
	}
	for _, gathers := range []bool{true, false} {
		t.Run(map[bool]string{true: "inner-gathers", false: "inner-sends-whole"}[gathers], func(t *testing.T) {
			mn := NewMemNetwork()
			mn.QueueLen = 4 // every slot holds a 4 KiB datagram after a few rounds
			c, err := mn.Listen(src)
			require.NoError(t, err)
			peer, err := mn.Listen(dst)
			require.NoError(t, err)
			var inner Conn = c
			spy := &gatherRecorder{Conn: c}
			if gathers {
				inner = spy
			}
			var w bytes.Buffer
			r, err := NewPcapRecorder(inner, &w, PcapOptions{})
			require.NoError(t, err)
			defer r.Close()
			defer peer.Close()
			var gs GatherSender = r
			require.NoError(t, gs.SendGather(dgrams, Endpoint{Remote: dst}))
			require.NoError(t, gs.SendGather(dgrams[1:2], Endpoint{Remote: dst}), "the join buffers again, shorter")
			order := []int{0, 1, 2, 1}
			frames := readPcap(t, w.Bytes())
			require.Len(t, frames, len(order))
			for i, f := range frames {
				require.Equal(t, whole[order[i]], []byte(f.udp.Payload), "frame %d", i)
				require.Equal(t, wire.ICRCOK, icrcOK(f), "frame %d", i)
			}
			if gathers {
				require.Equal(t, []bool{true, true, true, true}, spy.gathered)
				for i, d := range spy.sent {
					require.Equal(t, whole[order[i]], d)
				}
			} else {
				got := receiveN(t, peer, len(order), MaxDatagramSize)
				for i, p := range got {
					require.Equal(t, whole[order[i]], p.data)
				}
				rx := newRxSet(4, MaxDatagramSize)
				round := func() {
					w.Reset()
					if err := gs.SendGather(dgrams, Endpoint{Remote: dst}); err != nil {
						t.Fatal(err)
					}
					for got := 0; got < len(dgrams); {
						n, err := peer.Receive(rx.bufs, rx.sizes, rx.eps)
						if err != nil {
							t.Fatal(err)
						}
						got += n
					}
				}
				for range 4 {
					round()
				}
				require.Zero(t, testing.AllocsPerRun(20, round))

				// A send the inner Conn refuses is not recorded.
				w.Reset()
				require.ErrorIs(t, gs.SendGather(dgrams, Endpoint{Local: ap("10.9.9.9:0"), Remote: dst}), ErrNoLocalAddr)
				require.Zero(t, w.Len())
			}
		})
	}
}
