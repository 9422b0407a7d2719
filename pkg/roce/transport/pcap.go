package transport

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxed/rxed/pkg/wire"
)

// PcapOptions configures NewPcapRecorder.
type PcapOptions struct {
	// Clock stamps the frames; nil means time.Now.
	Clock func() time.Time
	// Logger hears about the first write error; nil is silent.
	Logger *slog.Logger
	// KeepIPv4ID0 disables solving the IPv4 Identification and DF flag
	// of received packets from their ICRC (see NewPcapRecorder) and
	// writes ID 0 and DF, the header of the recorder's own sends, instead.
	KeepIPv4ID0 bool
}

// PcapRecorder is a Conn that passes everything to an inner Conn and writes
// each datagram sent and received to a classic pcap stream (LinkTypeEthernet).
type PcapRecorder struct {
	inner Conn
	clock func() time.Time
	log   *slog.Logger
	keep0 bool

	// mu guards w, scratch, err and flat, and is held across the
	// inner Send or SendGather (see Send): a frame is written only under
	// it.
	mu      sync.Mutex
	w       *pcapgo.Writer
	scratch []byte
	err     error
	flat    flattener // SendGather's datagrams joined for an inner Conn without it
	// reporting is set when the recorder asked inner to report received
	// TOS and TTL (NewPcapRecorder), so that Close undoes it.
	reporting bool
}

// NewPcapRecorder writes the pcap file header to w and returns a recorder
// around inner.
//
// Frames are Ethernet/IPv4-or-IPv6/UDP. MAC addresses are made up
// (02:00:<last four bytes of the IP address>). For sent datagrams the IP
// header is exactly the one Linux puts on packets from OpenUDP's sockets
// (IPv4: the Endpoint's TOS and TTL, by default 0 and 64, ID 0, DF, header
// checksum; IPv6: the Endpoint's traffic class and hop limit; flow label 0,
// which Linux may set differently but the ICRC masks), so the ICRC in each
// recorded frame verifies. The UDP checksum is 0,
// as rdma_rxe sends it (OpenUDP's sockets send a real one; the ICRC masks it).
//
// A received datagram's IP header is not visible through a UDP socket, so it
// is reconstructed the same way, with the TOS and TTL (traffic class and
// hop limit) the socket reports: the recorder asks inner to report them
// for the whole capture (TrafficReporter). The unknowns that matter are the IPv4
// Identification rdma_rxe sets and the DF flag (set by Linux and rxe, clear
// from some other senders): both are solved from the packet's ICRC
// (wire.Flow.VerifyIPv4) so that the frame's ICRC verifies; when they
// cannot be solved (not RoCE, corrupt) or KeepIPv4ID0 is set, the frame
// has ID 0 and DF.
//
// The UDP ports are the engine's own (4791 unless it was opened on another
// one). The capture stays classic pcap, which has no place for a note, so
// the port is not written separately: rxed decode recognises RoCEv2 on a
// port other than 4791 from the frames themselves (the first frame to a
// port whose BTH parses and whose ICRC verifies, which every frame written
// here does, makes the port RoCEv2 for the rest of the file), and
// `rxed decode --port N` names it outright. tshark needs
// `-d udp.port==N,infiniband` for the same.
//
// Write errors do not fail Send or Receive; recording stops at the first one,
// which Err reports.
func NewPcapRecorder(inner Conn, w io.Writer, opts PcapOptions) (*PcapRecorder, error) {
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(uint32(ethHeaderLen+ipv6HeaderLen+udpHeaderLen+MaxDatagramSize), layers.LinkTypeEthernet); err != nil {
		return nil, fmt.Errorf("transport: pcap header: %w", err)
	}
	r := &PcapRecorder{
		inner:   inner,
		clock:   opts.Clock,
		log:     opts.Logger,
		keep0:   opts.KeepIPv4ID0,
		w:       pw,
		scratch: make([]byte, ethHeaderLen+ipv6HeaderLen+udpHeaderLen+MaxDatagramSize),
	}
	if r.clock == nil {
		r.clock = time.Now
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	// A received frame's TOS and TTL are what the socket reports, and a
	// socket reports them only while someone asks (ReportTraffic: the
	// engine does while it has a UD QP). The recorder asks for the whole
	// capture, so that a received RC frame shows the TOS and TTL it came
	// with, not TOS 0 and TTL 64 whatever the peer sent (an interop TOS
	// cell saw the kernel's 0x68 written as 0x00); the cost, a control
	// message or two per datagram, is paid only while capturing.
	if tr, ok := inner.(TrafficReporter); ok {
		if err := tr.ReportTraffic(true); err != nil {
			r.log.Warn("pcap: received TOS/TTL not reported: frames show TOS 0, TTL 64", "err", err)
		} else {
			r.reporting = true
		}
	}
	return r, nil
}

// Err returns the first error writing the pcap stream, if any.
func (r *PcapRecorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *PcapRecorder) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	n, err := r.inner.Receive(bufs, sizes, eps)
	r.recordReceived(bufs, sizes, eps, n)
	return n, err
}

