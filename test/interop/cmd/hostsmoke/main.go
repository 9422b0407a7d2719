//go:build linux

// Command hostsmoke checks the interop namespace plumbing before any rxed cell runs: it plays
// the server half of ibv_rc_pingpong's TCP exchange on the host side of the bridge (pretending
// to own QPN 0x000123), then waits for the guest kernel's RC SEND packets to that QP on UDP
// 4791 of the same address. Nobody ACKs, so the guest's ibv_rc_pingpong eventually fails with a
// retry error; that is expected. Exit status 0 means at least one well-formed packet arrived.
//
//	ip netns exec rxedlab hostsmoke -addr 10.78.0.1 -port 18515
//	(guest) ibv_rc_pingpong -d rxe0 -g 1 -s 64 -n 1 -p 18515 10.78.0.1
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/rxed/rxed/test/interop"
)

const (
	fakeQPN = 0x000123
	fakePSN = 0xabcdef
)

func main() {
	addr := flag.String("addr", "10.78.0.1", "host address on the bridge (IPv4)")
	port := flag.Int("port", 18515, "TCP port of the pingpong exchange")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	flag.Parse()
	if err := run(*addr, *port, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "hostsmoke: FAIL:", err)
		os.Exit(1)
	}
}

func run(addr string, port int, timeout time.Duration) error {
	ip, err := netip.ParseAddr(addr)
	if err != nil || !ip.Is4() {
		return fmt.Errorf("-addr %q: want an IPv4 address", addr)
	}
	deadline := time.Now().Add(timeout)
	// UDP first, so nothing the guest sends right after the exchange is missed.
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip.AsSlice(), Port: 4791})
	if err != nil {
		return err
	}
	defer udp.Close()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: ip.AsSlice(), Port: port})
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Printf("hostsmoke: listening on %s:%d (TCP) and %s:4791 (UDP)\n", addr, port, addr)
	_ = ln.SetDeadline(deadline)
	c, err := ln.AcceptTCP()
	if err != nil {
		return fmt.Errorf("no pingpong client: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	buf := make([]byte, interop.PingpongDestLen)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("reading client dest: %w", err)
	}
	peer, err := interop.ParsePingpongDest(buf)
	if err != nil {
		return err
	}
	fmt.Printf("hostsmoke: client qpn=0x%06x psn=0x%06x gid=%s\n", peer.QPN, peer.PSN, peer.GID)
	mine := interop.PingpongDest{QPN: fakeQPN, PSN: fakePSN, GID: netip.AddrFrom16(ip.As16())}
	if _, err := c.Write(mine.Marshal()); err != nil {
		return err
	}
	done := make([]byte, 5)
	if _, err := io.ReadFull(c, done); err != nil {
		return fmt.Errorf("client did not finish the exchange: %w", err)
	}

	_ = udp.SetReadDeadline(deadline)
	pkt := make([]byte, 9000)
	for got := 0; got < 3; {
		n, src, err := udp.ReadFromUDPAddrPort(pkt)
		if err != nil {
			if got > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			return fmt.Errorf("no RoCEv2 packet from the guest: %w", err)
		}
		b, err := interop.ParseBTH(pkt[:n])
		if err != nil {
			return err
		}
		fmt.Printf("hostsmoke: %d bytes from %s opcode=0x%02x dqpn=0x%06x psn=0x%06x ackreq=%v\n",
			n, src, b.Opcode, b.DestQPN, b.PSN, b.AckReq)
		if src.Addr().Unmap() != peer.GID.Unmap() {
			return fmt.Errorf("packet from %s, but the client's GID is %s", src.Addr(), peer.GID)
		}
		if b.DestQPN != fakeQPN || b.PSN != peer.PSN || (b.Opcode != 0x04 && b.Opcode != 0x00) {
			return fmt.Errorf("want an RC SEND to qpn 0x%06x with psn 0x%06x", fakeQPN, peer.PSN)
		}
		got++
		// later packets are retransmissions: stop waiting for them soon
		_ = udp.SetReadDeadline(time.Now().Add(3 * time.Second))
	}
	fmt.Println("hostsmoke: OK: the guest kernel's RC SEND reached the host side of the bridge")
	return nil
}
