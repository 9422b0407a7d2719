package hostile

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
)

// seedCaptures are the captures FuzzEngineReceive's corpus starts from:
// every transport, READ, atomics, IPv6, the CM and multicast.
var seedCaptures = []string{
	"perftest_write_bw_rc_4096.pcap",
	"perftest_write_bw_rc_4096_ipv6.pcap",
	"perftest_read_bw_rc_64.pcap",
	"perftest_atomic_bw_cmp_and_swap.pcap",
	"rc_imm_write_send_with_imm.pcap",
	"rc_pingpong_send_4096_ipv6.pcap",
	"uc_pingpong_send_4096.pcap",
	"ud_pingpong_send_512.pcap",
	"rdmacm_ucmatose.pcap",
	"rdmacm_udaddy.pcap",
	"rdmacm_mckey.pcap",
}

// seedInputs are single packets of the captures (the first of each
// opcode in each), each aimed as its transport says, and a few sequences:
// a whole multi-packet WRITE at the ePSN, a READ from a stranger, a REQ
// and its duplicate.
func seedInputs(tb testing.TB) [][]byte {
	var seeds [][]byte
	for _, name := range seedCaptures {
		seen := map[wire.Opcode]bool{}
		for _, c := range capturePackets(tb, name) {
			op := wire.BTH(c.payload[:wire.BTHLen]).Opcode()
			if seen[op] || len(seen) >= 6 {
				continue
			}
			seen[op] = true
			seeds = append(seeds, encodeInput(c.v6, aimed(c.payload, srcPeer)))
		}
	}
	// A WRITE of several packets, in sequence.
	var write []hostilePkt
	for _, c := range capturePackets(tb, "perftest_write_bw_rc_4096.pcap") {
		op := wire.BTH(c.payload[:wire.BTHLen]).Opcode()
		if op == wire.RCWriteFirst || len(write) > 0 && (op == wire.RCWriteMiddle || op == wire.RCWriteLast) {
			write = append(write, aimed(c.payload, srcPeer))
			if op == wire.RCWriteLast {
				break
			}
		}
	}
	seeds = append(seeds, encodeInput(false, write...))
	for _, c := range capturePackets(tb, "perftest_read_bw_rc_64.pcap") {
		if wire.BTH(c.payload[:wire.BTHLen]).Opcode() == wire.RCReadRequest {
			seeds = append(seeds, encodeInput(false, aimed(c.payload, srcStranger)),
				encodeInput(false, aimed(c.payload, srcPeerPort), withPSN(aimed(c.payload, srcPeer), psnDup)))
			break
		}
	}
	req := captureREQ(tb)
	req = req[:len(req)-wire.ICRCLen]
	seeds = append(seeds, encodeInput(false, aimed(req, srcStranger), aimed(req, srcStranger)))
	return seeds
}

// aimed is a record sending payload from src to the target's QP of the
// packet's transport (QP 1 for a MAD, the group for QP 0xFFFFFF), at the
// PSN that QP expects, its RETH or AtomicETH pointing into w.
func aimed(payload []byte, src int) hostilePkt {
	b := wire.BTH(payload[:wire.BTHLen])
	info := b.Opcode().Info()
	p := hostilePkt{src: src, body: payload, dist: 1, rkey: 1, va: 1, qkey: true, psn: psnExpect}
	switch {
	case b.DestQP() == 1:
		p.qsel = qselQP1
	case b.DestQP() == 0xFFFFFF:
		p.qsel = qselMcast
	case info.Transport == wire.TransportUD:
		p.qsel = qselUD
	case info.Transport == wire.TransportUC:
		p.qsel = qselUC
	default:
		p.qsel = qselRC
	}
	if info.Flags.Has(wire.FlagResponse) {
		p.psn = psnSentDup
	}
	return p
}

func withPSN(p hostilePkt, mode int) hostilePkt { p.psn = mode; return p }