// recordReceived writes the n datagrams a Receive returned.
func (r *PcapRecorder) recordReceived(bufs [][]byte, sizes []int, eps []Endpoint, n int) {
	if n <= 0 {
		return
	}
	r.mu.Lock()
	for i := range n {
		r.record(&Gather{bufs[i][:sizes[i]]}, eps[i].Remote, eps[i].Local, &eps[i], true)
	}
	r.mu.Unlock()
}

// Send sends through the inner Conn and records the datagrams it sent:
// all when it succeeded, the ones its *SendError does not name when it
// refused some (the kernel refuses a datagram over the path MTU and
// sends the rest), none when it failed otherwise. mu is held across the inner Send so that a capture keeps
// cause before effect: loopback and the in-memory network deliver a
// datagram inside its Send, and a quick peer's answer can come back (and
// Receive return it) before Send does; recorded after Send, the answer
// stood in front of the datagram it answers (an ACK before its SEND,
// under load; internal/decode's TestDecodePortFlag). No inner Conn's Send
// waits for this recorder's Receive: a socket's send buffer is freed at
// transmission (on loopback as the datagram is delivered), and the
// in-memory queues drop rather than block.
func (r *PcapRecorder) Send(bufs [][]byte, ep Endpoint) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.inner.Send(bufs, ep)
	refused, known := RefusedIndex(err)
	if !known {
		return err
	}
	src := sourceFor(r.inner.LocalAddrs(), ep)
	for i, b := range bufs {
		if len(refused) > 0 && refused[0] == i {
			refused = refused[1:]
			continue
		}
		r.record(&Gather{b}, src, ep.Remote, &ep, false)
	}
	return err
}

// SendGather implements GatherSender, so that a wrapper around the
// recorder that sends in pieces (the daemon's traffic accounting, put
// outside it by ib.OpenDevice) need not join them itself: the inner
// Conn's SendGather when it has one, otherwise its Send with the pieces
// joined into the recorder's own buffers (reused: mu is held across the
// Send, which reads them during the call only). Like Send it records
// the datagrams the inner send sent.
func (r *PcapRecorder) SendGather(dgrams []Gather, ep Endpoint) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if gs, ok := r.inner.(GatherSender); ok {
		err = gs.SendGather(dgrams, ep)
	} else {
		err = r.inner.Send(r.flat.flatten(dgrams), ep)
	}
	refused, known := RefusedIndex(err)
	if !known {
		return err
	}
	src := sourceFor(r.inner.LocalAddrs(), ep)
	for i := range dgrams {
		if len(refused) > 0 && refused[0] == i {
			refused = refused[1:]
			continue
		}
		r.record(&dgrams[i], src, ep.Remote, &ep, false)
	}
	return err
}

