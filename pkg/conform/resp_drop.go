package conform

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/rxed/rxed/pkg/wire"
)

// Responder scenarios: packets the receiver must drop silently (IBA
// 9.6.1 header validation: "silently dropped"), after which the peer keeps
// serving the connection.

func init() {
	drop := func(id, title, rule string, tools []Tool, mangle func(c *Conn) ([]byte, string)) {
		add(&Scenario{ID: id, Title: title, Role: PeerResponder, Rule: rule,
			Expect: "no response at all; a valid request right after is answered", Tools: tools,
			Run: func(ctx context.Context, c *Conn) Outcome {
				b, note := mangle(c)
				if b == nil {
					return Errorf("could not build the packet")
				}
				return dropped(ctx, c, b, note)
			}})
	}
	probe := func(c *Conn) []byte {
		h, p := c.ProbeHeaders()
		b, _ := c.Build(h, p)
		return b
	}
	drop("D-ICRC", "bad ICRC", "IBA 9.6.1.1 (ICRC check), C9-4", anyTools, func(c *Conn) ([]byte, string) {
		b := probe(c)
		b[len(b)-1] ^= 0x55
		return b, "valid request with a corrupted ICRC"
	})
	drop("D-PKEY", "wrong P_Key", "IBA 9.6.1.1.3 (P_Key check)", anyTools, func(c *Conn) ([]byte, string) {
		h, p := c.ProbeHeaders()
		h.PKey = 0x1234
		b, _ := c.Build(h, p)
		return b, "P_Key 0x1234 (the QP's is 0xffff)"
	})
	drop("D-DESTQP", "unknown destination QP", "IBA 9.6.1.2 (destination QP)", anyTools, func(c *Conn) ([]byte, string) {
		h, p := c.ProbeHeaders()
		h.DestQP = c.PeerQPN ^ 0x7c0000
		b, _ := c.Build(h, p)
		return b, "request to a QPN the peer does not have"
	})
	drop("D-TVER", "BTH transport version not 0", "IBA 9.6.1.1 (TVer)", anyTools, func(c *Conn) ([]byte, string) {
		b := probe(c)
		wire.BTH(b).SetTVer(1)
		c.Reseal(b)
		return b, "TVer 1"
	})
	drop("D-OPCODE-RESERVED", "reserved RC opcode", "IBA 9.6.1.1 / 9.2 (reserved opcodes)", rcTools, func(c *Conn) ([]byte, string) {
		b := probe(c)
		wire.BTH(b).SetOpcode(0x18) // reserved in the RC range
		c.Reseal(b)
		return b, "opcode 0x18 (reserved)"
	})
	drop("D-OPCODE-UC", "UC opcode to an RC QP", "IBA 9.6.1.2 (transport must match the QP)", rcTools, func(c *Conn) ([]byte, string) {
		// With AckReq: a peer that took the UC SEND as an RC SEND ONLY
		// (ib_send_bw has a receive for it) then ACKs it, where without
		// it that peer would stay silent and ACK the probe after it, a
		// duplicate of its PSN then, as it ACKs a valid one.
		h := c.Hdr(wire.UCSendOnly)
		h.AckReq = true
		b, _ := c.Build(h, pattern(8, 1))
		return b, "UC SEND ONLY (AckReq) to the RC QP"
	})
	drop("D-PAD", "pad count larger than the payload", "IBA 9.6.1.1 (packet length)", writeOrSend, func(c *Conn) ([]byte, string) {
		h := c.Hdr(wire.RCSendOnly)
		if c.Tool == IBWriteBW {
			h = c.Hdr(wire.RCWriteOnly)
			h.VA, h.RKey = c.VA, c.RKey
		}
		h.AckReq = true
		b, _ := c.Build(h, nil)
		wire.BTH(b).SetPadCount(3)
		c.Reseal(b)
		return b, "zero-byte message with PadCnt 3"
	})
	drop("D-TRUNCATED", "packet shorter than its headers", "IBA 9.6.1.1 (length)", writeTools, func(c *Conn) ([]byte, string) {
		h, p := c.ProbeHeaders()
		b, _ := c.Build(h, p)
		b = append(b[:wire.BTHLen+8], 0, 0, 0, 0) // half a RETH and an ICRC slot
		c.Reseal(b)
		return b, "WRITE ONLY cut inside its RETH"
	})
	drop("D-UD-QKEY", "UD SEND with the wrong Q_Key", "IBA 10.2.4 / 9.6.1.2 (Q_Key check)", udTools, func(c *Conn) ([]byte, string) {
		h := c.Hdr(wire.UDSendOnly)
		h.QKey, h.SrcQP = UDQKey^0x1000, c.OurQPN
		b, _ := c.Build(h, pattern(8, 1))
		return b, "UD SEND Q_Key 0x11110111"
	})
	drop("D-UD-OVER-MTU", "UD SEND longer than the PMTU", "IBA 9.6.1.2 (UD payload <= PMTU)", udTools, func(c *Conn) ([]byte, string) {
		h := c.Hdr(wire.UDSendOnly)
		h.QKey, h.SrcQP = UDQKey, c.OurQPN
		// A UD QP's PMTU is its port's active MTU (rxe's get_mtu: the
		// path MTU attribute is for RC/UC), which the peer derives from
		// its link as we do here. 256 bytes over it: over the peer's
		// PMTU, yet within the link's (a 1500-byte Ethernet under a
		// 1024-byte PMTU; the engine's socket does not fragment, so a
		// larger one would never leave).
		mtu := udPortMTU(c.Cfg.Local, c.MTU)
		n := mtu + 256
		b, _ := c.Build(h, pattern(n, 1))
		return b, fmt.Sprintf("UD SEND of %d bytes (port MTU %d)", n, mtu)
	})
	drop("D-UD-RC-OPCODE", "RC opcode to a UD QP", "IBA 9.6.1.2 (transport must match the QP)", udTools, func(c *Conn) ([]byte, string) {
		h := c.Hdr(wire.RCSendOnly)
		b, _ := c.Build(h, pattern(8, 1))
		return b, "RC SEND ONLY to the UD QP"
	})
	add(&Scenario{ID: "R-UD-SEND", Title: "UD SEND delivered and answered", Role: PeerResponder,
		Rule: "IBA 9.8 (UD), 10.2.4", Expect: "the pingpong server receives it and answers with its own UD SEND carrying its QPN and the tool's Q_Key",
		Tools: udTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			if _, err := c.UDSend(pattern(64, 1), UDQKey, "UD SEND 64 bytes"); err != nil {
				return Errorf("%v", err)
			}
			r, ok := c.PeerRequest(ctx, answerWait)
			switch {
			case !ok:
				return Failf("no UD answer from the server")
			case r.Pkt.Opcode != wire.UDSendOnly && r.Pkt.Opcode != wire.UDSendOnlyImm:
				return Failf("answer is %s, want UD SEND ONLY", r)
			case r.Pkt.DETH.SrcQP() != c.PeerQPN:
				return Failf("answer's DETH source QP %#x, want the server's %#x", r.Pkt.DETH.SrcQP(), c.PeerQPN)
			case r.Pkt.DETH.QKey() != UDQKey:
				return Failf("answer's Q_Key %#x, want %#x", r.Pkt.DETH.QKey(), UDQKey)
			}
			return Passf("%s", r)
		}})
	add(&Scenario{ID: "P-FLUSH", Title: "FLUSH support probed", Role: PeerResponder,
		Rule: "IBA 1.5 9.4.7 (FLUSH, optional)", Expect: "ACK (supported) or NAK invalid request / silence (not supported): reported",
		Tools: writeTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			h := c.Hdr(wire.RCFlush)
			h.VA, h.RKey, h.DMALen, h.AckReq, h.FlushPlacement, h.FlushSelectivity = c.VA, c.RKey, 64, true, 1, 0
			_ = c.Send(h, nil, "FLUSH 64 bytes, global visibility")
			r, ok := c.Response(ctx, answerWait)
			switch {
			case !ok:
				return Passf("FLUSH not supported: silently dropped")
			case r.Syn().Kind() == wire.SynACK && r.PSN() == h.PSN && msnWrong(r, 1) != "":
				return Failf("FLUSH acknowledged, but %s: an executed FLUSH is a message", msnWrong(r, 1))
			case r.Syn().Kind() == wire.SynACK && r.PSN() == h.PSN:
				return Passf("FLUSH supported: %s", r)
			case r.Syn().Kind() == wire.SynNAK:
				return Passf("FLUSH recognised but not executed: %s", r)
			}
			return Failf("FLUSH answered with %s", r)
		}})
	add(&Scenario{ID: "P-ATOMIC-WRITE", Title: "ATOMIC_WRITE support probed", Role: PeerResponder,
		Rule: "IBA 1.5 9.4.8 (ATOMIC WRITE, optional)", Expect: "ACK (supported) or NAK / silence (not supported): reported",
		Tools: writeTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			h := c.Hdr(wire.RCAtomicWrite)
			h.VA, h.RKey, h.DMALen, h.AckReq = c.VA+64, c.RKey, 8, true
			_ = c.Send(h, pattern(8, 0x30), "ATOMIC_WRITE 8 bytes")
			r, ok := c.Response(ctx, answerWait)
			switch {
			case !ok:
				return Passf("ATOMIC_WRITE not supported: silently dropped")
			case r.Syn().Kind() == wire.SynACK && r.PSN() == h.PSN && msnWrong(r, 1) != "":
				return Failf("ATOMIC_WRITE acknowledged, but %s: an executed ATOMIC_WRITE is a message", msnWrong(r, 1))
			case r.Syn().Kind() == wire.SynACK && r.PSN() == h.PSN:
				return Passf("ATOMIC_WRITE supported: %s", r)
			case r.Syn().Kind() == wire.SynNAK:
				return Passf("ATOMIC_WRITE recognised but not executed: %s", r)
			}
			return Failf("ATOMIC_WRITE answered with %s", r)
		}})
}

var writeOrSend = []Tool{IBWriteBW, IBSendBW, IBVRCPingpong}

// udPortMTU is the active IB MTU of the link that carries local's
// traffic, as a RoCE device computes it from its netdev's MTU (the largest
// of 256 ... 4096 that fits with the IP, UDP, BTH, DETH and ICRC
// headers); fallback when the interface is not found.
func udPortMTU(local netip.Addr, fallback int) int {
	ifs, err := net.Interfaces()
	if err != nil {
		return fallback
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr().Unmap() == local.Unmap() ||
				local.IsLoopback() && ifc.Flags&net.FlagLoopback != 0 {
				return activeMTU(ifc.MTU, local.Is6())
			}
		}
	}
	return fallback
}

// activeMTU is the largest IB MTU whose UD packet fits a link MTU.
func activeMTU(linkMTU int, ipv6 bool) int {
	over := 20 + 8 + wire.BTHLen + wire.DETHLen + wire.ICRCLen
	if ipv6 {
		over += 20
	}
	for m := 4096; m > 256; m /= 2 {
		if m+over <= linkMTU {
			return m
		}
	}
	return 256
}