// sourceFor finds the address and port a Send with ep goes out from, the
// way the Conns of this package choose their socket.
func sourceFor(locals []netip.AddrPort, ep Endpoint) netip.AddrPort {
	la := ep.Local.Addr().Unmap()
	want6 := ep.Remote.Addr().Unmap().Is6()
	for _, l := range locals {
		if l.Addr().Is6() != want6 {
			continue
		}
		if !la.IsValid() || l.Addr().IsUnspecified() {
			if la.IsValid() {
				return netip.AddrPortFrom(la, l.Port())
			}
			return l
		}
		if l.Addr() == la && (ep.Local.Port() == 0 || ep.Local.Port() == l.Port()) {
			return l
		}
	}
	return netip.AddrPortFrom(la, ep.Local.Port())
}

// record writes one frame, the datagram g's pieces joined, with the TOS
// and TTL (traffic class and hop limit) of ep: those a send set, or
// those a receive reported (else the defaults), and a received IPv6
// datagram's reported flow label (a sent one's is 0, as the socket sends
// it); the caller holds r.mu.
// A received datagram is whole in g[0].
func (r *PcapRecorder) record(g *Gather, src, dst netip.AddrPort, ep *Endpoint, received bool) {
	if r.err != nil {
		return
	}
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	n := g.Len()
	if !s.IsValid() || !d.IsValid() || s.Is4() != d.Is4() || n > MaxDatagramSize {
		return // nothing sensible to write (a Conn never reports this)
	}
	f := r.scratch
	putMAC(f[0:6], d)
	putMAC(f[6:12], s)
	off := ethHeaderLen
	et := layers.EthernetTypeIPv6
	if s.Is4() {
		et = layers.EthernetTypeIPv4
	}
	binary.BigEndian.PutUint16(f[12:], uint16(et))
	fl := wire.Flow{Src: netip.AddrPortFrom(s, src.Port()), Dst: netip.AddrPortFrom(d, dst.Port())}
	ipLen := fl.PutHeaders(f[off:], n)
	if ep.TrafficClass != 0 || ep.HopLimit != 0 {
		var flow uint32
		if received {
			flow = ep.FlowLabel
		}
		wire.SetIPTraffic(f[off:], ep.TrafficClass, ep.HopLimit, flow)
	}
	if s.Is4() && received && !r.keep0 {
		if v, id, dfClear := fl.VerifyIPv4(g[0]); v == wire.ICRCOK && (id != 0 || dfClear) {
			wire.SetIPv4Unseen(f[off:], id, dfClear)
		}
	}
	off += ipLen + udpHeaderLen
	for _, p := range g {
		off += copy(f[off:], p)
	}
	ci := gopacket.CaptureInfo{Timestamp: r.clock(), CaptureLength: off, Length: off}
	if err := r.w.WritePacket(ci, f[:off]); err != nil {
		r.err = err
		r.log.Warn("transport: pcap recording stopped", "err", err)
	}
}

func putMAC(b []byte, a netip.Addr) {
	b[0], b[1] = 0x02, 0x00
	if a.Is4() {
		v := a.As4()
		copy(b[2:6], v[:])
		return
	}
	v := a.As16()
	copy(b[2:6], v[12:16])
}

func (r *PcapRecorder) BatchSize() int               { return r.inner.BatchSize() }
func (r *PcapRecorder) LocalAddrs() []netip.AddrPort { return r.inner.LocalAddrs() }

// Close closes the inner Conn, first withdrawing the recorder's request
// for received TOS and TTL. The writer is not closed: it belongs to the
// caller, who may also want to flush it.
func (r *PcapRecorder) Close() error {
	if r.reporting {
		r.reporting = false
		_ = r.inner.(TrafficReporter).ReportTraffic(false)
	}
	return r.inner.Close()
}

// Stats forwards the inner Conn's counters when it has them.
func (r *PcapRecorder) Stats() Stats {
	if s, ok := r.inner.(StatsReporter); ok {
		return s.Stats()
	}
	return Stats{}
}
